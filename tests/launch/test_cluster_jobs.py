"""``gac launch cluster stop`` ends the processes its cluster's jobs left, and only those: a process is the
cluster's on evidence that ties it to this cluster (a step daemon naming its slurm.conf or holding a socket in its
spool; a job process that left its step; a descendant of either or of a recorded daemon), never by its name.
No Slurm is needed: the rule is checked on process tables written by hand, and ``stop`` on real ``sleep``
processes standing in for step daemons, with ``squeue``/``scancel`` as scripts that record how they were called."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gac.launch import cluster_jobs as cj
from gac.launch import local_cluster as lc
from gac.machine import pid_start
from tests.launch.test_local_cluster import _untouched

STEPD = "/usr/sbin/slurmstepd"
CONF = "/tmp/c/slurm.conf"
SPOOL = "/tmp/c/spool"


def _p(pid, ppid, comm="sleep", exe="/usr/bin/sleep", conf=None, job=None, sockets=()):
    return cj.Proc(pid, ppid, f"{pid}00", comm, exe, conf, job, comm, tuple(sockets))


def _tie(*procs, roots=None, me=2):
    table = {p.pid: p for p in procs}
    return cj.tie(table, frozenset({CONF}), (SPOOL,), frozenset({STEPD}), roots=roots, me=me)


SHELL = _p(2, 1, "bash", "/usr/bin/bash")  # the process that stops the cluster ("me")


def test_a_step_daemon_naming_this_clusters_conf_and_its_descendants_are_ours():
    v = _tie(SHELL, _p(10, 1, "slurmstepd", STEPD, conf=CONF), _p(11, 10, "bash", conf=CONF, job="3"),
             _p(12, 11, "sleep", job="3"))
    assert set(v.ours) == {10, 11, 12} and v.doubtful == []
    assert "step daemon of this cluster" in v.ours[10][1] and "started by PID 11" in v.ours[12][1]


def test_a_step_daemon_is_ours_by_its_socket_in_the_spool_even_without_slurm_conf():
    v = _tie(SHELL, _p(10, 1, "slurmstepd", STEPD, sockets=[f"{SPOOL}/node_3.batch"]))
    assert set(v.ours) == {10} and SPOOL in v.ours[10][1]


def test_a_process_of_another_cluster_is_not_ours():
    """Another SLURM_CONF (or none, or a socket in another spool) ties a step daemon to no process of this cluster:
    it, its children and a job process of that cluster are left alone; the Slurm programs among them are named."""
    other = "/tmp/other/slurm.conf"
    v = _tie(SHELL, _p(20, 1, "slurmstepd", STEPD, conf=other), _p(21, 20, "sleep", conf=other, job="3"),
             _p(22, 1, "sleep", conf=other, job="3"), _p(23, 1, "srun", "/usr/bin/srun", conf=other, job="3"),
             _p(24, 1, "slurmstepd", STEPD, sockets=["/tmp/other/spool/node_3.0"]))
    assert v.ours == {}
    why = {p.pid: w for p, w in v.doubtful}
    assert set(why) == {20, 23, 24}  # the sleeps are no Slurm program and name no job of this cluster
    assert f"another cluster (SLURM_CONF={other})" in why[20] and "no SLURM_CONF" in why[24]


def test_a_name_alone_ties_nothing():
    """A program called slurmstepd that is not Slurm's, naming this cluster's conf, is not ours: it is warned of."""
    v = _tie(SHELL, _p(30, 1, "slurmstepd", "/usr/bin/sleep", conf=CONF), _p(31, 30, "sleep", conf=CONF))
    assert v.ours == {} and [p.pid for p, _ in v.doubtful] == [30]


def test_a_job_process_that_left_its_step_is_ours_only_when_orphaned():
    """One that names this cluster's conf and a job, reparented to PID 1, escaped its step; the same under a living
    parent (a user's shell under salloc, a test's bystander) is not ours, and is named."""
    v = _tie(SHELL, _p(40, 1, "sleep", conf=CONF, job="5"), _p(41, 2, "sleep", conf=CONF, job="5"),
             _p(42, 1, "sleep", conf=CONF))
    assert set(v.ours) == {40} and "job 5 of this cluster that left its step" in v.ours[40][1]
    assert [(p.pid, "parent PID 2 (bash)" in w) for p, w in v.doubtful] == [(41, True)]


def test_descendants_of_the_recorded_daemons_are_ours_the_daemons_are_stopped_apart():
    v = _tie(SHELL, _p(50, 1, "slurmd", "/usr/sbin/slurmd"), _p(51, 50, "bash"), roots={50: "slurmd"})
    assert set(v.ours) == {51} and "PID 50 (slurmd)" in v.ours[51][1]


def test_the_stopping_process_and_its_ancestors_are_never_ours():
    """``gac launch cluster stop`` run inside a job of the cluster does not end itself or the shell it runs in."""
    v = _tie(_p(60, 1, "slurmstepd", STEPD, conf=CONF), _p(61, 60, "bash", conf=CONF, job="1"),
             _p(62, 61, "python", conf=CONF, job="1"), _p(63, 61, "sleep", conf=CONF, job="1"), me=62)
    assert set(v.ours) == {63} and v.doubtful == []


def test_an_unreadable_environment_ties_nothing():
    v = _tie(SHELL, _p(70, 1, "slurmstepd", STEPD, conf=cj.UNREADABLE, job=cj.UNREADABLE))
    assert v.ours == {} and "cannot be read" in v.doubtful[0][1]


def test_the_process_table_reads_a_live_process():
    p = subprocess.Popen(["sleep", "600"], env={"SLURM_CONF": "/x/../tmp/c/slurm.conf", "SLURM_JOB_ID": "9"})
    try:
        me = cj.process_table(frozenset())[p.pid]
        assert (me.ppid, me.comm, me.conf, me.job) == (os.getpid(), "sleep", CONF, "9")
        assert me.exe == os.path.realpath(shutil.which("sleep"))
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def slurm_clients(tmp_path, monkeypatch):
    """``squeue`` and ``scancel`` as scripts: squeue prints the job ids in ``queue`` (one a line), scancel empties
    it; each logs its SLURM_CONF and arguments in ``calls``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    queue, calls = tmp_path / "queue", tmp_path / "calls"
    queue.write_text("")
    (bin_ / "squeue").write_text(f'#!/bin/sh\necho "squeue $SLURM_CONF $*" >> {calls}\ncat {queue}\n')
    (bin_ / "scancel").write_text(f'#!/bin/sh\necho "scancel $SLURM_CONF $*" >> {calls}\n: > {queue}\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    return queue, calls


def _sleeper(env: dict, block_term: bool = False) -> subprocess.Popen:
    mask = (lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})) if block_term else None
    return subprocess.Popen(["sleep", "600"], env={"PATH": os.environ["PATH"], **env}, preexec_fn=mask)


