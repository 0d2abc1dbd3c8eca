"""Every script in benchmarks/ runs end to end at its ``--quick`` size, so none of them rots unnoticed.

The scripts that need torch run in this process (``main(argv)``, sharing the imports already made); the solver
benchmark pins its process to one core, so it runs as its own process. ``--quick`` runs take no CPU lock.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def keep_torch_threads():
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)  # the scripts set their own thread counts


def test_every_benchmark_is_covered():
    covered = {"solver", "compressors", "families", "parity", "parity_prune", "predict_paper", "scale"}
    assert {p.stem for p in BENCH.glob("*.py")} == covered  # a new script gets a --quick run here


def test_solver_quick():
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    r = subprocess.run([sys.executable, str(BENCH / "solver.py"), "--quick"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Llama-3-70B equal scores" in r.stdout and "| NO" not in r.stdout


@pytest.mark.parametrize("name,argv,expect", [
    ("compressors", ["--quick", "--compressors", "llm_pruner"], "baseline perplexity"),
    ("parity", ["--quick", "--compressors", "asvd", "svd_llm"], "| asvd | 0.30 |"),
    ("parity_prune", ["--quick"], "llm_pruner"),
    ("predict_paper", ["--quick"], "median |error|"),
    ("families", ["--models", "tiny", "--device", "cpu", "--dtype", "float32", "--seq-len", "16", "--rounds", "2",
                  "--warmup", "1", "--iters", "1", "--calib", "1x16", "--compressors", "llm_pruner"], "llm_pruner gac"),
])
def test_benchmark_quick(name, argv, expect, keep_torch_threads, capsys):
    assert _module(name).main(argv) == 0
    assert expect in capsys.readouterr().out


def test_scale_quick(tmp_path, keep_torch_threads, capsys):
    scale = _module("scale")
    out = str(tmp_path / "scale.json")
    assert scale.main(["jobs", "--quick", "--compressors", "llm_pruner", "--out", out]) == 0
    assert scale.main(["methods", "--quick", "--out", out]) == 0
    assert scale.main(["report", "--out", out]) == 0
    assert "| tiny |" in capsys.readouterr().out
