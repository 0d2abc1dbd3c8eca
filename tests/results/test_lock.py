"""Locks on a shared file system: exclusive, stale only when the holder is provably gone, broken safely."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from gac.errors import GacError
from gac.results.lock import FileLock, read_holder, stale_reason


def _hold_in_child(path):
    """A child process that takes the lock and waits (killed by the test)."""
    code = ("import sys,time; from gac.results.lock import FileLock; l=FileLock(sys.argv[1]); "
            "assert l.try_acquire(); print('held', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert p.stdout.readline().strip() == "held"
    return p


def test_exclusive_and_released(tmp_path):
    a, b = FileLock(tmp_path / "k.lock"), FileLock(tmp_path / "k.lock")
    assert a.try_acquire()
    assert not b.try_acquire()  # the holder (this very process) is alive
    info = read_holder(a.path)
    assert info["pid"] == os.getpid() and info["token"] == a.info["token"] and info["machine"]
    a.release()
    assert not a.path.exists()
    assert b.try_acquire()
    b.release()


def test_lock_of_a_killed_process_is_stale_and_taken_over(tmp_path):
    path = tmp_path / "k.lock"
    child = _hold_in_child(path)
    lock = FileLock(path)
    assert not lock.try_acquire() and stale_reason(read_holder(path)) is None
    child.kill()
    child.wait()
    assert "is gone" in stale_reason(read_holder(path))
    assert lock.try_acquire()  # broken and re-taken at once: no waiting for a heartbeat bound
    assert read_holder(path)["pid"] == os.getpid()
    lock.release()


def test_other_host_is_judged_by_its_heartbeat(tmp_path):
    path = tmp_path / "k.lock"
    info = {"host": "node-17", "machine": "node-17-1", "pid": 1234, "token": "t", "started_iso": "2026-01-01T00:00:00Z"}
    path.write_text(json.dumps(info))
    assert stale_reason(read_holder(path), stale_s=60) is None  # fresh heartbeat: maybe alive elsewhere
    assert not FileLock(path, stale_s=60).try_acquire()
    old = time.time() - 120
    os.utime(path, (old, old))
    assert "no heartbeat" in stale_reason(read_holder(path), stale_s=60)
    lock = FileLock(path, stale_s=60)
    assert lock.try_acquire()
    lock.release()


def test_requeued_slurm_job_takes_over_its_own_lock(tmp_path, monkeypatch):
    path = tmp_path / "k.lock"
    path.write_text(json.dumps({"host": "node-3", "machine": "node-3-1", "pid": 99, "token": "t",
                                "slurm_job_id": "4242", "slurm_restart_count": None}))
    assert stale_reason(read_holder(path)) is None
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert "requeued" in stale_reason(read_holder(path))


def test_heartbeat_refreshes_and_a_broken_lock_is_noticed(tmp_path):
    lock = FileLock(tmp_path / "k.lock", heartbeat_s=0.05, stale_s=3600)
    assert lock.try_acquire()
    old = time.time() - 1000
    os.utime(lock.path, (old, old))
    deadline = time.time() + 5
    while lock.path.stat().st_mtime < time.time() - 10 and time.time() < deadline:
        time.sleep(0.02)
    assert lock.path.stat().st_mtime > time.time() - 10  # the heartbeat thread touched it
    lock.path.write_text(json.dumps({"token": "someone-else"}))  # another job broke it and took it
    while not lock.lost and time.time() < deadline:
        time.sleep(0.02)
    assert lock.lost
    lock.release()
    assert json.loads(lock.path.read_text())["token"] == "someone-else"  # release never removes another's lock


def test_concurrent_breakers_never_remove_a_fresh_lock(tmp_path):
    """Many threads race to break one stale lock: exactly one ends up holding it at any time."""
    path = tmp_path / "k.lock"
    path.write_text(json.dumps({"host": "gone", "machine": "gone-1", "pid": 1, "token": "stale"}))
    old = time.time() - 10_000
    os.utime(path, (old, old))
    winners, errors, start = [], [], threading.Barrier(8)

    def contend():
        lock = FileLock(path, stale_s=60, heartbeat_s=3600)
        start.wait()
        try:
            for _ in range(50):
                if lock.try_acquire():
                    winners.append(lock)
                    return
        except Exception as e:  # noqa: BLE001 - a contender that crashes (a lock removed under its look) is a failure
            errors.append(repr(e))

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(winners) == 1  # the others saw a fresh (own-process, alive) holder and never broke it
    assert read_holder(path)["token"] == winners[0].info["token"]
    winners[0].release()


def test_acquire_waits_then_times_out_with_who_holds_it(tmp_path):
    path = tmp_path / "k.lock"
    a = FileLock(path)
    assert a.try_acquire()
    seen = []
    with pytest.raises(GacError, match=f"held by .* pid {os.getpid()}"):
        FileLock(path).acquire(timeout=0.3, poll_s=0.05, on_wait=seen.append)
    assert seen and seen[0]["pid"] == os.getpid()
    releaser = threading.Thread(target=a.release)  # the holder lets go once the waiter waits: no timing
    b = FileLock(path)
    try:
        b.acquire(timeout=600, poll_s=0.05, on_wait=lambda holder: releaser.start())
    finally:
        if releaser.ident is not None:
            releaser.join()
    assert b.held
    b.release()


def test_a_heartbeat_far_in_the_future_is_refused_not_waited_for(tmp_path):
    """Another host's lock touched far ahead (a wrong clock): its age never passes stale_s, so acquire says so at
    once instead of waiting until the clocks catch up."""
    path = tmp_path / "k.lock"
    path.write_text(json.dumps({"host": "node-17", "machine": "node-17-1", "pid": 1234, "token": "t"}))
    ahead = time.time() + 3 * 3600
    os.utime(path, (ahead, ahead))
    t0 = time.monotonic()
    with pytest.raises(GacError, match=r"heartbeat [\d,]+ s in the future.*remove .*k\.lock"):
        FileLock(path, stale_s=60).acquire(timeout=30)
    assert time.monotonic() - t0 < 5 and path.exists()  # refused at once, the lock left alone
    soon = time.time() + 30  # a few seconds of skew is a clock, not a refusal: the lock is waited for
    os.utime(path, (soon, soon))
    with pytest.raises(GacError, match="waited"):
        FileLock(path, stale_s=60).acquire(timeout=0.2, poll_s=0.05)


def test_a_lock_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "colleague.txt"
    victim.write_text("keep")
    path = tmp_path / "k.lock"
    path.symlink_to(victim)
    with pytest.raises(GacError, match="is a symbolic link"):
        FileLock(path).try_acquire()
    assert victim.read_text() == "keep" and path.is_symlink()


@pytest.mark.timeout(20)
def test_a_lock_that_is_a_named_pipe_is_refused_not_read(tmp_path):
    """Reading a fifo blocks until a writer opens it: a fifo planted as a lock must be refused, never opened."""
    lock = tmp_path / "locks" / "k.lock"
    lock.parent.mkdir()
    os.mkfifo(lock)
    with pytest.raises(GacError, match="is not a regular file .*remove it"):
        read_holder(lock)
    with pytest.raises(GacError, match="is not a regular file"):
        FileLock(lock).try_acquire()
