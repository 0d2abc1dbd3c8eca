"""Kernel timing: the paper's protocol (CUDA events, 50 warm-up, 200 measured, 3 trials, median).

Every measurement cycles through a pool of *rotating input buffers* whose total size exceeds the
last-level cache (the GPU's L2, the CPU's L3) so that small shapes measure the kernel, not a warm cache.
On CUDA the time between two CUDA events around each trial's loop is used; on a CPU the clock of gac's one rule
(:func:`gac.evaluation.latency.timer_for`: thread CPU time on one torch thread, else the wall clock), so the same
code runs in tests and CI at small sizes. The iteration counts are :data:`gac.evaluation.latency.DEFAULTS`'.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from gac.errors import GacError
from gac.evaluation.latency import CPU_CLOCKS_NS, DEFAULTS, timer_for

log = logging.getLogger(__name__)

_DEFAULT_CPU_CACHE = 32 * 2**20


_KERNEL = DEFAULTS["kernel"]


@contextlib.contextmanager
def cpu_thread_clock():
    """Inside: torch computes on one thread, so CPU timings count this thread's CPU time (the clock rule of
    :func:`gac.evaluation.latency.timer_for`), as ``gac bench`` times a CPU: a shared, loaded machine then slows the
    wall clock, not the numbers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class TimingProtocol:
    """How one kernel shape is timed.

    Args:
        warmup: un-timed iterations before the trials.
        iters: timed iterations per trial (the trial's latency is their mean).
        trials: independent trials; the reported latency is their median.
        flush_bytes: total size of the rotating input buffers; None = twice the last-level cache.
        max_buffers: at most this many input sets rotate (bounds memory for tiny shapes).
    """

    warmup: int = _KERNEL["cuda"][0]
    iters: int = _KERNEL["cuda"][1]
    trials: int = _KERNEL["cuda"][2]
    flush_bytes: int | None = None
    max_buffers: int = 64

    def __post_init__(self):
        for name in ("warmup", "iters", "trials", "max_buffers"):
            v = getattr(self, name)
            lo = 0 if name == "warmup" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise GacError(f"timing protocol: {name} must be an integer >= {lo}, got {v!r}")
        if self.flush_bytes is not None and (not isinstance(self.flush_bytes, int) or self.flush_bytes < 0):
            raise GacError(
                f"timing protocol: flush_bytes must be a non-negative integer or null, got {self.flush_bytes!r}"
            )

    @classmethod
    def paper(cls) -> TimingProtocol:
        """50 warm-up, 200 measured iterations, 3 trials, median (paper §3)."""
        return cls()

    @classmethod
    def quick(cls) -> TimingProtocol:
        """A few iterations and a small buffer pool: for CPU smoke runs and tests, not for numbers."""
        warmup, iters, trials = _KERNEL["cpu"]
        return cls(warmup=warmup, iters=iters, trials=trials, flush_bytes=8 * 2**20, max_buffers=8)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """One timed shape: per-iteration latency in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    trials_ms: tuple[float, ...]
    n_buffers: int


def last_level_cache_bytes(device: torch.device) -> int:
    """The GPU's L2 size, or the CPU's largest cache level (32 MiB if it cannot be read)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        size = int(getattr(props, "L2_cache_size", 0) or 0)
        return size or 50 * 2**20
    best = 0
    try:
        import glob

        for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
            with open(path) as f:
                text = f.read().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        best = 0
    return best or _DEFAULT_CPU_CACHE


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def buffer_count(set_bytes: int, device: torch.device, protocol: TimingProtocol) -> int:
    """How many input sets rotate so that together they exceed the flush size."""
    flush = protocol.flush_bytes if protocol.flush_bytes is not None else 2 * last_level_cache_bytes(device)
    if set_bytes <= 0 or flush <= 0:
        return 1
    return max(1, min(protocol.max_buffers, math.ceil(flush / set_bytes)))


def time_op(
    make_inputs: Callable[[], Sequence[torch.Tensor]],
    fn: Callable[..., object],
    device: torch.device,
    protocol: TimingProtocol,
) -> Timing:
    """Time ``fn(*inputs)`` under ``protocol``, rotating through fresh input sets from ``make_inputs``.

    Exceptions raised by ``fn`` (an SDPA backend that rejects the shape, say) propagate to the caller.
    """
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        return _time_op(make_inputs, fn, device, protocol)


def _time_op(make_inputs, fn, device: torch.device, protocol: TimingProtocol) -> Timing:
    first = tuple(make_inputs())
    n = buffer_count(_nbytes(first), device, protocol)
    sets = [first] + [tuple(make_inputs()) for _ in range(n - 1)]
    fn(*sets[0])  # fail fast on an unsupported shape, before the warm-up
    for i in range(protocol.warmup):
        fn(*sets[i % n])
    synchronize(device)
    trials: list[float] = []
    k = 0
    # events on the stream of the device the inputs live on (time_op made it the current device): on cuda:1 an
    # event recorded on cuda:0's stream would time an idle stream
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    for _ in range(protocol.trials):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(protocol.iters):
                fn(*sets[k % n])
                k += 1
            end.record(stream)
            end.synchronize()
            total_ms = start.elapsed_time(end)
        else:
            synchronize(device)
            clock = CPU_CLOCKS_NS[timer_for(device)]
            t0 = clock()
            for _ in range(protocol.iters):
                fn(*sets[k % n])
                k += 1
            synchronize(device)
            total_ms = (clock() - t0) / 1e6
        trials.append(total_ms / protocol.iters)
    return Timing(
        median_ms=float(statistics.median(trials)),
        min_ms=float(min(trials)),
        max_ms=float(max(trials)),
        trials_ms=tuple(float(t) for t in trials),
        n_buffers=n,
    )
