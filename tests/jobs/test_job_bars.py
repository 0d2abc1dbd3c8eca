"""A Hydra job off a terminal writes gac's one-line progress, not other libraries' progress bars.

torch imports tqdm (torch.hub) before any job starts, so ``TQDM_DISABLE`` set at job start is read too late; the
bars of transformers' weight loading and lm-eval's request building must be hidden by other means.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = ["model=tiny", "compressor=none", "align=unaligned", "eval=quick", "eval.ppl=false", "eval.latency=false",
       "eval.tasks=[piqa]", "eval.limit=8"]


def _job(tmp_path, *extra):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "-m", *JOB, *extra,
                           f"results_dir={tmp_path}/results", f"hydra.sweep.dir={tmp_path}/multirun"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_job_off_a_terminal_draws_no_library_bars(tmp_path):
    r = _job(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "Loading weights" not in out and "it/s]" not in out and "\r" not in out, out[-2000:]
    assert "tasks" in out  # gac's own stage line is still there
    logs = list((tmp_path / "multirun").rglob("*.log"))
    assert logs and not any("it/s]" in p.read_text() for p in logs)


def test_verbose_keeps_the_library_bars(tmp_path):
    r = _job(tmp_path, "verbose=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "it/s]" in r.stderr  # the same job, bars asked for: the test above can fail
