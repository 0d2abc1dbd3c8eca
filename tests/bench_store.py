"""A small results store on `tiny` shared by the bench tests: the baseline and every compressor x {unaligned, gac}
at ratio 0.15, evaluation off, seq_len 64, each compressed job also saved as a checkpoint (the structure it built).

``tiny_store`` is session-wide, built once per run: tests/conftest.py imports it for every folder (the bench's tests
in tests/evaluation, the structures in tests/compression/test_structure.py); tests/evaluation/conftest.py imports
``store_copy``."""

import shutil

import pytest
from omegaconf import OmegaConf

from gac.jobs.config.command_line import compose_config
from gac.jobs.run.recipe import run_config

QUICK = ["model=tiny", "gpu=cpu", "eval=none", "calibration.n_samples=4", "calibration.seq_len=128", "seq_len=64",
         "experiment_name=benchtest"]
COMPRESSORS = ("asvd", "svd_llm", "llm_pruner", "palu")
STRATEGIES = ("unaligned", "gac")
FAST = dict(rounds=3, warmup=0, iters=2)  # a bench protocol that takes a second or two on tiny at S=64


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory):
    """``{"root", "results", "records": {(compressor, strategy): record}, "checkpoints": {(c, s): dir}}``."""
    root = tmp_path_factory.mktemp("benchstore")
    results = root / "results"
    records, ckpts = {}, {}
    for comp in ("none", *COMPRESSORS):
        for strat in STRATEGIES if comp != "none" else ("gac",):
            cfg = OmegaConf.to_container(compose_config([*QUICK, f"results_dir={results}", f"compressor={comp}",
                                                         f"align={strat}"]), resolve=True)
            if comp != "none":
                ckpts[(comp, strat)] = root / "ckpt" / f"{comp}-{strat}"
                cfg["save_model"] = str(ckpts[(comp, strat)])
            records[(comp, strat if comp != "none" else "baseline")] = run_config(cfg)
    return {"root": root, "results": results, "records": records, "checkpoints": ckpts}


@pytest.fixture
def store_copy(tiny_store, tmp_path):
    """A private copy of the shared store's records (no bench records), to write into or damage."""
    dst = tmp_path / "results"
    shutil.copytree(tiny_store["results"] / "records", dst / "records")
    return dst
