"""A multirun that asks for a bench (bench.after_sweep=true) gets one when its jobs have ended (local launcher)."""

import json
import subprocess
import sys
from pathlib import Path

from gac.results import ResultsStore

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["model=tiny", "gpu=cpu", "eval=none", "calibration.n_samples=4", "calibration.seq_len=128", "seq_len=64",
         "compressor=llm_pruner", "align=unaligned,gac", "bench.after_sweep=true",  # llm_pruner: 11 s less than asvd on tiny
         'bench.overrides=["rounds=2","warmup=0","iters=1","profile=false"]']


def test_the_sweep_ends_with_a_bench_of_its_points(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "-m", *SWEEP,
                        f"results_dir={tmp_path}/results", f"hydra.sweep.dir={tmp_path}/multirun"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    store = ResultsStore(tmp_path / "results")
    records = list(store.iter_records())
    assert len(records) == 2
    benches = list(store.iter_bench())
    assert len(benches) == 1
    doc = benches[0]
    assert sorted(doc["records"]) == sorted(x["key"] for x in records)
    assert [v["label"] for v in doc["variants"]] == ["Baseline", "LLM-Pruner", "LLM-Pruner (GAC)"]
    assert doc["protocol"]["rounds"] == 2
    assert "LLM-Pruner (GAC)" in r.stdout and "vs unaligned" in r.stdout  # the bench table is printed
    json.dumps(doc)
