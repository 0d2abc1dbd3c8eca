"""The canary (``gac launch canary``) on a REAL loopback Slurm cluster, with the first-run guide's site file in place.

Opt in: ``python -m pytest -m slurm`` (root, with Slurm installed: ``python -m gac.launch.local_cluster install``).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.jobs.test_site_file import documented_site_file

pytestmark = [pytest.mark.slurm, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
STEPS = ("site files", "fetch", "offline", "submit", "preflight", "points", "lm-eval data", "env file",
         "end of sweep", "time")


def test_the_canary_passes_on_the_loopback_cluster_with_the_documented_site_file(cluster, tmp_path):
    site = yaml.safe_load(documented_site_file())
    site.update(partition="debug", account=None, qos=None, constraint=None)  # the loopback cluster's own values
    site["setup"] = [line.replace("/scratch/$USER/hf", str(tmp_path / "hf")) for line in site["setup"]]
    (tmp_path / "conf" / "local").mkdir(parents=True)
    (tmp_path / "conf" / "local" / "slurm.yaml").write_text(yaml.safe_dump(site))
    sweep = tmp_path / "canary"
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "gac.cli", "launch", "canary", "hydra/launcher=slurm_local",
                        "model=tiny", f"hydra.sweep.dir={sweep}", f"--config-dir={tmp_path}/conf", "--poll-s", "5"],
                       cwd=ROOT, env={**cluster.env, "HF_HOME": str(tmp_path / "hf"), "PYTHONUNBUFFERED": "1"},
                       capture_output=True, text=True, timeout=1800)
    minutes = (time.time() - t0) / 60
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-3000:]
    for step in STEPS:
        assert f"  PASS  {step:<13}" in out, (step, out)
    assert "  SKIP  GPU request   the launcher asks for no GPU" in out  # the loopback node has none
    assert "FAIL" not in out and "canary: PASS" in out and "Traceback" not in r.stderr
    assert f"{tmp_path}/conf/local/slurm.yaml read" in out
    assert "2 point(s) done, benched (" in out  # the end-of-sweep job ran the bench
    progress = [ln for ln in out.splitlines() if ln.startswith("  [")]
    assert progress and "end-of-sweep job" in progress[0]  # the progress lines, one per change
    scripts = [p.read_text() for p in (sweep / ".submitit").rglob("*_submission.sh")]
    assert scripts and all("module load cuda/12.4" in s and "#SBATCH --partition=debug" in s for s in scripts)
    assert not list(sweep.glob(".gac-env-*.sh"))  # the end-of-sweep job removed it
    report = json.loads((sweep / "node-report.json").read_text())
    assert report["kind"] == "gac-node-report" and report["source"] == "canary" and len(report["points"]) == 2
    whats = {row["what"] for row in report["estimates"]}
    assert {"memory", "sensitivity time", "lm-eval items", "model shards", "device count"} <= whats
    sens = [row for row in report["estimates"] if row["what"] == "sensitivity time"]
    assert sens and all(row["estimate"] > 0 and row["measured"] > 0 and row["ratio"] > 0 for row in sens)
    assert all(row["ratio"] == 1.0 for row in report["estimates"] if row["what"] == "lm-eval items")
    assert [v["step"] for v in report["verdicts"] if v["ok"] is False] == []
    print(f"canary on the loopback cluster: {minutes:.1f} min")  # the time the docs quote (-s shows it)
