"""Ctrl-C on a job (`experiments/run.py` on tiny, SIGINT while it is provably inside a stage): one line saying it was
interrupted and that a re-run resumes, exit code 130 (not a KeyboardInterrupt traceback and exit 1), the attempt
recorded as interrupted, the lock released, and the next run resuming the finished stages. Marker ``faults``."""

from __future__ import annotations

import json
import signal

import pytest

from gac.results import ResultsStore
from tests.faults.test_faults import TINY, run, start, state, wait_for

pytestmark = pytest.mark.faults


def test_ctrl_c_on_a_job_is_one_line_exit_130_and_the_next_run_resumes(tmp_path):
    res, hold = tmp_path / "results", tmp_path / "hold"
    job = start(res, TINY, fault="tasks:hold", hold_dir=hold)  # perplexity done, inside the tasks stage
    wait_for(lambda: (hold / "held-tasks").exists(), "the job to reach its tasks stage", job)
    job.send_signal(signal.SIGINT)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert "experiments/run.py: interrupted; re-run to resume" in out.splitlines()[-1]
    row = state(res, TINY)
    key = row["key"]
    attempts = json.loads((res / "work" / key / "attempts.json").read_text())["attempts"]
    assert [a["outcome"] for a in attempts] == ["interrupted"] and attempts[0]["stage"] == "tasks"
    assert not list((res / "locks").glob("*.lock")) and not ResultsStore(res).failure_paths(key)

    again = run(res, TINY)
    assert again.returncode == 0, again.stderr[-3000:]
    rec = ResultsStore(res).read_record(key)
    assert "ppl" in rec["stages"]["resumed"] and "tasks" not in rec["stages"]["resumed"]
    assert [a["outcome"] for a in rec["attempts"]] == ["interrupted", "completed"]
