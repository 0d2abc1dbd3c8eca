"""`gac launch status` tells the truth: running only while a holder lives, interrupted after a kill, retrying after a
failure, corrupt records named, and a mistyped results directory is an error."""

import json
import os
import subprocess
import sys
import time

import pytest

from gac.launch.status import _Slurm, point_state
from gac.results import ResultsStore

REC = {"job": {"model": "tiny", "compressor": "asvd", "strategy": "gac"}, "metrics": {}}


@pytest.fixture
def store(tmp_path):
    s = ResultsStore(tmp_path / "results")
    s.prepare_for_writing()
    return s


def _event(store, key, kind, **kw):
    from gac.jobs.tracking.loggers import append_event

    append_event(store.root, key, kind, **kw)


def test_pending_done_corrupt_failed(store):
    assert point_state(store, "k")["state"] == "pending"
    store.write_failure("k", {"error": "RuntimeError: boom"})
    st = point_state(store, "k")
    assert st["state"] == "failed" and st["detail"] == "RuntimeError: boom"
    store.write_record("k", REC)
    assert point_state(store, "k")["state"] == "done"
    store.record_path("k").write_text('{"key": "k", "status": "comp')  # cut short by hand
    st = point_state(store, "k")
    assert st["state"] == "corrupt" and "move it aside" in st["detail"]


