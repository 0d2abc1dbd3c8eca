"""The jobs of a loopback Slurm cluster, ended when it stops: first through Slurm (every job the cluster's own
controller knows is cancelled, then ``squeue`` is watched a bounded time until none is left), then, after its
daemons stop, every process still running that the cluster started.

A process is the cluster's only on evidence that ties it to this cluster, never by its name:

- a step daemon (its program is ``slurmstepd``) whose environment names this cluster's ``slurm.conf``
  (``SLURM_CONF``) or that holds a socket in this cluster's spool directory;
- a job process that escaped its step (its parent is PID 1 now: Slurm's ``proctrack/linuxproc`` follows parent
  links only) whose environment names this cluster's ``slurm.conf`` and a Slurm job id;
- a descendant of one of those, or of a daemon the cluster recorded (parent links read while they held).

The process that stops the cluster and its ancestors are never the cluster's. A Slurm program (``slurmstepd``,
``srun``, ``salloc``, ``sbatch``) or a process naming this cluster's ``slurm.conf`` and a job that is not tied so is
left alone and named in a warning. Every process is signalled through a pidfd after its start time is checked
again, so a PID taken by another process in between is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gac.machine import pid_start

#: the programs whose processes a warning names when they cannot be tied to the cluster
SLURM_PROGRAMS = ("slurmstepd", "srun", "salloc", "sbatch")
UNREADABLE = "?"  # an environment that cannot be read (another user's process, for a caller who is not root)


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc`` shows it: ``conf`` and ``job`` are its ``SLURM_CONF`` and ``SLURM_JOB_ID`` (None
    when unset, :data:`UNREADABLE` when its environment cannot be read); ``sockets`` the paths of the Unix sockets
    it holds (read for step daemons only)."""
    pid: int
    ppid: int
    start: str
    comm: str
    exe: str | None = None
    conf: str | None = None
    job: str | None = None
    cmdline: str = ""
    sockets: tuple[str, ...] = ()

    def label(self) -> str:
        return f"PID {self.pid} ({(self.cmdline or self.comm)[:60]})"


@dataclass
class Verdict:
    """What :func:`tie` found: the cluster's processes with why each is (``pid -> (Proc, why)``), and the processes
    that look like it but cannot be tied to it, with why not."""
    ours: dict = field(default_factory=dict)
    doubtful: list = field(default_factory=list)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _environ(pid: int) -> tuple[str | None, str | None]:
    raw = _read(f"/proc/{pid}/environ")
    if raw is None:
        return UNREADABLE, UNREADABLE
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    conf, job = env.get(b"SLURM_CONF"), env.get(b"SLURM_JOB_ID")
    return (conf.decode(errors="replace") if conf is not None else None,
            job.decode(errors="replace") if job is not None else None)


def _unix_sockets() -> dict[str, str]:
    """Inode -> path of every bound Unix socket of this network namespace (a deleted path is still shown)."""
    out = {}
    for line in (_read("/proc/net/unix") or b"").decode(errors="replace").splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) == 8:
            out[parts[6]] = parts[7]
    return out


def _held_sockets(pid: int, paths: dict[str, str]) -> tuple[str, ...]:
    held = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in paths:
                    held.append(paths[link[8:-1]])
    return tuple(held)


