"""Fixtures for every test folder: offline hub settings, the shipped tiny model, the bench's shared store."""

from __future__ import annotations

import os
import tempfile

# no hub in tests: say so before `datasets` / `huggingface_hub` are imported, and keep their caches out of ~
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="gac-test-hf-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from tests.bench_store import tiny_store  # noqa: E402, F401 - the bench's shared store, built once per session
from tests.transformers_state import after_test, install  # noqa: E402

install()  # keeps transformers' own init_weights from its import on: the guard below can put it back


@pytest.fixture(scope="session")
def tiny():
    """The shipped, trained tiny model (float32, CPU) and its tokenizer (never built by a test)."""
    from gac.fixtures import tiny_dir
    from gac.models import load_model

    tiny_dir(build_if_missing=False)

    return load_model("tiny")


@pytest.fixture(scope="session")
def tiny_untrained():
    from gac.fixtures import tiny_dir
    from gac.models import load_model

    tiny_dir(build_if_missing=False)

    return load_model("tiny-untrained")


@pytest.fixture(scope="session")
def tiny_files():
    from gac.fixtures import tiny_paths

    return tiny_paths(build_if_missing=False)


@pytest.fixture(autouse=True)
def _transformers_initialises_weights(request):
    """The first test after which transformers' process-wide patches are still on (``no_init_weights``'s no-op
    init functions: a thread still inside it, two builds interleaved; torch's default dtype not put back) errors
    here, named, and the patches are switched back: the tests after it build their models as usual."""
    yield
    why = after_test(request.node.nodeid)
    if why:
        pytest.fail(why, pytrace=False)


@pytest.fixture(scope="module")
def cluster():
    """A loopback Slurm cluster for the module's tests (the ``slurm`` tier), started and stopped by the fixture."""
    import shutil
    from pathlib import Path

    from gac.launch import local_cluster

    missing = local_cluster.missing_binaries()
    assert not missing, f"Slurm is not installed ({missing}); run: python -m gac.launch.local_cluster install"
    d = Path(tempfile.mkdtemp(prefix="gac-slurm-"))  # under /tmp: the munge and mysql users must reach it
    d.chmod(0o755)
    c = local_cluster.start(d / "cluster")
    try:
        yield c
    finally:
        local_cluster.stop(c.dir)
        shutil.rmtree(d, ignore_errors=True)