def test_running_while_the_holder_lives_then_interrupted(store):
    lock = store.lock("k")
    assert lock.try_acquire()
    _event(store, "k", "started")
    _event(store, "k", "stage", stage="tasks")
    st = point_state(store, "k")
    assert st["state"] == "running" and f"pid {os.getpid()}" in st["detail"] and "stage tasks" in st["detail"]
    lock.release()
    # a child takes the lock and is killed (kill -9): the lock stays, its process is gone
    code = ("import sys,time; from gac.results.lock import FileLock; l=FileLock(sys.argv[1]); "
            "assert l.try_acquire(); print('held', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, str(store.lock_path("k"))], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert child.stdout.readline().strip() == "held"
    assert point_state(store, "k")["state"] == "running"
    child.kill()
    child.wait()
    st = point_state(store, "k")
    assert st["state"] == "interrupted" and "is gone" in st["detail"] and "re-launch" in st["detail"]


def test_retry_after_a_failure_says_running(store):
    store.write_failure("k", {"error": "RuntimeError: node lost"})
    time.sleep(0.01)
    lock = store.lock("k")
    assert lock.try_acquire()
    st = point_state(store, "k")
    assert st["state"] == "running" and "retry after 1 failure(s) (RuntimeError: node lost)" in st["detail"]
    lock.release()
    _event(store, "k", "failed", error="again")
    assert point_state(store, "k")["state"] == "failed"


def test_started_without_outcome_and_without_lock_is_interrupted(store):
    _event(store, "k", "started")
    _event(store, "k", "stage", stage="ppl")
    st = point_state(store, "k")
    assert st["state"] == "interrupted" and "stage ppl" in st["detail"]
    _event(store, "k", "started")
    _event(store, "k", "completed")
    assert point_state(store, "k")["state"] == "pending"  # the record would say done; the events alone do not


@pytest.mark.parametrize("squeue_out,state", [("RUNNING", "running"), ("", "interrupted"), ("PENDING", "interrupted")])
def test_a_holder_on_another_node_is_judged_by_slurm(store, tmp_path, monkeypatch, squeue_out, state):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '{squeue_out}'\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    store.lock_path("k").parent.mkdir(parents=True, exist_ok=True)
    store.lock_path("k").write_text(json.dumps({"host": "gpu-node-3", "machine": "gpu-node-3-1", "pid": 4321,
                                                "token": "t", "slurm_job_id": "777"}))
    st = point_state(store, "k", _Slurm())
    assert st["state"] == state
    if state == "interrupted":
        assert "Slurm job 777" in st["detail"]


def test_a_holder_on_another_node_without_slurm_is_judged_by_heartbeat(store, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    path = store.lock_path("k")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": "gpu-node-3", "machine": "gpu-node-3-1", "pid": 4321, "token": "t"}))
    assert point_state(store, "k", _Slurm())["state"] == "running"
    old = time.time() - 3600
    os.utime(path, (old, old))
    st = point_state(store, "k", _Slurm())
    assert st["state"] == "interrupted" and "no heartbeat" in st["detail"]


def test_mistyped_results_dir_is_an_error(tmp_path, capsys):
    from gac.cli import main

    assert main(["launch", "status", "--results-dir", str(tmp_path / "reslts")]) == 2
    err = capsys.readouterr().err
    assert "no results store" in err and "reslts" in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    assert main(["launch", "status", "--results-dir", str(tmp_path / "empty")]) == 2
    assert "is not a gac results store" in capsys.readouterr().err


def test_array_tasks_show_as_squeue_does(store, tmp_path, monkeypatch):
    from gac.results.lock import describe_holder, slurm_display_id

    holder = {"host": "gpu-node-3", "machine": "gpu-node-3-1", "pid": 4321, "token": "t", "slurm_job_id": "778",
              "slurm_array_job_id": "777", "slurm_array_task_id": "1"}
    assert slurm_display_id(holder) == "777_1" and "Slurm job 777_1" in describe_holder(holder)
    assert slurm_display_id({"slurm_job_id": "5"}) == "5" and slurm_display_id({}) is None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho RUNNING\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    store.lock_path("k").parent.mkdir(parents=True, exist_ok=True)
    store.lock_path("k").write_text(json.dumps(holder))
    st = point_state(store, "k", _Slurm())
    assert st["state"] == "running" and st["slurm_job"] == "777_1" and "Slurm job 777_1" in st["detail"]
    store.write_record("d", {**REC, "provenance": {"slurm_job_id": "780", "slurm_array_job_id": "777",
                                                   "slurm_array_task_id": "3"}})
    assert point_state(store, "d", _Slurm())["slurm_job"] == "777_3"


def _tool(bin_dir, name, body):
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)


def test_an_squeue_banner_is_not_read_as_the_jobs_state(store, tmp_path, monkeypatch):
    """A site whose squeue prints a banner first: the state is the line that is one, never the banner's first
    word; and sacct's 'CANCELLED by 0' is CANCELLED."""
    from gac.launch.status import slurm_states

    assert slurm_states("Welcome to the cluster\nRUNNING\n") == ["RUNNING"]
    assert slurm_states("CANCELLED by 0\n") == ["CANCELLED"]
    _tool(tmp_path / "bin", "squeue", "echo 'Welcome to the HPC cluster, read the rules'; echo RUNNING")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert _Slurm().state("777") == "RUNNING"
    _tool(tmp_path / "bin", "squeue", "echo 'Welcome to the HPC cluster'")  # not in the queue: ask the accounting
    _tool(tmp_path / "bin", "sacct", "echo 'CANCELLED by 0'")
    assert _Slurm().state("777") == "CANCELLED"


def test_an_squeue_that_hangs_is_waited_for_once_and_said(store, tmp_path, monkeypatch, capsys):
    from gac.launch import status

    monkeypatch.setattr(status, "SLURM_ANSWER_S", 1)
    _tool(tmp_path / "bin", "squeue", "exec sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    slurm = _Slurm()
    assert slurm.state("1") is None and slurm.state("2") is None  # the second is not asked: no second wait
    err = capsys.readouterr().err
    assert err.count("squeue did not answer in 1 s") == 1 and "judged by its heartbeat" in err


@pytest.mark.parametrize("points", ["abc", None, ["k1", "k2"], [None], [{"key": 5}], 7])
def test_a_malformed_launch_record_is_skipped_not_a_traceback(store, points):
    """A launch record (sweeps/*.json) whose points are not the launcher's: skipped like an unreadable one, and a
    healthy launch of the store beside it is still found."""
    from gac.launch.status import sweep_end_status

    store.write_sweep("20260101T000000-1", {"kind": "gac-sweep", "points": points, "end_job": "1",
                                            "array_job": "0", "sweep_dir": None})
    rows = [{"key": "k1", "results_dir": str(store.root)}, {"key": "k2", "results_dir": str(store.root)}]
    assert sweep_end_status(rows, _Slurm()) is None
    store.write_sweep("20250101T000000-2", {"kind": "gac-sweep", "points": [{"key": "k1"}, {"key": "k2"}],
                                            "end_job": "12", "array_job": "11", "sweep_dir": "/nonexistent"})

    class Gone(_Slurm):
        def state(self, job_id):
            return "COMPLETED"

    end = sweep_end_status(rows, Gone())
    assert end is not None and end["end_job"] == "12" and "without a report" in end["detail"]
