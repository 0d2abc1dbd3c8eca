"""Small, safe file helpers: atomic JSON writes that never overwrite a result by accident, and their leftovers;
the one rule for a command's output file (:func:`check_output_file`, :func:`write_output`: a device, a pipe or
``/dev/stdout`` is a stream, ``--force`` replaces only a regular file that is not an input, and nothing goes into a
model directory or a results store's own directories); what a path is when it is not a file (:func:`path_kind`);
where gac's Hydra configs live (:func:`conf_dir`). Hashes are :mod:`gac.hashing`; this machine, its processes,
its locks and time stamps are :mod:`gac.machine`; the directories and files gac makes and recognises (a results
store, a checkpoint, a model directory: where outputs do not go) are :mod:`gac.layout`.

Temp files are named ``.<final name>.<host>.<pid>.<random>.tmp`` in the destination's directory and created with
mode ``0o666`` minus the umask (like any file a user creates: colleagues on a shared file system can read results
when the umask lets them). A writer that is killed between writing and publishing leaves such a file behind;
:func:`clean_temp_files` removes the ones whose writer is provably gone (same host, process dead) or that are
older than a bound, and never a file a live writer may still be filling. Beside a user's output (a directory gac
does not own) only that output's own temp names are gac's: nothing else there is ever removed.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.resources
import json
import logging
import math
import os
import re
import secrets
import stat
import sys
import time
from pathlib import Path

from gac.errors import GacError
from gac.layout import owned_directory
from gac.machine import machine_id, pid_alive

log = logging.getLogger(__name__)

_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.(?P<rand>[0-9a-f]{8})\.tmp$")
_LEGACY_RE = re.compile(r"^\..+(\.[A-Za-z0-9_]{8}\.tmp|\.tmp\d+|\.tmp-\d+)$")  # gac <= 0.2 (mkstemp, .tmp<pid>)



def conf_dir() -> Path:
    """The directory of gac's Hydra configs (``config.yaml``, ``model/``, ``compressor/``, ...).

    An installed wheel holds them as the package ``gac.conf`` (the checkout's top-level ``conf/``, mapped into the
    package at build time by ``pyproject.toml``); a source checkout (editable install, ``PYTHONPATH``) reads its
    ``conf/`` beside ``gac/``, the one copy a researcher edits. Hydra's ``--config-dir`` or ``hydra.searchpath``
    adds a directory of one's own on top.
    """
    package = Path(str(importlib.resources.files("gac")))
    for d in (package / "conf", package.parent / "conf"):
        if (d / "config.yaml").is_file():
            return d
    return package.parent / "conf"  # neither: callers name this path when a config is missing


def temp_path(path: str | os.PathLike) -> Path:
    """A unique temp path beside ``path`` that names its writer (machine, pid) for :func:`clean_temp_files`."""
    p = Path(path)
    return p.with_name(f".{p.name}.{machine_id()}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def create_new(path: str | os.PathLike, mode: int = 0o666) -> int:
    """``os.open`` with O_CREAT|O_EXCL: a new file with ``mode`` minus the umask (mkstemp would force 0600)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)


