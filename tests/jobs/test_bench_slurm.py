"""The bench on a REAL loopback Slurm cluster (started and stopped here): a sweep that asks for a bench gets it in its
end-of-sweep Slurm job, after its jobs, and ``experiments/bench.py -m`` with the Slurm launcher measures a stored
sweep.

Opt in: ``python -m pytest -m slurm`` (run under ``flock /tmp/gac-slurm.lock``: the cluster uses fixed ports).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gac.results import ResultsStore

pytestmark = [pytest.mark.slurm, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
QUICK = ["model=tiny", "gpu=cpu", "eval=none", "calibration.n_samples=4", "calibration.seq_len=128", "seq_len=64"]
FAST = '["rounds=2","warmup=0","iters=1"]'



def _run(cluster, script, args, timeout=900):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / script), *args], cwd=ROOT,
                          env={**cluster.env, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=timeout)


def test_a_slurm_sweep_ends_with_one_bench_job(cluster, tmp_path):
    results = tmp_path / "results"
    r = _run(cluster, "run.py", ["-m", "hydra/launcher=slurm_local", *QUICK, f"results_dir={results}",
                                 f"hydra.sweep.dir={tmp_path}/multirun", "compressor=none,asvd", "align=unaligned,gac",
                                 "bench.after_sweep=true", f"bench.overrides={FAST}"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    store = ResultsStore(results)
    records = list(store.iter_records())
    assert len(records) == 3  # the baseline is one point whatever the strategy
    job_ids = {x["provenance"]["slurm_job_id"] for x in records}
    benches = list(store.iter_bench())
    assert len(benches) == 1
    doc = benches[0]
    assert [v["label"] for v in doc["variants"]] == ["Baseline", "ASVD", "ASVD (GAC)"]
    assert doc["baseline_record"] in {x["key"] for x in records}
    bench_job = doc["provenance"]["slurm_job_id"]
    assert bench_job and bench_job not in job_ids  # measured in its own Slurm job, after the sweep's
    report = json.loads((tmp_path / "multirun" / "sweep-end.json").read_text())
    assert report["slurm_job_id"] == bench_job and report["bench"] == doc["_path"]  # the end-of-sweep job's
    assert "the end-of-sweep job" in r.stdout and "ASVD (GAC)" in r.stdout

    # a second command: the Hydra bench app through the Slurm launcher, over the stored sweep
    r = _run(cluster, "bench.py", ["-m", "hydra/launcher=slurm_local", f"results_dir={results}",
                                   f"hydra.sweep.dir={tmp_path}/multirun-bench", "rounds=3", "warmup=0", "iters=1"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    benches = sorted(store.iter_bench(), key=lambda d: d["created"])
    assert len(benches) == 2 and benches[1]["protocol"]["rounds"] == 3
    assert benches[1]["provenance"]["slurm_job_id"] not in job_ids | {bench_job}
