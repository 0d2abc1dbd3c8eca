"""``gac launch cluster stop`` while a job runs on the REAL loopback Slurm cluster: the job is cancelled through
Slurm, whatever it left running is ended, and no process of the job remains; a process of the test's own that
looks like the job's (named slurmstepd, naming the cluster's slurm.conf and the job) and a plain ``sleep`` are not
touched.

Opt in: ``python -m pytest -m slurm`` (root, with Slurm installed: ``python -m gac.launch.local_cluster install``).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gac.launch import cluster_jobs, local_cluster
from gac.launch.cluster_jobs import ended
from gac.machine import pid_start
from tests.launch.test_local_cluster import _untouched

pytestmark = [pytest.mark.slurm, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


def _block_term():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _job_pids(f: Path, wait: float = 300.0) -> dict[str, int]:
    """The PIDs the job wrote (its step daemon, its shell, a child, one that left its step), once all four are
    there; a bounded wait for that state."""
    end = time.time() + wait
    while time.time() < end:
        lines = f.read_text().splitlines() if f.exists() else []
        if len(lines) == 4:
            return {k: int(v) for k, v in (ln.split() for ln in lines)}
        time.sleep(0.5)
    raise AssertionError(f"the job did not start within {wait:.0f} s: {lines}")


def test_stop_while_a_job_runs_leaves_no_process_of_it_and_touches_nothing_else(cluster, tmp_path):
    pids = tmp_path / "job-pids"
    script = tmp_path / "job.sh"
    # a child Slurm tracks, and one that leaves the step (its subshell exits: it is reparented, out of Slurm's reach)
    script.write_text(f"""#!/bin/bash
sleep 600 &
echo "child $!" >> {pids}
( sleep 600 >/dev/null 2>&1 & echo "escaped $!" >> {pids} )
echo "shell $$" >> {pids}
echo "stepd $PPID" >> {pids}
wait
""")
    r = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "job.out"), str(script)], env=cluster.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    ran = _job_pids(pids)
    starts = {k: pid_start(pid) for k, pid in ran.items()}
    assert all(starts.values()), (ran, starts)
    assert Path(f"/proc/{ran['stepd']}/comm").read_text().strip() == "slurmstepd"
    assert Path(f"/proc/{ran['escaped']}/stat").read_text().rpartition(")")[2].split()[1] == "1"  # it left
    # the evidence stop reads: the real step daemon names the cluster's slurm.conf and holds a socket in its spool
    steps = local_cluster._step_programs()
    confs, spools = cluster_jobs.names(cluster.dir)
    table = cluster_jobs.process_table(steps)
    stepd = table[ran["stepd"]]
    assert stepd.exe in steps and stepd.conf in confs and any(s.startswith(f"{cluster.dir}/spool/") for s in stepd.sockets)
    assert set(ran.values()) <= set(cluster_jobs.tie(table, confs, spools, steps).ours)
    # the test's own: a sleep called slurmstepd naming the cluster's conf and the job, and a plain sleep
    fake = tmp_path / "slurmstepd"
    fake.symlink_to(subprocess.run(["sh", "-c", "command -v sleep"], capture_output=True, text=True).stdout.strip())
    lookalike = subprocess.Popen([str(fake), "600"], env={**cluster.env, "SLURM_JOB_ID": job}, preexec_fn=_block_term)
    plain = subprocess.Popen(["sleep", "600"], preexec_fn=_block_term)
    try:
        stop = subprocess.run([sys.executable, "-m", "gac.cli", "launch", "cluster", "stop", "--dir", str(cluster.dir)],
                              cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=600)
        print(stop.stdout, stop.stderr, ran, sep="\n")
        assert stop.returncode == 0, stop.stderr
        assert f"cancelled 1 job(s) of this cluster: {job}" in stop.stdout
        # scancel ends what Slurm tracks; the process that left its step (parent PID 1) is ended after the daemons
        assert (f"ended PID {ran['escaped']} (sleep 600) (SIGTERM): a process of job {job} of this cluster that left "
                f"its step (SLURM_CONF={cluster.conf})") in stop.stdout.splitlines()
        left = {k: pid for k, pid in ran.items() if pid_start(pid) == starts[k] and not ended(pid)}  # zombies: gone
        assert left == {}, (left, stop.stdout, stop.stderr)
        assert _untouched(lookalike) and _untouched(plain)
        [warned] = [ln for ln in stop.stderr.splitlines() if ln.startswith(f"warning: PID {lookalike.pid} (")]
        assert (f"was left alone: it names this cluster's slurm.conf and job {job}, but its parent PID "
                f"{os.getpid()}") in warned
        assert f"PID {plain.pid} " not in stop.stdout + stop.stderr
        assert f"PID {lookalike.pid} " not in stop.stdout
    finally:
        for p in (lookalike, plain):
            p.kill()
            p.wait()
