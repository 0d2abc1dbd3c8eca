"""`gac launch cluster` touches only what it made: ``start`` uses only a new, empty or gac-marked directory and checks
every prerequisite before it writes; ``stop`` signals only the daemons it started, still running as such. No Slurm
is needed: the daemons here are ``sleep`` processes, and an unrelated one must survive with no signal pending."""

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from gac.errors import GacError
from gac.launch import local_cluster as lc
from gac.machine import boot_id, pid_start


@pytest.fixture
def bystander():
    """A ``sleep`` this test started (not the cluster) with SIGTERM blocked: a SIGTERM sent to it stays pending,
    so a signal is seen in /proc at once, with no waiting."""
    p = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def _untouched(p: subprocess.Popen) -> bool:
    """Alive, and no signal sent to it pending."""
    status = Path(f"/proc/{p.pid}/status").read_text()
    pending = {line.split(":")[0]: int(line.split()[1], 16) for line in status.splitlines()
               if line.startswith(("SigPnd", "ShdPnd"))}
    return p.poll() is None and pending == {"SigPnd": 0, "ShdPnd": 0}


def _record(p: subprocess.Popen, **change) -> dict:
    """The record :func:`lc._spawn` would have written for ``p``, with ``change``."""
    return {"pid": p.pid, "start": pid_start(p.pid), "boot": boot_id(), "programs": [lc._program("sleep")], **change}


def _cluster_dir(tmp_path) -> Path:
    return lc.claim_dir(tmp_path / "cluster")


def _prerequisites_met(monkeypatch):
    """As if Slurm, its users and free ports were there: only the directory rules stand between ``start`` and disk."""
    monkeypatch.setattr(lc, "missing_binaries", lambda: [])
    monkeypatch.setattr(lc, "missing_users", lambda: [])
    monkeypatch.setattr(lc, "_port_open", lambda port: False)


def test_start_leaves_a_directory_of_the_users_alone(tmp_path, monkeypatch):
    _prerequisites_met(monkeypatch)
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("a user's file")
    with pytest.raises(GacError, match="holds files gac did not make"):
        lc.start(d)
    assert [p.name for p in d.iterdir()] == ["thesis.tex"] and (d / "thesis.tex").read_text() == "a user's file"


@pytest.mark.parametrize("exists", [False, True])
def test_prerequisites_are_checked_before_anything_is_written(tmp_path, monkeypatch, exists):
    monkeypatch.setattr(lc, "missing_binaries", lambda: [])
    monkeypatch.setattr(lc, "missing_users", lambda: ["munge"])
    d = tmp_path / "cluster"
    if exists:
        d.mkdir()
    with pytest.raises(GacError, match="munge|as root"):
        lc.start(d)
    assert (d.exists() and not any(d.iterdir())) if exists else not d.exists()


def test_a_directory_gac_made_is_reused_and_keeps_what_gac_did_not_write(tmp_path):
    d = _cluster_dir(tmp_path)
    assert (d / lc.MARKER).is_file() and (d / "state").is_dir()
    (d / "state" / "job_state").write_text("stale")
    (d / "slurm.conf").write_text("old")
    (d / "notes.txt").write_text("a user's note")
    pid = lc._spawn(["true"], d, "done")  # a daemon that has ended: its record is stale
    with contextlib.suppress(ChildProcessError):  # unless subprocess has reaped it already
        os.waitpid(pid, 0)
    lc.claim_dir(d)
    assert not (d / "slurm.conf").exists() and not (d / "pids.json").exists() and not any((d / "state").iterdir())
    assert (d / "notes.txt").read_text() == "a user's note"


def test_a_directory_with_a_running_daemon_is_not_reused(tmp_path):
    d = _cluster_dir(tmp_path)
    lc._spawn(["sleep", "600"], d, "sleeper")
    try:
        with pytest.raises(GacError, match="holds a running cluster"):
            lc.claim_dir(d)
        assert (d / "pids.json").is_file()
    finally:
        assert lc.stop(d).notes == []


def test_stop_ends_the_daemons_it_started(tmp_path):
    d = _cluster_dir(tmp_path)
    pids = [lc._spawn(["sleep", "600"], d, name) for name in ("first", "second")]
    assert lc.stop(d).notes == []
    assert all(pid_start(pid) is None for pid in pids)  # ended and reaped
    assert not (d / "pids.json").exists()


@pytest.mark.parametrize("change,why", [
    ({"start": "1"}, "another process now"),  # its PID reused (the daemon ended, a process took the number)
    ({"boot": "another-boot"}, "the machine restarted since"),
    ({"programs": ["/usr/sbin/munged"]}, "is /"),  # the same PID and start time, another program
])
def test_stop_never_signals_a_process_it_did_not_start(tmp_path, bystander, change, why, capsys):
    d = _cluster_dir(tmp_path)
    (d / "pids.json").write_text(json.dumps({"munged": _record(bystander, **change)}))
    from gac.cli import main

    assert main(["launch", "cluster", "stop", "--dir", str(d)]) == 0
    assert _untouched(bystander)
    err = capsys.readouterr().err
    assert f"munged (PID {bystander.pid}) is not running" in err and why in err and "left alone" in err
    assert not (d / "pids.json").exists()


@pytest.mark.parametrize("bad", [0, -1, -2147483647, 1, "PID", True, None, 12345])
def test_a_pid_record_gac_did_not_write_stops_nothing(tmp_path, bystander, bad):
    """Every entry is checked before any is signalled: the valid record of a running process beside a bad entry is
    not signalled either."""
    d = _cluster_dir(tmp_path)
    rec = bad if bad == 12345 else {"pid": bad, "start": "1", "boot": "b", "programs": ["/usr/sbin/munged"]}
    if bad == "PID":
        rec["pid"] = str(bystander.pid)
    (d / "pids.json").write_text(json.dumps({"munged": _record(bystander), "slurmd": rec}))
    with pytest.raises(GacError, match="nothing was signalled"):
        lc.stop(d)
    assert _untouched(bystander) and (d / "pids.json").is_file()


def test_stop_refuses_a_directory_gac_did_not_make(tmp_path, bystander):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "pids.json").write_text(json.dumps({"munged": _record(bystander)}))
    with pytest.raises(GacError, match="is not a directory gac made"):
        lc.stop(d)
    assert _untouched(bystander) and (d / "pids.json").is_file()
