"""This machine and its processes: its name (:func:`host`, :func:`hostname`) and PID namespace
(:func:`machine_id`); whether a process is alive and the one meant (:func:`pid_alive`, :func:`pid_start`); the
exclusive lock of one machine (:func:`host_lock`) and the serial CPU lock (:func:`hold_cpu_lock`); and the time as
gac writes and reads it (:func:`utc_stamp`, :func:`parse_stamp`, :data:`TIME_FORMAT`).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path

#: The serial CPU lock: timings on a shared CPU mean something only when one measurement runs at a time, so every
#: benchmark that times something on the CPU holds this ``flock`` while it measures (:func:`hold_cpu_lock`), and any
#: other command takes it from a shell with ``flock /tmp/gac-cpu.lock COMMAND``. ``GAC_CPU_LOCK`` names another path.
CPU_LOCK = os.environ.get("GAC_CPU_LOCK", "/tmp/gac-cpu.lock")
_held_cpu_lock: list = []  # the open lock file: the lock lasts as long as this process


def host_lock(path: str | os.PathLike, on_wait=None) -> int:
    """An exclusive ``flock`` on ``path`` (created if needed), waiting while another process holds it (``on_wait()``
    is called once when it must wait); returns the open descriptor that holds it: closing it releases the lock, and
    the kernel releases it when the process ends, however it ends (SIGKILL included).

    This is the lock of one machine (the CPU lock, a fixture build): ``flock`` is not reliable between hosts on every
    network file system, so what several hosts share (a results store) is locked by :class:`gac.results.lock.FileLock`
    instead, a lock file with its holder and a heartbeat."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold_cpu_lock(enabled: bool = True) -> None:
    """Take :data:`CPU_LOCK` for the rest of this process (:func:`host_lock`), saying so on stderr while another
    holder makes it wait. ``enabled=False`` or already held: nothing. A child process must not call it while its
    parent holds the lock (it would wait for its parent)."""
    if not enabled or _held_cpu_lock:
        return
    fd = host_lock(CPU_LOCK, lambda: print(f"waiting for the CPU lock {CPU_LOCK} (another measurement holds it)",
                                           file=sys.stderr, flush=True))
    _held_cpu_lock.append(fd)  # kept open on purpose: closing it releases the lock


def host() -> str:
    """This machine's name as records, provenance, profiles and event logs write it."""
    return socket.gethostname() or "localhost"


def hostname() -> str:
    """This machine's name as temp files and locks record it: :func:`host` up to its first dot (dots separate the
    fields of a temp file's name)."""
    return host().split(".")[0] or "localhost"


#: how gac writes a time (``created``, provenance ``date``, ``started``...): UTC, to the second, ISO 8601 with ``Z``;
#: text in this form sorts as time does, which "the latest record wins" relies on
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_stamp(t: float | None = None) -> str:
    """The time ``t`` (seconds since the epoch; None: now) as gac writes it (:data:`TIME_FORMAT`)."""
    return time.strftime(TIME_FORMAT, time.gmtime(time.time() if t is None else t))


def file_stamp(t: float | None = None) -> str:
    """The time ``t`` (None: now) in UTC for a file name: ``20250102T030405.123456Z`` (sorts as it happened, whatever
    the machine's time zone)."""
    t = time.time() if t is None else t
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


def parse_stamp(text) -> float | None:
    """Seconds since the epoch of an ISO 8601 date and time (``2025-01-01T00:00:00Z``, ``...+00:00``, no zone: UTC),
    or None when ``text`` is not one. Python 3.10's ``fromisoformat`` refuses the ``Z`` gac writes: read here."""
    import datetime

    if not isinstance(text, str) or len(text) < 19 or text[10] != "T":
        return None
    try:
        t = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=datetime.timezone.utc)).timestamp()


def machine_id() -> str:
    """Host name plus PID namespace: pids are comparable only within one (containers may share a host name)."""
    try:
        ns = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))
    except OSError:
        ns = ""
    return f"{hostname()}-{ns}" if ns else hostname()


def pid_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid from the process meant."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def boot_id() -> str | None:
    """This boot of the machine (Linux): a pid and its :func:`pid_start` name one process only within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch (Linux), or None where it cannot be read."""
    ticks = pid_start(pid)
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(ticks) / os.sysconf("SC_CLK_TCK") if ticks is not None else None
    except (OSError, ValueError, StopIteration):
        return None


def pid_alive(pid: int, start: str | None = None, running_at: float | None = None) -> bool:
    """Whether the process ``pid`` of this machine (and PID namespace) is alive and is the one meant: with ``start``
    (its :func:`pid_start`, as a lock records it) the same start time, with ``running_at`` (a time it is known to
    have been running, e.g. the mtime of a file it wrote) a start before then. A pid reused by another process is
    not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    if start is not None:
        now = pid_start(pid)
        if now is not None and now != start:
            return False
    if running_at is not None:
        began = _started_at(pid)
        if began is not None and began > running_at + 2.0:  # btime has whole seconds; a little clock slack
            return False
    return True
