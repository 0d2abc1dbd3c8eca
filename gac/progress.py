"""Progress of long stages: a bar on a terminal, periodic log lines elsewhere, one line per stage with its time.

    with progress(n_layers, "calibration", unit="layers") as bar:
        for layer in layers:
            ...
            bar.update()

On a terminal (stderr is a tty) this draws a tqdm bar. Anywhere else (a Slurm output file, a pipe, a notebook's
log) it logs a line at most every ``GAC_PROGRESS_INTERVAL`` seconds (default 10)::

    calibration 12/32 layers, ETA 40 s

and, in both cases, one line when the stage ends: ``calibration: 32 layers in 25.3 s``. :func:`stage` gives that
closing line to a stage without a count. ``set_quiet(True)`` (``gac -q``, Hydra ``quiet=true``, or the environment
variable ``GAC_QUIET=1``) silences all of it; errors and warnings are unaffected.

The lines go to the ``gac.progress`` logger at INFO, so they land wherever logging goes (Hydra's job log, the
CLI's stderr) and carry no timing noise into results.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator

log = logging.getLogger("gac.progress")

_quiet: bool | None = None  # None: from the environment (GAC_QUIET)
_lock = threading.Lock()


def set_quiet(quiet: bool = True) -> None:
    """Silence (or restore) progress bars, periodic lines and stage-time lines for this process."""
    global _quiet
    _quiet = bool(quiet)
    os.environ["GAC_QUIET"] = "1" if quiet else "0"  # subprocesses and Slurm jobs started from here inherit it


@contextlib.contextmanager
def quiet_scope(quiet: bool):
    """``set_quiet(quiet)`` for the block, the previous setting (and ``GAC_QUIET``) restored after."""
    global _quiet
    saved, saved_env = _quiet, os.environ.get("GAC_QUIET")
    set_quiet(quiet)
    try:
        yield
    finally:
        _quiet = saved
        if saved_env is None:
            os.environ.pop("GAC_QUIET", None)
        else:
            os.environ["GAC_QUIET"] = saved_env


def is_quiet() -> bool:
    if _quiet is not None:
        return _quiet
    return os.environ.get("GAC_QUIET", "").strip().lower() in ("1", "true", "yes", "on")


def interval_s() -> float:
    """Seconds between two periodic lines off a terminal (``GAC_PROGRESS_INTERVAL``, default 10)."""
    from gac.checks import env_number

    return env_number("GAC_PROGRESS_INTERVAL")


def format_duration(seconds: float) -> str:
    """``4.2`` -> ``"4.2 s"``; ``40.4`` -> ``"40 s"``; ``125`` -> ``"2 min 5 s"``; ``7300`` -> ``"2 h 1 min"``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {(s % 3600) // 60} min"


def progress_line(desc: str, n: int, total: int | None, unit: str, elapsed: float) -> str:
    """One periodic line: ``calibration 12/32 layers, ETA 40 s`` (``12 windows, 3.1 s`` without a total)."""
    u = f" {unit}" if unit else ""
    if total:
        eta = elapsed / n * (total - n) if n > 0 else math.nan
        return f"{desc} {n}/{total}{u}, ETA {format_duration(eta)}"
    return f"{desc} {n}{u}, {format_duration(elapsed)}"


def done_line(desc: str, n: int, unit: str, elapsed: float) -> str:
    """The closing line of a stage: ``calibration: 32 layers in 25.3 s`` (``perplexity: 4.1 s`` without a count)."""
    if n:
        return f"{desc}: {n} {unit + ' ' if unit else ''}in {format_duration(elapsed)}"
    return f"{desc}: {format_duration(elapsed)}"


def _on_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """Counts the steps of one stage; see the module docstring. Use as a context manager (or call :meth:`close`)."""

    def __init__(self, total: int | None, desc: str, unit: str = "", *, stream=None, terminal: bool | None = None,
                 interval: float | None = None, quiet: bool | None = None, clock=time.monotonic):
        self.total = int(total) if total is not None else None
        self.desc, self.unit = desc, unit
        self.n = 0
        self.quiet = is_quiet() if quiet is None else quiet
        self._clock = clock
        self._t0 = clock()
        self._last = self._t0
        self._interval = interval_s() if interval is None else float(interval)
        self._closed = False
        self._bar = None
        stream = sys.stderr if stream is None else stream
        if not self.quiet and (_on_terminal(stream) if terminal is None else terminal):
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=self.total, desc=desc, unit=f" {unit}" if unit else "it", file=stream,
                                 leave=False, dynamic_ncols=True)
            except ImportError:  # no tqdm: periodic lines instead
                self._bar = None

    @property
    def elapsed(self) -> float:
        return self._clock() - self._t0

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = self._clock()
        if now - self._last >= self._interval and (self.total is None or self.n < self.total):
            self._last = now
            log.info(progress_line(self.desc, self.n, self.total, self.unit, now - self._t0))

    def close(self, failed: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if not self.quiet and not failed:
            log.info(done_line(self.desc, self.n, self.unit, self.elapsed))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)


