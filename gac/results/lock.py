"""Exclusive locks that work on a shared file system (NFS, Lustre, GPFS) between hosts, processes and Slurm jobs.

A lock is a file created with ``O_CREAT | O_EXCL`` (atomic on every POSIX file system, NFSv3 included), holding
who took it: host, pid (and the pid's start time, so a reused pid is not mistaken for the holder), Slurm job /
array / restart ids, the time, and a random token. While held, a daemon thread refreshes the file's mtime every
``heartbeat_s`` seconds (the *heartbeat*).

A lock is **stale** — its holder is provably gone — when

* it was taken on this host and its process is dead (or the pid now belongs to another process);
* it was taken by this very Slurm job in an earlier run (a requeued job restarts under the same job id);
* its heartbeat is older than ``stale_s`` (any host: a node lost, a process killed on another machine).

A stale lock is broken safely: under a short-lived guard file (``<lock>.break``, itself ``O_EXCL``) the breaker
re-reads the lock, checks it is still the stale one it saw (same token), and only then removes it, so two jobs
breaking the same lock at once cannot remove a lock the other has just taken. A holder whose lock was broken
(it was paused longer than ``stale_s``) notices at its next heartbeat: :attr:`FileLock.lost` becomes true.

``GAC_LOCK_HEARTBEAT_S`` and ``GAC_LOCK_STALE_S`` override the defaults (30 s and 300 s).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
import threading
import time
from pathlib import Path

from gac.checks import env_number
from gac.errors import GacError
from gac.io import create_new
from gac.machine import hostname, machine_id, pid_alive, pid_start, utc_stamp

log = logging.getLogger(__name__)

GUARD_STALE_S = 60.0


def same_machine(info: dict) -> bool:
    """Was the lock taken on this host, in this PID namespace (so its pid can be checked here)?"""
    return info.get("machine") == machine_id() and isinstance(info.get("pid"), int)


def holder_info(what: str = "") -> dict:
    """Who is taking a lock now: this process, host and Slurm job."""
    pid = os.getpid()
    t = time.time()
    return {
        "what": what, "host": hostname(), "pid": pid, "pid_start": pid_start(pid), "machine": machine_id(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
        "started": t, "started_iso": utc_stamp(t),
        "token": secrets.token_hex(8),
    }


def read_holder(path: str | os.PathLike) -> dict | None:
    """The lock file's holder record plus ``heartbeat`` (its mtime), or None when there is no lock.

    A lock being created right now may still be empty: it is returned as ``{"heartbeat": mtime}``."""
    p = Path(path)
    if p.is_symlink():  # a job creates its lock as a file (O_EXCL); a link would lend the lock another file's state
        raise GacError(f"the lock {str(p)!r} is a symbolic link (to {os.readlink(p)!r}), not a lock file a job wrote; "
                       f"if no job of this point is running, remove the link (rm {p}) and re-run")
    try:
        st = p.stat()  # one look: a breaker may remove the file between two (is_file after stat says "not a file")
        if stat.S_ISDIR(st.st_mode):
            raise GacError(f"the lock {str(p)!r} is a directory, not a lock file a job wrote; if no job of this point is "
                           f"running, remove it (rm -r {p}) and re-run")
        if not stat.S_ISREG(st.st_mode):  # a fifo would block the read forever, a device never ends
            raise GacError(f"the lock {str(p)!r} is not a regular file (a fifo, socket or device), not a lock file a "
                           f"job wrote; if no job of this point is running, remove it (rm {p}) and re-run")
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise GacError(f"cannot read the lock {str(p)!r}: {e.strerror or e}; if no job of this point is running, remove "
                       f"it (rm {p}) and re-run") from None
    try:
        info = json.loads(text) if text.strip() else {}
        if not isinstance(info, dict):
            info = {}
    except ValueError:
        info = {}
    info["heartbeat"] = st.st_mtime
    return info


def stale_reason(info: dict | None, stale_s: float | None = None, now: float | None = None) -> str | None:
    """Why the holder of a lock is gone, or None when it may still be alive (see the module docstring)."""
    if info is None:
        return "no lock"
    stale_s = env_number("GAC_LOCK_STALE_S") if stale_s is None else stale_s
    now = time.time() if now is None else now
    age = now - float(info.get("heartbeat", now))
    pid = info.get("pid")
    if same_machine(info):
        if not pid_alive(pid, info.get("pid_start")):
            return f"process {pid} on {info['host']} is gone"
        return None  # alive on this host: its heartbeat may lag, the process is the truth
    job = os.environ.get("SLURM_JOB_ID")
    if job and info.get("slurm_job_id") == job and info.get("slurm_restart_count") != os.environ.get(
            "SLURM_RESTART_COUNT"):
        return f"Slurm job {job} was requeued (this is its restart {os.environ.get('SLURM_RESTART_COUNT')})"
    if age > stale_s:
        return f"no heartbeat for {age:.0f} s (> {stale_s:.0f} s)"
    return None


class FileLock:
    """An exclusive lock at ``path`` (see the module docstring). Use :meth:`acquire` / :meth:`release`, or ``with``."""

    def __init__(self, path: str | os.PathLike, what: str = "", heartbeat_s: float | None = None,
                 stale_s: float | None = None):
        self.path = Path(path)
        self.what = what or self.path.stem
        self.heartbeat_s = env_number("GAC_LOCK_HEARTBEAT_S") if heartbeat_s is None else float(heartbeat_s)
        self.stale_s = env_number("GAC_LOCK_STALE_S") if stale_s is None else float(stale_s)
        self.info: dict | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self.info is not None

    def holder(self) -> dict | None:
        return read_holder(self.path)

    def try_acquire(self) -> bool:
        """Take the lock if it is free or stale; True on success. Never waits."""
        if self.held:
            raise GacError(f"lock {self.path} is already held by this object")
        for _ in range(3):
            info = holder_info(self.what)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = create_new(self.path)
            except FileExistsError:
                cur = read_holder(self.path)
                reason = stale_reason(cur, self.stale_s)
                if cur is None:
                    continue  # released meanwhile: try again
                if reason is None:
                    return False
                if not self._break(cur, reason):
                    return False
                continue
            except OSError as e:
                from gac.io import os_error

                raise os_error(e, "create the lock", self.path) from None
            try:
                os.write(fd, json.dumps(info).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            self.info, self.lost = info, False
            self._start_heartbeat()
            return True
        return False

    def acquire(self, timeout: float | None = None, poll_s: float = 0.5, on_wait=None) -> None:
        """Take the lock, waiting while a live holder has it. ``on_wait(holder)`` is called once when waiting
        starts. Raises :class:`GacError` after ``timeout`` seconds (None: wait as long as the holder lives)."""
        t0 = time.monotonic()
        waited = False
        last_log = 0.0
        while not self.try_acquire():
            cur = read_holder(self.path) or {}
            ahead = float(cur.get("heartbeat", 0)) - time.time()
            if ahead > self.stale_s and not same_machine(cur):
                # its age can never pass stale_s: waiting would last until the clocks catch up
                raise GacError(f"{self.what} is locked by {describe_holder(cur)} with a heartbeat {ahead:,.0f} s in "
                               f"the future (this host's clock and that one's, or the file server's, disagree, or "
                               f"the lock was touched by hand); if that job is gone, remove {self.path} and re-run, "
                               f"and check the clocks (NTP)")
            if not waited:
                waited = True
                if on_wait is not None:
                    on_wait(cur)
            if time.monotonic() - last_log > 60:
                last_log = time.monotonic()
                log.info("waiting for %s: held by %s", self.what, describe_holder(cur))
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise GacError(f"{self.what} is held by {describe_holder(cur)} (waited {timeout:.0f} s); wait for "
                               f"it to finish, or remove {self.path} if that job is really gone")
            time.sleep(poll_s)

    def _break(self, seen: dict, reason: str) -> bool:
        guard = self.path.with_name(self.path.name + ".break")
        try:
            fd = create_new(guard)
            os.close(fd)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > GUARD_STALE_S:  # a breaker killed mid-break
                    guard.unlink()
            except FileNotFoundError:
                pass
            return False
        try:
            cur = read_holder(self.path)
            if cur is None:
                return True
            if cur.get("token") != seen.get("token") or stale_reason(cur, self.stale_s) is None:
                return False  # someone else took it meanwhile
            self.path.unlink()
            log.warning("broke the stale lock %s of %s: %s", self.path, describe_holder(cur), reason)
            return True
        except FileNotFoundError:
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                guard.unlink()

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"gac-lock-{self.what}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self.still_mine():
                self.lost = True
                log.error("lost the lock %s: another job broke it (this one was silent for more than %.0f s)",
                          self.path, self.stale_s)
                return
            try:
                now = time.time()
                os.utime(self.path, (now, now))
            except OSError as e:
                log.warning("could not refresh the lock %s: %s", self.path, e)

    def still_mine(self) -> bool:
        info = self.info  # one read: release() on another thread (a heartbeat, a timer) may clear it meanwhile
        if info is None:
            return False
        cur = read_holder(self.path)
        return cur is not None and cur.get("token") == info["token"]

    def release(self) -> None:
        if self.info is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if self.still_mine():
                self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            self.info, self._thread = None, None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def slurm_display_id(info: dict | None) -> str | None:
    """A Slurm job as ``squeue`` shows it: ``ARRAYJOB_TASK`` (``1_0``) for an array task, else the job id."""
    if not info:
        return None
    if info.get("slurm_array_job_id") and info.get("slurm_array_task_id") is not None:
        return f"{info['slurm_array_job_id']}_{info['slurm_array_task_id']}"
    return info.get("slurm_job_id") or None


def describe_holder(info: dict | None) -> str:
    if not info:
        return "a job that is starting"
    sid = slurm_display_id(info)
    slurm = f", Slurm job {sid}" if sid else ""
    since = f" since {info['started_iso']}" if info.get("started_iso") else ""
    return f"{info.get('host', '?')} pid {info.get('pid', '?')}{slurm}{since}"