def current_umask() -> int:
    """The process umask, read without changing it (Linux /proc; elsewhere set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: str | os.PathLike) -> None:
    """Give a file that a library created 0600 (safetensors does) the mode a new file gets: 0666 minus the umask."""
    os.chmod(path, 0o666 & ~current_umask())


def os_error(e: OSError, action: str, path: str | os.PathLike) -> GacError:
    """A one-line :class:`GacError` for a failed file operation, with the fix for the usual causes."""
    hint = {
        errno.ENOSPC: "the disk is full: free space there or choose another directory",
        errno.EDQUOT: "the disk quota is exhausted: free space there or choose another directory",
        errno.EROFS: "the file system is read-only: choose a writable directory",
        errno.EACCES: "permission denied: choose a directory you can write to (or fix its permissions)",
        errno.EPERM: "permission denied: choose a directory you can write to (or fix its permissions)",
        errno.EFBIG: "the file is larger than this process may write (ulimit -f): raise the limit",
    }.get(e.errno, "check the path and the disk")
    err = GacError(f"cannot {action} {str(path)!r}: {e.strerror or e}; {hint}")
    err.errno = e.errno  # callers tell a full disk (ENOSPC, EDQUOT) from other failures
    return err


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class SpaceReserve:
    """A little disk space a job holds while it runs (a temp file of ``size`` bytes, blocks allocated), given back
    when it must record how it ended on a full disk: the attempt's outcome and the failure record ("disk full") then
    still have room. The file is named like any temp file, so :func:`clean_temp_files` removes it when its job is
    gone."""

    def __init__(self, directory: str | os.PathLike, name: str, size: int = 256 << 10):
        self.path = temp_path(Path(directory) / name)
        self.size = int(size)
        self.held = False

    def take(self) -> SpaceReserve:
        try:
            fd = create_new(self.path)
            try:
                try:
                    os.posix_fallocate(fd, 0, self.size)
                except (AttributeError, OSError) as e:
                    if getattr(e, "errno", None) in DISK_FULL:
                        raise
                    os.write(fd, b"\0" * self.size)  # a file system without fallocate
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise os_error(e, "reserve space for the job's bookkeeping in", self.path.parent) from None
        self.held = True
        return self

    def release(self) -> None:
        if self.held:
            self.held = False
            with contextlib.suppress(OSError):
                self.path.unlink()


def check_writable(directory: str | os.PathLike, what: str = "directory", probe_bytes: int = 65536) -> Path:
    """Create ``directory`` if needed and prove it can take a file of ``probe_bytes`` (written, fsynced, removed).

    Called before expensive work so a read-only or full disk fails in a second, not after an hour of compute."""
    d = Path(directory).expanduser()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, f"create the {what}", d) from None
    if not d.is_dir():
        raise GacError(f"{what} {str(d)!r} is not a directory")
    probe = temp_path(d / "write-probe")
    try:
        fd = create_new(probe)
        try:
            os.write(fd, b"\0" * probe_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise os_error(e, f"write to the {what}", d) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return d


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def read_json(path: str | os.PathLike, what: str = "file", max_bytes: int | None = None) -> object:
    """Read strict JSON (NaN/Infinity rejected) with errors that name the file and the problem; a file larger than
    ``max_bytes`` is refused before it is read."""
    p = Path(path)
    if not p.exists():
        raise GacError(f"{what} {str(p)!r} {missing_reason(p)}")
    if p.is_dir():
        raise GacError(f"{what} {str(p)!r} is a directory, expected a JSON file")
    if not p.is_file():  # a fifo would block the read forever, a device never ends
        raise GacError(f"{what} {str(p)!r} is not a regular file (a fifo, socket or device), expected a JSON file")
    try:
        if max_bytes is not None and p.stat().st_size > max_bytes:
            raise GacError(f"{what} {str(p)!r} is {p.stat().st_size / 2**20:,.0f} MiB, larger than any such file gac "
                           f"writes ({max_bytes / 2**20:,.0f} MiB)")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise GacError(f"{what} {str(p)!r} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise GacError(f"cannot read {what} {str(p)!r}: {e.strerror or e}") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise GacError(f"{what} {str(p)!r} is not valid JSON: {e}") from None
    except RecursionError:  # Python's parser recurses once per level: a hostile file nests 100k deep
        raise GacError(f"{what} {str(p)!r} nests its JSON deeper than Python parses, which no file gac reads does; "
                       f"replace it with the file it should be") from None


def path_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it is not a regular file or a directory (links followed): ``"a looping symbolic link"``,
    ``"a dangling link (to 'x')"``, ``"a named pipe (fifo)"``, ``"a character device"``, ``"a block device"``,
    ``"a socket"``; ``None`` for a regular file, a directory, or a path that does not exist. The readers name it in
    their one line instead of saying "does not exist" (a looping link) or hanging on it (a pipe, a device)."""
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a looping symbolic link"
        if os.path.islink(p):
            try:
                return f"a dangling link (to {os.readlink(p)!r})"
            except OSError:
                return "a dangling link"
        return None
    mode = st.st_mode
    for test, what in ((stat.S_ISFIFO, "a named pipe (fifo)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


def missing_reason(path: str | os.PathLike) -> str:
    """Why ``path`` cannot be read as a file or directory, as the end of a sentence: ``"does not exist"``, or ``"is
    a looping symbolic link"`` (and the other kinds of :func:`path_kind`)."""
    kind = path_kind(path)
    return f"is {kind}, not a regular file" if kind else "does not exist"


def file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a regular file to read (links followed), as the end of a sentence: ``"does not exist"``,
    ``"is a directory"``, ``"is a looping symbolic link"``, ``"is a named pipe (fifo), not a regular file"``, ...;
    None for a regular file."""
    p = Path(path).expanduser()
    if p.is_file():
        return None
    if p.is_dir():
        return "is a directory"
    return missing_reason(p)


_FD_DIR = re.compile(r"^/proc/(?P<pid>self|thread-self|\d+)(?:/task/\d+)?/fd$")


def _open_fd_link(path: Path) -> int | None:
    """Does ``path``, or a link on its way, name an open file descriptor (``/dev/stdout``, ``/dev/fd/1``,
    ``/proc/self/fd/1``)? Such a path is the stream it points to, not a file to replace. Returns the descriptor's
    number when it is this process's own (written to directly: reopening a file stdout points to would write at
    another offset than stdout's), -1 for another process's, None when ``path`` names no descriptor."""
    cur = Path(os.path.abspath(path))
    for _ in range(40):
        parent = os.path.realpath(cur.parent)
        m = _FD_DIR.match(parent)
        if m:
            own = m["pid"] in ("self", "thread-self", str(os.getpid()))
            return int(cur.name) if own and cur.name.isdigit() else -1
        if not cur.is_symlink():
            return None
        cur = Path(os.path.normpath(os.path.join(parent, os.readlink(cur))))
    return None


def check_not_dash(path: str | os.PathLike, flag: str, what: str) -> None:
    """``-`` as an output path: not stdout where a command writes ``what`` (a file beside its printed summary, a
    directory); it would have made a file named ``-``. One line; ``./-`` names such a file on purpose."""
    if str(path) == "-":
        raise GacError(f"{flag} -: this command writes {what} there, not to stdout (its summary goes to stdout); give "
                       f"a path (./- for a file named '-')")


def check_output_file(path: str | os.PathLike, flag: str = "--json", force: bool = False,
                      inputs: tuple | list = ()) -> str:
    """Where a command writes one file (``-o``, ``--json``, ``--save-allocation``), checked before the work: the
    one rule every command follows. Returns ``"stream"`` for a character device, a named pipe or an open file
    descriptor (``/dev/null``, ``/dev/stdout``): written to as a stream, never replaced; ``"file"`` for a regular
    file path: created, or, with ``force``, an existing regular file replaced (atomically, by a rename). Refused in
    one line: a directory, a dangling or looping link, a block device or a socket, an existing file without
    ``force``, one of the command's ``inputs``, a path inside a model directory or a results store's own
    directories."""
    check_not_dash(path, flag, "a file")
    p = Path(path).expanduser()
    if _open_fd_link(p) is not None:
        return "stream"
    kind = path_kind(p)
    if kind in ("a named pipe (fifo)", "a character device"):
        return "stream"
    if kind is not None:
        if kind.startswith("a dangling link"):
            raise GacError(f"{flag} {str(path)!r} is {kind}; remove it (rm {p}) or choose another path")
        raise GacError(f"{flag} {str(path)!r} is {kind}; gac writes a file, a pipe or a character device there, never "
                       f"{'a disk' if kind == 'a block device' else kind}: choose a file path")
    if p.is_dir():
        raise GacError(f"{flag} {str(path)!r} is a directory; give a file name for the output (e.g. {p / 'out.json'})")
    for i in inputs:
        if i and _same_file(p, Path(i).expanduser()):
            raise GacError(f"{flag} {str(path)!r} is the command's input {str(i)!r}; write the output to another path "
                           f"(--force never replaces an input)")
    owner = owned_directory(p)
    if owner:
        raise GacError(f"{flag} {str(path)!r} {owner}; write the output outside it")
    if (p.exists() or p.is_symlink()) and not force:
        raise GacError(f"{flag} {str(path)!r} already exists; refusing to overwrite it (choose another path or pass "
                       f"--force)")
    check_writable(p.parent if str(p.parent) else ".", f"directory of {flag}", probe_bytes=1)
    return "file"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def json_text(obj: object) -> str:
    """``obj`` as the JSON text gac writes (indented, strict: NaN or inf refused)."""
    return json.dumps(obj, indent=2, sort_keys=False, allow_nan=False, default=_default) + "\n"


def write_output(path: str | os.PathLike, content: object, flag: str = "--json", force: bool = False,
                 inputs: tuple | list = ()) -> Path:
    """Write ``content`` (text, or an object written as JSON) where :func:`check_output_file` allows, checked again
    (the path may have changed during the work): a stream is written to, a regular file created or (``force``)
    replaced atomically. A failed write is a one-line :class:`GacError`."""
    text = content if isinstance(content, str) else json_text(content)
    if check_output_file(path, flag, force, inputs) == "file":
        return write_text_atomic(path, text, overwrite=force)
    p = Path(path).expanduser()
    for s in (sys.stdout, sys.stderr):  # what the command printed comes first on a shared stream
        with contextlib.suppress(Exception):
            s.flush()
    try:
        own = _open_fd_link(p)  # this process's stdout (or another descriptor of it): written at its offset
        fd = os.dup(own) if own is not None and own >= 0 else _open_stream(p, flag)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise os_error(e, "write", p) from None
    return p


def _open_stream(p: Path, flag: str) -> int:
    """A descriptor to append to the device or pipe ``p`` (never created: O_CREAT is not given)."""
    try:  # a named pipe without a reader: say so, then wait for one as the shell's `> fifo` does
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        os.set_blocking(fd, True)
        return fd
    except OSError as e:
        if e.errno != errno.ENXIO:
            raise
    print(f"{flag}: waiting for a reader of the named pipe {str(p)!r}", file=sys.stderr, flush=True)
    return os.open(p, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))


def write_json_atomic(path: str | os.PathLike, obj: object, overwrite: bool = False,
                      faults: tuple[str, str] | None = None) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (temp file + rename in the same directory).

    An existing file is never replaced unless ``overwrite`` is true. A failed write (a full disk, a read-only
    directory) raises a one-line :class:`GacError` and leaves no temp file. ``faults``: the names of the
    :func:`gac.faults.fault_point` between writing the temp file and publishing it, and just after publishing it
    (``("record_write", "record_written")`` for a result record).
    """
    return write_text_atomic(path, json_text(obj), overwrite=overwrite, faults=faults)


def write_text_atomic(path: str | os.PathLike, text: str, overwrite: bool = False,
                      faults: tuple[str, str] | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, as :func:`write_json_atomic` writes JSON.

    With ``overwrite`` the temp file is renamed over ``path``: whatever was there (a file, or a symbolic link to a
    file elsewhere, planted in a shared directory) is replaced, never written through."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise GacError(f"{str(p)!r} already exists; refusing to overwrite it (choose another path)")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, "create the directory of", p) from None
    tmp = temp_path(p)
    try:
        fd = create_new(tmp)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if faults:
            from gac.faults import fault_point

            fault_point(faults[0])
        if not overwrite:
            # link() fails if the destination appeared meanwhile: no race can overwrite a result
            try:
                os.link(tmp, p)
            except FileExistsError:
                raise GacError(f"{str(p)!r} appeared while writing; refusing to overwrite it") from None
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT):
                    raise
                if p.exists():  # file systems without hard links
                    raise GacError(f"{str(p)!r} already exists; refusing to overwrite it") from None
                os.replace(tmp, p)
        else:
            os.replace(tmp, p)
        if faults:
            from gac.faults import fault_point

            fault_point(faults[1])
    except OSError as e:
        raise os_error(e, "write", p) from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        except OSError:  # pragma: no cover - a directory we could write a moment ago
            pass
    return p


def write_marked_block(path: str | os.PathLike, name: str, block: str) -> Path:
    """Put ``block`` between the markers ``<!-- name: begin -->`` and ``<!-- name: end -->`` of the text file
    ``path`` (a results document a script keeps a table in), the rest of the file kept as it is; appended with its
    markers when the file has none (created when missing). Atomic, as :func:`write_text_atomic`."""
    p = Path(path)
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    try:
        text = p.read_text(encoding="utf-8") if p.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        raise GacError(f"cannot read {str(p)!r} to put the {name} table in it ({e})") from None
    new = f"{begin}\n{block.strip()}\n{end}"
    if begin in text and end in text.split(begin, 1)[1]:
        head, rest = text.split(begin, 1)
        text = head + new + rest.split(end, 1)[1]
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + new + "\n"
    return write_text_atomic(p, text, overwrite=True)


def replace_file(path: str | os.PathLike, write) -> Path:
    """Make ``path`` by ``write(tmp)`` (a callable that writes a file at the path it is given: a figure's
    ``savefig``) into a temp file beside it, then rename that over ``path``. Like ``overwrite=True`` in
    :func:`write_text_atomic`: an existing file or link at ``path`` is replaced, never written through, and a
    writer that fails leaves neither a half-written file nor a temp file."""
    p = Path(path)
    tmp = temp_path(p)
    try:
        os.close(create_new(tmp))  # the name is ours (O_EXCL): nothing planted there is followed
        write(tmp)
        os.replace(tmp, p)
    except OSError as e:
        raise os_error(e, "write", p) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return p


def temp_writer_gone(path: str | os.PathLike, max_age_s: float | None = None, now: float | None = None) -> bool:
    """Is ``path`` a gac temp file whose writer is gone (this machine and the pid is dead, or now another process
    that started after the file was written), or one older than ``max_age_s`` (default ``GAC_TEMP_STALE_S``, 6 h;
    legacy names without a pid only by age)?"""
    p = Path(path)
    if max_age_s is None:
        from gac.checks import env_number

        max_age_s = env_number("GAC_TEMP_STALE_S")
    try:
        mtime = p.lstat().st_mtime
    except FileNotFoundError:
        return False
    age = (now or time.time()) - mtime
    m = _TEMP_RE.match(p.name)
    if m:
        if m["host"] == machine_id() and not pid_alive(int(m["pid"]), running_at=mtime):
            return True
        return age > max_age_s
    return bool(_LEGACY_RE.match(p.name)) and age > max_age_s


def clean_temp_files(directory: str | os.PathLike, recursive: bool = False, max_age_s: float | None = None,
                     output: str | None = None) -> list[Path]:
    """Remove the temp files (and temp directories) of writers that are gone in ``directory``; return them.
    ``output``: ``directory`` is not gac's (the folder of a user's output): only the temp names of that output
    (``.<output>.<host>.<pid>.<random>.tmp``, its side files' included) are gac's there; a legacy name may be
    another tool's and is never touched."""
    import shutil

    d = Path(directory)
    removed: list[Path] = []
    if not d.is_dir():
        return removed
    try:
        entries = list(os.scandir(d))
    except OSError:
        return removed
    for e in entries:
        if output is not None:
            ours = e.name.startswith(f".{output}.") and _TEMP_RE.match(e.name) is not None
        else:
            ours = e.name.startswith(".") and (e.name.endswith(".tmp") or _LEGACY_RE.match(e.name) is not None)
        if ours:
            if temp_writer_gone(e.path, max_age_s):
                try:
                    if e.is_dir(follow_symlinks=False):
                        shutil.rmtree(e.path)
                    else:
                        os.unlink(e.path)
                except FileNotFoundError:
                    continue
                except OSError as err:
                    log.warning("could not remove the leftover temp file %s: %s", e.path, err)
                    continue
                removed.append(Path(e.path))
                log.info("removed a leftover temp file of a writer that is gone: %s", e.path)
        elif recursive and e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
            removed += clean_temp_files(e.path, recursive=True, max_age_s=max_age_s, output=output)
    return removed


def _default(o):
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        raise ValueError("non-finite float")
    raise TypeError(f"cannot serialise {type(o).__name__} to JSON")
