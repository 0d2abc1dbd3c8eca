"""No code from a model directory ever runs: a directory whose configs name shipped Python (``auto_map``) is
refused in one line before anything loads, and every loader passes ``trust_remote_code=False``."""

import ast
from pathlib import Path

import pytest

from gac.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def remote_code_dir(tmp_path):
    from tests.bad_store_fixtures import _hf_dirs

    _hf_dirs(tmp_path)
    return tmp_path / "hf_remote_code", tmp_path / "ran_remote_code"


@pytest.mark.parametrize("argv", [["evaluate", "{d}", "--ppl"], ["audit", "{d}"],
                                  ["compress", "{d}", "--compressor", "llm_pruner", "--ratio", "0.2", "--calib", "tiny", "-o", "{out}"]])
def test_a_model_directory_that_names_its_own_code_is_refused_and_nothing_runs(remote_code_dir, tmp_path, argv,
                                                                                capsys):
    d, marker = remote_code_dir
    code = main([a.format(d=d, out=tmp_path / "out") for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "never runs code from a model directory" in err[0] and "evil" in err[0]
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_every_from_pretrained_in_gac_refuses_remote_code():
    """Each ``from_pretrained`` call in gac/ passes ``**NO_REMOTE_CODE`` (or ``trust_remote_code=False``), except
    the loaders of the directories gac builds itself (the fixtures and training of tiny and smollm2)."""
    own = {"gac/fixtures/smollm2.py", "gac/fixtures/tiny.py", "gac/training/tiny.py"}
    bad = []
    for path in sorted((ROOT / "gac").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in own:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                kws = {k.arg for k in node.keywords}
                starred = [ast.unparse(k.value) for k in node.keywords if k.arg is None]
                if "trust_remote_code" not in kws and "NO_REMOTE_CODE" not in starred:
                    bad.append(f"{rel}:{node.lineno}")
    assert not bad, f"from_pretrained without trust_remote_code=False: {bad}"


def test_weights_that_are_a_pickle_are_never_unpickled(tmp_path, capsys):
    """A model directory whose only weights are a pickle that would run a command: refused by the CLI and by the
    library loader alike, and the command never runs."""
    import os
    import shutil

    import torch

    from gac.errors import GacError
    from gac.fixtures.tiny import tiny_dir
    from gac.models import load_model

    d, marker = tmp_path / "pickled", tmp_path / "ran"
    d.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir() / f, d / f)

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model.embed_tokens.weight": Evil()}, d / "pytorch_model.bin")
    assert main(["evaluate", str(d), "--ppl"]) == 2
    assert "gac reads safetensors only" in capsys.readouterr().err
    with pytest.raises(GacError, match="gac reads safetensors only"):
        load_model(str(d))
    assert not marker.exists()