def test_stop_cancels_the_jobs_then_ends_the_clusters_processes_and_leaves_another_clusters(
        tmp_path, monkeypatch, slurm_clients, capsys):
    queue, calls = slurm_clients
    d = lc.claim_dir(tmp_path / "cluster")
    conf = d / "slurm.conf"
    # ``sleep`` stands in for slurmstepd: one naming this cluster's conf, one another cluster's
    monkeypatch.setattr(lc, "_step_programs", lambda: frozenset({os.path.realpath(shutil.which("sleep"))}))
    lc._spawn(["sleep", "600"], d, "slurmctld")  # this cluster's controller runs: Slurm is asked first
    queue.write_text("7\n12\n")
    step = _sleeper({"SLURM_CONF": str(conf)})
    other = _sleeper({"SLURM_CONF": str(tmp_path / "other" / "slurm.conf")}, block_term=True)
    try:
        from gac.cli import main

        assert main(["launch", "cluster", "stop", "--dir", str(d)]) == 0
        out, err = capsys.readouterr()
        assert step.poll() is not None and _untouched(other)
        assert "cancelled 2 job(s) of this cluster: 7, 12" in out
        assert f"ended PID {step.pid} (sleep 600) (SIGTERM): a step daemon of this cluster (SLURM_CONF={conf})" in out
        assert f"PID {other.pid}" not in out
        assert f"warning: PID {other.pid} (sleep 600) was left alone: it belongs to another cluster" in err
        assert calls.read_text().splitlines() == [f"squeue {conf} -h -o %F", f"scancel {conf} 7 12",
                                                  f"squeue {conf} -h -o %F"]
    finally:
        for p in (step, other):
            p.kill()
            p.wait()


def test_stop_asks_slurm_nothing_while_its_controller_is_not_running(tmp_path, slurm_clients):
    """The controller port may be another cluster's then: its jobs are not this cluster's to cancel."""
    queue, calls = slurm_clients
    d = lc.claim_dir(tmp_path / "cluster")
    lc._spawn(["sleep", "600"], d, "slurmd")
    queue.write_text("3\n")
    r = lc.stop(d)
    assert not calls.exists() and r.cancelled == [] and r.notes == []


def _children(pid: int) -> list[int]:
    return [q.pid for q in cj.process_table(frozenset()).values() if q.ppid == pid]


def test_the_cli_stop_ends_what_a_daemon_started_and_names_what_it_left(tmp_path):
    """As a user runs it (``python -m gac.launch.local_cluster stop``, its own process): a child of a recorded
    daemon outlives it (as a step daemon outlives slurmd) and is ended, one line; a process naming this cluster's
    conf and a job, whose parent is no process of the cluster, is left alone with a warning."""
    d = lc.claim_dir(tmp_path / "cluster")
    daemon = lc._spawn(["sh", "-c", "sleep 600 & wait"], d, "slurmd")
    for _ in range(200):  # until sh has started its child (a bounded wait for a state, not a timing)
        kids = _children(daemon)
        if kids:
            break
        time.sleep(0.05)
    [kid] = kids
    kid_start = pid_start(kid)
    bystander = _sleeper({"SLURM_CONF": str(d / "slurm.conf"), "SLURM_JOB_ID": "4"}, block_term=True)
    try:
        r = subprocess.run([sys.executable, "-m", "gac.launch.local_cluster", "stop", "--dir", str(d)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert pid_start(kid) != kid_start or cj.ended(kid)  # gone, or a zombie PID 1 has not reaped yet
        assert r.stdout.splitlines() == [f"ended PID {kid} (sleep 600) (SIGTERM): started by PID {daemon} (slurmd) "
                                         f"of this cluster"]
        assert _untouched(bystander)
        assert (f"warning: PID {bystander.pid} (sleep 600) was left alone: it names this cluster's slurm.conf and job "
                f"4, but its parent PID {os.getpid()}") in r.stderr
    finally:
        bystander.kill()
        bystander.wait()
        with contextlib.suppress(ChildProcessError):  # the daemon sh is this process's child: reap it
            os.waitpid(daemon, 0)