def progress(total: int | None, desc: str, unit: str = "", **kw) -> Progress:
    """A :class:`Progress` for ``total`` steps of stage ``desc`` (``unit``: what a step is, plural)."""
    return Progress(total, desc, unit, **kw)


def track(iterable: Iterable, desc: str, unit: str = "", total: int | None = None, **kw) -> Iterator:
    """Iterate ``iterable`` with progress (``total`` defaults to ``len(iterable)`` when it has one)."""
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with Progress(total, desc, unit, **kw) as bar:
        for x in iterable:
            yield x
            bar.update()


@contextlib.contextmanager
def stage(desc: str):
    """One closing line with the stage's time (``perplexity: 4.1 s``) for a stage without a count."""
    with Progress(None, desc, "", terminal=False, interval=math.inf) as p:
        yield p


_library_bars: bool | None = None  # set by quiet_libraries; None: a terminal and not quiet


def library_bars() -> bool:
    """Whether other libraries (lm-eval) may draw their own progress bars: not quiet, and verbose or a terminal."""
    if is_quiet():
        return False
    return _on_terminal(sys.stderr) if _library_bars is None else _library_bars


def stage_done(desc: str, seconds: float, detail: str = "") -> None:
    """The closing line of a stage timed elsewhere: ``load: 2.1 s`` (``detail`` in parentheses after the name)."""
    if not is_quiet():
        log.info(done_line(f"{desc} ({detail})" if detail else desc, 0, "", seconds))


def quiet_libraries(verbose: bool = False, stream=None) -> None:
    """Keep other libraries' chatter out of gac's output unless ``verbose``: lm-eval's warnings, the profiler's
    ``USDT: profiler_start`` lines, the hub client's one line per HTTP request, and (when quiet, or off a terminal where gac's own lines say the same in one
    line per stage) the progress bars of ``datasets``, ``transformers`` and lm-eval. Call it before those libraries
    are imported (the environment variables are read at import)."""
    global _library_bars
    for name in ("lm_eval", "lm-eval"):  # lm-eval's loggers (every module's is a child of "lm_eval")
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
    for name in ("httpx", "httpx2", "httpcore"):  # the hub client's HTTP stack: one INFO line per request
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    _library_bars = not is_quiet() and (verbose or _on_terminal(sys.stderr if stream is None else stream))
    if verbose:
        return
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # above kineto's highest level (USDT = 5): its lines go
    if not _library_bars:
        os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
        # huggingface_hub reads it at import, and transformers' bars ("Loading weights") follow the hub's switch
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        # tqdm reads this only at its import, and torch imports tqdm (torch.hub): in a job it is usually too late;
        # lm-eval's bars are hidden where gac calls it (gac.evaluation.tasks), transformers' by the calls below
        os.environ["TQDM_DISABLE"] = "1"
        for mod, fn in (("datasets", "disable_progress_bars"), ("huggingface_hub.utils", "disable_progress_bars"),
                        ("transformers.utils.logging", "disable_progress_bar")):
            m = sys.modules.get(mod)
            if m is not None and hasattr(m, fn):
                getattr(m, fn)()
