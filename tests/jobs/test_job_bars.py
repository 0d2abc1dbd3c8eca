"""A Hydra job off a terminal writes gac's one-line progress, not other libraries' progress bars.

torch imports tqdm (torch.hub) before any job starts, so ``TQDM_DISABLE`` set at job start is read too late; the
bars of transformers' weight loading and lm-eval's request building must be hidden by other means.
"""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BAR = re.compile(r"(it/s|s/it)\]")  # a tqdm bar's rate: "s/it" when a step takes over a second (a loaded machine)
JOB = ["model=tiny", "compressor=none", "align=unaligned", "eval=quick", "eval.ppl=false", "eval.latency=false",
       "eval.tasks=[piqa]", "eval.limit=8"]


def _job(tmp_path, *extra):
    return _run(tmp_path, *extra), tmp_path


def _run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "-m", *JOB, *extra,
                           f"results_dir={tmp_path}/results", f"hydra.sweep.dir={tmp_path}/multirun"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The plain job and the ``verbose=true`` job, run at once (two processes, each its own results); both finished
    (and the pool's threads joined) before any test reads them."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain = pool.submit(_job, tmp_path_factory.mktemp("plain"))
        verbose = pool.submit(_job, tmp_path_factory.mktemp("verbose"), "verbose=true")
    return {"plain": plain.result(), "verbose": verbose.result()}


def test_a_job_off_a_terminal_draws_no_library_bars(jobs):
    r, tmp_path = jobs["plain"]
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "Loading weights" not in out and not BAR.search(out) and "\r" not in out, out[-2000:]
    assert "tasks" in out  # gac's own stage line is still there
    logs = list((tmp_path / "multirun").rglob("*.log"))
    assert logs and not any(BAR.search(p.read_text()) for p in logs)


def test_verbose_keeps_the_library_bars(jobs):
    r, _ = jobs["verbose"]
    assert r.returncode == 0, r.stderr[-3000:]
    assert BAR.search(r.stderr)  # the same job, bars asked for: the test above can fail