def process_table(step_programs: frozenset[str]) -> dict[int, Proc]:
    """Every process of this machine (PID namespace) now, read from ``/proc``; the sockets of those whose program is
    in ``step_programs``. A process that ends while it is read is left out."""
    table = {}
    sockets = None
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        stat = _read(f"/proc/{pid}/stat")
        if stat is None:
            continue
        text = stat.decode(errors="replace")
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        if len(fields) < 20 or fields[0] == "Z":  # ended, not yet reaped: nothing left to end
            continue
        exe = None
        with contextlib.suppress(OSError):
            exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        conf, job = _environ(pid)
        if conf not in (None, UNREADABLE) and conf.startswith("/"):
            conf = os.path.normpath(conf)
        cmd = (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
        held = ()
        if exe in step_programs:
            sockets = _unix_sockets() if sockets is None else sockets
            held = _held_sockets(pid, sockets)
        table[pid] = Proc(pid, int(fields[1]), fields[19], head.split("(", 1)[-1], exe, conf, job, cmd, held)
    return table


def _ancestors(table: dict[int, Proc], pid: int) -> set[int]:
    out = set()
    while pid in table and pid not in out:
        out.add(pid)
        pid = table[pid].ppid
    return out


def _under(path: str, folders: tuple[str, ...]) -> bool:
    return any(path.startswith(f.rstrip("/") + "/") for f in folders)


def tie(table: dict[int, Proc], confs: frozenset[str], spools: tuple[str, ...], step_programs: frozenset[str],
        roots: dict[int, str] | None = None, me: int | None = None) -> Verdict:
    """Which processes of ``table`` this cluster started (its ``slurm.conf`` under any of the names ``confs``, its
    spool directory under any of ``spools``), by the rules of this module; ``roots`` are the cluster's live daemons
    (PID -> name: their descendants are the cluster's, they themselves are stopped apart); ``me`` (this process by
    default) and its ancestors are never the cluster's."""
    roots = roots or {}
    mine = _ancestors(table, os.getpid() if me is None else me)
    found: dict[int, str] = {}
    for p in table.values():
        if p.exe in step_programs:
            held = [s for s in p.sockets if _under(s, spools)]
            if p.conf in confs:
                found[p.pid] = f"a step daemon of this cluster (SLURM_CONF={p.conf})"
            elif held:
                found[p.pid] = f"a step daemon of this cluster (its socket {held[0]})"
        elif p.ppid == 1 and p.conf in confs and p.job not in (None, UNREADABLE):
            found[p.pid] = f"a process of job {p.job} of this cluster that left its step (SLURM_CONF={p.conf})"
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    todo = [*found, *roots]
    while todo:
        parent = todo.pop()
        for c in children.get(parent, ()):
            if c not in found and c not in roots:
                name = roots.get(parent) or table[parent].comm
                found[c] = f"started by PID {parent} ({name}) of this cluster"
                todo.append(c)
    v = Verdict()
    for pid, why in found.items():
        if pid not in mine:
            v.ours[pid] = (table[pid], why)
    for p in table.values():
        if p.pid in v.ours or p.pid in mine or p.pid in roots:
            continue
        ours_by_env = p.conf in confs and p.job not in (None, UNREADABLE)
        if not (ours_by_env or p.comm in SLURM_PROGRAMS or p.exe in step_programs):
            continue
        if p.conf == UNREADABLE:
            why = "its environment cannot be read, so nothing ties it to this cluster"
        elif ours_by_env:
            parent = table.get(p.ppid)
            why = (f"it names this cluster's slurm.conf and job {p.job}, but its parent PID {p.ppid} "
                   f"({parent.comm if parent else 'gone'}) is no process of this cluster")
        elif p.conf is None:
            why = "no SLURM_CONF in its environment ties it to this cluster"
        else:
            why = f"it belongs to another cluster (SLURM_CONF={p.conf})"
        v.doubtful.append((p, why))
    return v


def ended(pid: int) -> bool:
    """Whether ``pid`` has ended and waits to be reaped (a zombie): nothing is left to signal."""
    stat = _read(f"/proc/{pid}/stat")
    return stat is not None and stat.decode(errors="replace").rpartition(")")[2].split()[:1] == ["Z"]


def _same(p: Proc) -> bool:
    """Whether ``p`` is still running as the process it was (its PID, the same start time, not ended)."""
    return pid_start(p.pid) == p.start and not ended(p.pid)


def signal_if(pid: int, sig: int, still_it) -> bool:
    """Send ``sig`` to ``pid`` only while ``still_it()`` holds (checked through a pidfd where the kernel has them,
    so the PID cannot be reused between the check and the signal). True when it was sent."""
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        pass
    try:
        if not still_it():
            return False
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def end_processes(procs: dict[int, tuple[Proc, str]], timeout: float) -> list[str]:
    """SIGTERM each process of ``procs`` still running as itself, SIGKILL those left after ``timeout``; one line per
    process this ended (a process that ended by itself first gets none)."""
    sent = {pid: (p, why) for pid, (p, why) in procs.items() if signal_if(pid, signal.SIGTERM, lambda p=p: _same(p))}
    end = time.time() + timeout
    while time.time() < end and any(_same(p) for p, _ in sent.values()):
        time.sleep(0.1)
    lines = []
    for pid, (p, why) in sent.items():
        killed = signal_if(pid, signal.SIGKILL, lambda p=p: _same(p))
        with contextlib.suppress(ChildProcessError, OSError):  # a child of this process: reap it
            os.waitpid(pid, os.WNOHANG if not killed else 0)
        how = f"SIGKILL after {timeout:.0f} s" if killed else "SIGTERM"
        lines.append(f"ended {p.label()} ({how}): {why}")
    return lines


def _queue(env: dict) -> list[str] | None:
    """The jobs the cluster's controller holds (pending, running or completing), as ``squeue`` names them; None when
    it does not answer."""
    try:
        r = subprocess.run(["squeue", "-h", "-o", "%F"], capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return sorted({w for w in r.stdout.split() if w.isdigit()}, key=int)


def cancel_jobs(env: dict, wait: float) -> tuple[list[str], list[str]]:
    """Cancel every job of the cluster whose clients ``env`` configures (``SLURM_CONF``: call this only while that
    cluster's own controller is the one running), then wait up to ``wait`` seconds until ``squeue`` shows none.
    Returns the line saying what was cancelled, and a warning when Slurm did not answer or jobs are left."""
    jobs = _queue(env)
    if jobs is None:
        return [], ["squeue did not answer: no job was cancelled through Slurm; the cluster's processes are ended "
                    "after its daemons stop"]
    if not jobs:
        return [], []
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=10, env=env)
    done = [f"cancelled {len(jobs)} job(s) of this cluster: {', '.join(jobs)}"]
    end = time.time() + wait
    left = jobs
    while time.time() < end:
        left = _queue(env)
        if left == []:
            return done, []
        time.sleep(0.5)
    return done, [f"job(s) {', '.join(left or jobs)} still in squeue after {wait:.0f} s; their processes are ended "
                  f"after the daemons stop"]


def names(d: Path) -> tuple[frozenset[str], tuple[str, ...]]:
    """The names of the cluster directory ``d``'s ``slurm.conf`` and spool directory as a process may hold them (the
    path as given and as resolved): the ``confs`` and ``spools`` of :func:`tie`."""
    spool, conf = d / "spool", d / "slurm.conf"
    return frozenset({str(conf), os.path.realpath(conf)}), tuple({str(spool), os.path.realpath(spool)})
