"""A real single-node Slurm cluster on loopback, for integration tests and for trying a sweep locally.

Daemons: munged, MariaDB (accounting storage), slurmdbd, slurmctld, slurmd — each started in the foreground
mode, backgrounded, and recorded in the cluster's directory (``pids.json``: its PID, its start time, this boot and
its program). Accounting is needed: without slurmdbd, submitit cannot learn the state of a job that died without a
result file.

gac touches only what it made. ``start`` uses a new directory (made and marked with :data:`MARKER`), an empty one
(marked), or one it marked before (its own entries, :data:`OWN_ENTRIES`, removed; anything else left); any other
directory is refused before anything is written, and so are missing binaries or daemon users. ``stop`` cancels the
cluster's jobs through Slurm first (its own ``slurm.conf``, only while its own controller runs), then signals a
recorded PID only while it is still the daemon gac started (same start time, same boot, same program; never 0, 1, a
negative PID or a process group), and refuses a ``pids.json`` it did not write before signalling anything; last it
ends what the cluster's jobs left running, each process tied to this cluster by evidence, never by its name
(:mod:`gac.launch.cluster_jobs`), and names in a warning what looks like the cluster's but cannot be tied to it.

    python -m gac.launch.local_cluster install        # apt-get the daemons (root, Debian/Ubuntu)
    python -m gac.launch.local_cluster start [--dir D]
    python -m gac.launch.local_cluster stop  [--dir D]

``start`` prints ``export SLURM_CONF=...``; every Slurm client (sbatch, squeue, submitit) needs it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gac.errors import GacError
from gac.io import create_new, path_kind, read_json, write_json_atomic
from gac.launch import cluster_jobs
from gac.machine import boot_id, hostname, pid_start

PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
REQUIRED = ("munged", "munge", "unmunge", "mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "slurmctld", "slurmd",
            "sbatch", "sinfo", "setpriv")
USERS = ("munge", "mysql")  # munged and MariaDB run as their own users (the packages make them)
PORTS = (6817, 6818, 6819)
DEFAULT_DIR = Path(tempfile.gettempdir()) / "gac-slurm"
#: the file that makes a directory one gac made (or took empty) for a local cluster: only such a one is reused
MARKER = ".gac-local-cluster"
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
#: what gac writes at the top of a cluster directory; a reused directory loses these, and keeps anything else
OWN_ENTRIES = ("state", "spool", "mysql", "slurm.conf", "slurmdbd.conf", "pids.json", "slurmctld.pid", "slurmd.pid",
               "slurmdbd.pid", "slurmctld.log", "slurmd.log", "slurmdbd.log", *(f"{n}.out" for n in DAEMONS))
_NOTHING_SIGNALLED = ("nothing was signalled: stop the cluster's daemons yourself (ps -ef | grep -E "
                      "'munged|mariadbd|slurm'), then remove the file")


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


def missing_users() -> list[str]:
    out = []
    for u in USERS:
        try:
            pwd.getpwnam(u)
        except KeyError:
            out.append(u)
    return out


def _program(path: str) -> str:
    """The real path of a program, as /proc/PID/exe shows it (a binary replaced while running ends in " (deleted)")."""
    return os.path.realpath(shutil.which(path) or path).removesuffix(" (deleted)")


def _spawn(cmd: list[str], state: Path, name: str, env=None, programs: tuple[str, ...] = ()) -> int:
    """Start ``cmd`` in its own session, logging to ``state/name.out``, and record it in ``pids.json`` as the daemon
    ``name``: its PID, its start time, this boot, and the programs it may be (``cmd[0]`` and ``programs``: a
    launcher such as setpriv becomes the daemon it starts), which :func:`stop` checks before signalling it."""
    log = state / f"{name}.out"
    with open(log, "ab") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
    start, boot = pid_start(p.pid), boot_id()
    if start is None or boot is None:  # without /proc the daemon could not be told from a later process
        p.kill()
        p.wait()
        raise GacError("the local Slurm cluster needs Linux's /proc to record its daemons; run it on Linux")
    pids = _read_pids(state)
    pids[name] = {"pid": p.pid, "start": start, "boot": boot,
                  "programs": sorted({_program(c) for c in (cmd[0], *programs)})}
    write_json_atomic(state / "pids.json", pids, overwrite=True)
    return p.pid


def _bad_record(f: Path, name: str, rec) -> str | None:
    """Why the entry ``name: rec`` of ``f`` is not a daemon record :func:`_spawn` writes, or None."""
    if not isinstance(rec, dict) or set(rec) != {"pid", "start", "boot", "programs"}:
        return (f"{f}: the entry of {name!r} ({str(rec)[:60]}) is not a record gac writes (a PID with its start time, "
                f"boot and program)")
    pid = rec["pid"]
    if isinstance(pid, bool) or not isinstance(pid, int):
        return f"{f}: {name!r} has PID {pid!r}, which is not a whole number"
    if pid <= 1 or pid == os.getpid():
        why = {0: "0 would signal gac's own process group", -1: "-1 would signal every process",
               1: "1 is init"}.get(pid, "a negative PID would signal a process group" if pid < 0 else "it is gac itself")
        return f"{f}: {name!r} has PID {pid}, which is no daemon gac started ({why})"
    if not (isinstance(rec["start"], str) and rec["start"].isdigit() and isinstance(rec["boot"], str)
            and isinstance(rec["programs"], list) and rec["programs"]
            and all(isinstance(x, str) and x.startswith("/") for x in rec["programs"])):
        return f"{f}: the entry of {name!r} ({str(rec)[:80]}) is not a record gac writes"
    return None


def _read_pids(state: Path) -> dict:
    """The daemons recorded in ``state/pids.json`` (``{}`` when there is none), every entry checked before any is
    used: a file gac did not write is refused in one line, whatever it names."""
    f = state / "pids.json"
    if not (f.exists() or f.is_symlink()):
        return {}
    if f.is_symlink():
        raise GacError(f"{f} is a symbolic link, not the record gac writes; {_NOTHING_SIGNALLED}")
    try:
        pids = read_json(f, "the local cluster's PID record", max_bytes=1 << 20)
    except GacError as e:
        raise GacError(f"{e}; {_NOTHING_SIGNALLED}") from None
    if not isinstance(pids, dict):
        raise GacError(f"{f} holds a JSON {type(pids).__name__}, not the daemons gac records; {_NOTHING_SIGNALLED}")
    for name, rec in pids.items():
        bad = _bad_record(f, name, rec)
        if bad:
            raise GacError(f"{bad}; {_NOTHING_SIGNALLED}")
    return pids


def _not_the_daemon(rec: dict) -> str | None:
    """None while the process ``rec`` records is the daemon gac started (the same PID, start time, boot and
    program); ``"is not running"`` when no process has its PID; else why another process with its PID is not it."""
    pid = rec["pid"]
    start = pid_start(pid)
    if start is None:
        return "is not running"
    if cluster_jobs.ended(pid):  # ended, not yet reaped
        return "is not running"
    if rec["boot"] != boot_id():
        return f"is not running: the machine restarted since, and PID {pid} is another process now"
    if start != rec["start"]:
        return f"is not running: PID {pid} is another process now (it started at another time)"
    with contextlib.suppress(OSError):  # a daemon of another user, for a caller who is not root: start time suffices
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        if exe not in rec["programs"]:
            return f"is not running: PID {pid} is {exe} now"
    return None


def _signal(rec: dict, sig: int) -> bool:
    """Send ``sig`` to the daemon ``rec`` records, only while it is that daemon. True when it was sent."""
    return cluster_jobs.signal_if(rec["pid"], sig, lambda: _not_the_daemon(rec) is None)


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


def _marked(d: Path) -> bool:
    m = d / MARKER
    return m.is_file() and not m.is_symlink()


def _dir_state(d: Path) -> str:
    """What ``start`` may do with ``d``, read without writing anything: ``"new"`` (gac makes it), ``"empty"`` (an
    empty directory of the caller's: gac marks it), ``"ours"`` (one gac marked before, no daemon of it running).
    Anything else is refused in one line."""
    use = "give a new or empty directory (gac makes and marks it), or one gac made for a cluster before"
    if d.is_symlink():
        raise GacError(f"--dir {d} is a symbolic link; {use} (by its own path)")
    if not d.exists():
        parent = d.parent
        if not parent.is_dir():
            what = "does not exist" if not parent.exists() else f"is {path_kind(parent) or 'a file'}"
            raise GacError(f"--dir {d}: its parent {parent} {what}; {use}")
        return "new"
    if not d.is_dir():
        raise GacError(f"--dir {d} is {path_kind(d) or 'a file'}, not a directory; {use}")
    if d.stat().st_uid != os.geteuid():
        raise GacError(f"--dir {d} belongs to another user (uid {d.stat().st_uid}); {use}")
    if _marked(d):
        live = [n for n, rec in _read_pids(d).items() if _not_the_daemon(rec) is None]
        if live:
            raise GacError(f"{d} holds a running cluster ({', '.join(live)}); stop it first "
                           f"(gac launch cluster stop --dir {d})")
        return "ours"
    if any(d.iterdir()):
        raise GacError(f"--dir {d} holds files gac did not make (no {MARKER} in it); nothing was changed; {use}")
    return "empty"


def _check_prerequisites(d: Path) -> None:
    """Everything ``start`` needs that it does not make, checked before it writes anything: one line each."""
    missing = missing_binaries()
    if missing:
        raise GacError(
            f"Slurm is not installed here (missing: {', '.join(missing)}); run "
            f"`gac launch cluster install` (root) or apt-get install {' '.join(PACKAGES)}"
        )
    if os.geteuid() != 0:
        raise GacError("the loopback Slurm cluster runs its daemons as root; run as root")
    users = missing_users()
    if users:
        raise GacError(f"the user(s) {', '.join(users)} that munged and MariaDB run as do not exist here (the munge "
                       f"and mariadb-server packages make them); run `gac launch cluster install` (root) or apt-get "
                       f"install {' '.join(PACKAGES)}")
    busy = [p for p in PORTS if _port_open(p)]
    if busy:
        raise GacError(f"ports {busy} are in use (another slurmctld/slurmd/slurmdbd?); stop it first")
    for parent in d.resolve().parents:  # munge and mysql run as their own users: they must reach the directory
        if not parent.stat().st_mode & 0o001:
            raise GacError(f"{parent} is not searchable by other users (mode {oct(parent.stat().st_mode & 0o777)}); "
                           f"the munge and mysql daemons cannot reach {d}: choose a directory under /tmp")


def claim_dir(d: Path) -> Path:
    """Make ``d`` the cluster's directory (:func:`_dir_state` decides whether it may): a new one made, an empty one
    marked, one gac marked before emptied of its own entries (:data:`OWN_ENTRIES`: fresh state, so job ids restart
    at 1 and no stale state confuses submitit), anything else in it left alone."""
    state = _dir_state(d)
    if state == "new":
        d.mkdir()
    if state in ("new", "empty"):
        fd = create_new(d / MARKER)
        with os.fdopen(fd, "w") as f:
            f.write("made by `gac launch cluster start`: gac may reuse this directory and remove its own entries\n")
    else:
        for name in OWN_ENTRIES:
            e = d / name
            if e.is_dir() and not e.is_symlink():
                shutil.rmtree(e)
            elif e.exists() or e.is_symlink():
                e.unlink()
    d.chmod(0o755)
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    return d


def start(directory: str | os.PathLike | None = None, cpus: int | None = None, mem_mb: int = 4096) -> Cluster:
    """Start the daemons (root only) and wait until the node is idle. Returns the cluster handle. Nothing is
    written before the directory and every prerequisite are checked."""
    d = Path(directory or DEFAULT_DIR).expanduser()
    _dir_state(d)
    _check_prerequisites(d)
    claim_dir(d)
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
            _spawn([_bin("setpriv"), "--reuid=munge", "--regid=munge", "--init-groups", _bin("munged"), "-F"], d,
                   "munged", programs=(_bin("munged"),))
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


@dataclass
class Stopped:
    """What :func:`stop` did: ``cancelled`` (the jobs cancelled through Slurm), ``ended`` (one line per process of
    the cluster's jobs it ended), ``warnings`` (processes that look like the cluster's but cannot be tied to it, left
    alone) and ``notes`` (recorded PIDs left alone because another process has them now)."""
    cancelled: list = field(default_factory=list)
    ended: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def _step_programs() -> frozenset[str]:
    return frozenset({_program(_bin("slurmstepd"))})


def stop(directory: str | os.PathLike | None = None, timeout: float = 15.0, jobs_wait: float = 30.0) -> Stopped:
    """Stop the cluster: its jobs first, through Slurm with its own ``slurm.conf`` (only while its own controller
    runs, so no other cluster's controller is asked), waiting up to ``jobs_wait`` s until ``squeue`` shows none;
    then the daemons this module started, newest first, each only while it is still the daemon recorded
    (:func:`_not_the_daemon`), SIGKILL after ``timeout``; then every process still running that the cluster started
    (:mod:`gac.launch.cluster_jobs`: tied to it by evidence, never by name), SIGTERM then SIGKILL after ``timeout``."""
    d = Path(directory or DEFAULT_DIR).expanduser()
    if not d.is_dir():
        raise GacError(f"no local cluster in {d}: it {path_kind(d) and 'is ' + path_kind(d) or 'does not exist'}; "
                       f"give the --dir the cluster was started with")
    if not _marked(d):
        raise GacError(f"{d} is not a directory gac made for a local cluster (no {MARKER} in it); nothing was "
                       f"signalled; give the --dir the cluster was started with")
    pids = _read_pids(d)  # every entry checked before any is signalled
    out = Stopped()
    live = {name: rec for name, rec in pids.items() if _not_the_daemon(rec) is None}
    if "slurmctld" in live:
        out.cancelled, out.warnings = cluster_jobs.cancel_jobs(Cluster(d, d / "slurm.conf").env, jobs_wait)
    confs, spools = cluster_jobs.names(d)
    steps = _step_programs()
    before = cluster_jobs.tie(cluster_jobs.process_table(steps), confs, spools, steps,
                              roots={rec["pid"]: name for name, rec in live.items()})
    for name in reversed(list(pids)):
        rec = pids[name]
        why = _not_the_daemon(rec)
        if why is not None:
            if why != "is not running":
                out.notes.append(f"{name} (PID {rec['pid']}) {why}; it was left alone")
            continue
        if not _signal(rec, signal.SIGTERM):
            continue
        end = time.time() + timeout
        while time.time() < end and _not_the_daemon(rec) is None:
            time.sleep(0.1)
        _signal(rec, signal.SIGKILL)
        if pid_start(rec["pid"]) == rec["start"]:  # ended (or killed), not yet reaped: reap it if it is our child
            with contextlib.suppress(ChildProcessError):
                os.waitpid(rec["pid"], 0)
    (d / "pids.json").unlink(missing_ok=True)
    after = cluster_jobs.tie(cluster_jobs.process_table(steps), confs, spools, steps)
    ours = {**before.ours, **after.ours}
    out.ended = cluster_jobs.end_processes(ours, timeout)
    out.warnings += [f"{p.label()} was left alone: {why}" for p, why in after.doubtful
                     if not (p.pid in ours and ours[p.pid][0].start == p.start)]
    return out


def run_action(action: str, directory: str | os.PathLike | None = None, cpus: int | None = None,
               mem_mb: int = 4096) -> None:
    """``install``, ``start`` (prints the ``export SLURM_CONF=...`` line) or ``stop`` (on stdout the jobs it
    cancelled and one line per process it ended; on stderr a warning for each process that looks like the cluster's
    but cannot be tied to it, and a note for each recorded PID left alone); raises :class:`GacError` for bad
    input."""
    if action == "install":
        install()
    elif action == "start":
        c = start(directory, cpus, mem_mb)
        print(f"export SLURM_CONF={c.conf}")
    else:
        r = stop(directory)
        for line in (*r.cancelled, *r.ended):
            print(line)
        for line in r.warnings:
            print(f"warning: {line}", file=sys.stderr)
        for note in r.notes:
            print(f"note: {note}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gac.launch.local_cluster", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["install", "start", "stop"])
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    ap.add_argument("--cpus", type=int, default=None)
    ap.add_argument("--mem-mb", type=int, default=4096)
    a = ap.parse_args(argv)
    try:
        run_action(a.action, a.dir, a.cpus, a.mem_mb)
    except GacError as e:
        print(f"local_cluster: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
