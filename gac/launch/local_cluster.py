"""A real single-node Slurm cluster on loopback, for integration tests and for trying a sweep locally.

Daemons: munged, MariaDB (accounting storage), slurmdbd, slurmctld, slurmd — each started in the foreground
mode, backgrounded, its PID recorded in the state directory; ``stop`` signals only recorded PIDs. Accounting
is needed: without slurmdbd, submitit cannot learn the state of a job that died without a result file.

    python -m gac.launch.local_cluster install        # apt-get the daemons (root, Debian/Ubuntu)
    python -m gac.launch.local_cluster start [--dir D]
    python -m gac.launch.local_cluster stop  [--dir D]

``start`` prints ``export SLURM_CONF=...``; every Slurm client (sbatch, squeue, submitit) needs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gac.errors import GacError

PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
REQUIRED = ("munged", "munge", "unmunge", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sinfo")
PORTS = (6817, 6818, 6819)
DEFAULT_DIR = Path(tempfile.gettempdir()) / "gac-slurm"


@dataclass
class Cluster:
    dir: Path
    conf: Path

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}


def missing_binaries() -> list[str]:
    return [b for b in REQUIRED if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]


def install() -> None:
    if os.geteuid() != 0:
        raise GacError("installing Slurm needs root (apt-get); run as root or install " + " ".join(PACKAGES))
    if shutil.which("apt-get") is None:
        raise GacError("no apt-get on this machine; install " + ", ".join(PACKAGES) + " with your package manager")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES], check=True, env=env)


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(pred, timeout: float, what: str, log: Path | None = None) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    raise GacError(f"local Slurm cluster: {what} did not come up within {timeout:.0f} s{tail}")


def _spawn(cmd: list[str], state: Path, name: str, env=None) -> int:
    log = state / f"{name}.out"
    with open(log, "ab") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
    pids = _read_pids(state)
    pids[name] = p.pid
    (state / "pids.json").write_text(json.dumps(pids))
    return p.pid


def _read_pids(state: Path) -> dict:
    f = state / "pids.json"
    return json.loads(f.read_text()) if f.exists() else {}


def _ok(cmd, env=None) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _slurm_conf(d: Path, host: str, cpus: int, mem_mb: int) -> str:
    return f"""ClusterName=gaclocal
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
MailProg=/bin/true
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _slurmdbd_conf(d: Path) -> str:
    return f"""AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
PidFile={d}/slurmdbd.pid
LogFile={d}/slurmdbd.log
"""


def start(directory: str | os.PathLike | None = None, cpus: int | None = None, mem_mb: int = 4096) -> Cluster:
    """Start the daemons (root only) and wait until the node is idle. Returns the cluster handle."""
    missing = missing_binaries()
    if missing:
        raise GacError(
            f"Slurm is not installed here (missing: {', '.join(missing)}); run "
            f"`python -m gac.launch.local_cluster install` (root) or apt-get install {' '.join(PACKAGES)}"
        )
    if os.geteuid() != 0:
        raise GacError("the loopback Slurm cluster runs its daemons as root; run as root")
    busy = [p for p in PORTS if _port_open(p)]
    if busy:
        raise GacError(f"ports {busy} are in use (another slurmctld/slurmd/slurmdbd?); stop it first")
    d = Path(directory or DEFAULT_DIR)
    if d.exists() and _read_pids(d):
        raise GacError(f"{d} holds a running cluster's PIDs; stop it first (python -m gac.launch.local_cluster stop --dir {d})")
    if d.exists():
        shutil.rmtree(d)  # job ids restart at 1 with fresh state; stale state would confuse submitit
    d.mkdir(parents=True)
    d.chmod(0o755)
    for parent in d.resolve().parents:  # munge and mysql run as their own users: they must reach the directory
        if not parent.stat().st_mode & 0o001:
            raise GacError(f"{parent} is not searchable by other users (mode {oct(parent.stat().st_mode & 0o777)}); "
                           f"the munge and mysql daemons cannot reach {d}: choose a directory under /tmp")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    from gac.machine import hostname

    host = hostname()  # the short name Slurm knows this node by
    cpus = cpus or os.cpu_count() or 1
    conf = d / "slurm.conf"
    conf.write_text(_slurm_conf(d, host, cpus, mem_mb))
    dbd = d / "slurmdbd.conf"
    dbd.write_text(_slurmdbd_conf(d))
    dbd.chmod(0o600)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        # 1. munge
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if not _ok(["sh", "-c", "munge -n | unmunge"]):
            _spawn(["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", _bin("munged"), "-F"], d, "munged")
            _wait(lambda: _ok(["sh", "-c", "munge -n | unmunge"]), 20, "munged", d / "munged.out")
        # 2. MariaDB, files inside its own datadir
        my = d / "mysql"
        r = subprocess.run([_bin("mariadb-install-db"), "--user=mysql", f"--datadir={my}",
                            "--auth-root-authentication-method=socket", "--skip-test-db"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise GacError(f"mariadb-install-db failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}")
        Path("/run/mysqld").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/mysqld", "mysql", "mysql")
        sock = "/run/mysqld/mysqld.sock"
        _spawn([_bin("mariadbd"), "--no-defaults", "--user=mysql", f"--datadir={my}", f"--socket={sock}",
                "--skip-networking", f"--log-error={my}/mariadb.err", f"--pid-file={my}/mariadb.pid"], d, "mariadbd")
        _wait(lambda: _ok(["mariadb", "-uroot", f"--socket={sock}", "-e", "select 1"]), 60, "MariaDB", my / "mariadb.err")
        # 3. slurmdbd, then the controller and the node daemon
        _spawn([_bin("slurmdbd"), "-D"], d, "slurmdbd", env)
        _wait(lambda: _port_open(6819), 60, "slurmdbd", d / "slurmdbd.log")
        _spawn([_bin("slurmctld"), "-D", "-i"], d, "slurmctld", env)
        _wait(lambda: _port_open(6817), 30, "slurmctld", d / "slurmctld.log")
        _spawn([_bin("slurmd"), "-D"], d, "slurmd", env)

        def idle():
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=env)
            return r.returncode == 0 and r.stdout.strip().startswith("idle")

        _wait(idle, 60, "the node (sinfo idle)", d / "slurmd.log")
    except BaseException:
        stop(d)
        raise
    return Cluster(d, conf)


def stop(directory: str | os.PathLike | None = None, timeout: float = 15.0) -> None:
    """Stop the daemons this module started (recorded PIDs only), newest first; SIGKILL after ``timeout``."""
    d = Path(directory or DEFAULT_DIR)
    pids = _read_pids(d)
    for name in reversed(list(pids)):
        pid = pids[name]
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        end = time.time() + timeout
        while time.time() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            with contextlib.suppress(ChildProcessError):  # reap if it is our child
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if (d / "pids.json").exists():
        (d / "pids.json").unlink()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gac.launch.local_cluster", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["install", "start", "stop"])
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    ap.add_argument("--cpus", type=int, default=None)
    ap.add_argument("--mem-mb", type=int, default=4096)
    a = ap.parse_args(argv)
    try:
        if a.action == "install":
            install()
        elif a.action == "start":
            c = start(a.dir, a.cpus, a.mem_mb)
            print(f"export SLURM_CONF={c.conf}")
        else:
            stop(a.dir)
    except GacError as e:
        print(f"local_cluster: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
