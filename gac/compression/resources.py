"""Wall time and peak memory per stage: host RSS (sampled and checked against the process high-water mark) and
GPU memory (``torch.cuda.max_memory_allocated``, reset per stage) of the job's GPU and of every other GPU it may use
(a model spread over devices: ``gpu_peaks_mb``, one peak per device).

>>> meter = ResourceMeter("cpu")
>>> with meter.stage("calibration"):
...     ...
>>> meter.timings()     # {"calibration_s": 1.23}
>>> meter.memory()      # {"calibration": {"peak_rss_mb": ..., "start_rss_mb": ..., "end_rss_mb": ..., "cpu_s": ...}}

``cpu_s`` is the process's CPU time (user + system, all threads) during the stage: on a shared machine it is what
the stage cost, while the wall time also counts the time other processes held the cores.

A stage may be entered many times (streaming calibration enters ``calibration``, ``score`` and ``factorize`` once per
decoder layer): its time is the sum, its peak the maximum. Stages nest: an inner stage's samples count for the outer
ones too, and a GPU peak reset for an inner stage first folds the peak so far into every open stage on that device,
of *every* meter (the CUDA peak is one counter per device: a job's ``prepare`` stage holds the meter of
:func:`gac.compression.preparation.prepare` inside it, whose per-stage resets would otherwise leave the outer stage
with its last inner stage's peak only). So an outer stage's GPU peak is the maximum over everything inside it.

Host peak. A daemon thread reads the resident set size (``/proc/self/statm``) every ``interval`` seconds while a stage
is open; at the end of a stage the kernel's high-water mark (``getrusage`` ``ru_maxrss``) is read too: when it rose
during the stage the stage set a new process peak, and that exact value is the stage's peak. So a stage's peak is
exact whenever it is the process's highest so far, and sampled (blind to spikes shorter than ``interval``)
otherwise. Nothing process-wide is reset (the high-water mark stays what other tools expect).

Stages that time kernels (``stage(name, sample=False)``: a job's latency and dimension sweep) pause the sampler
thread while they run, even for the stages around them: a thread waking every 5 ms takes the GIL from the timing
loop (the launch-bound part of a GPU forward) and its own CPU time from a CPU measurement. Their peak is then the
one read at their end plus the high-water mark check (exact whenever they set a new process peak).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
import time
from pathlib import Path

MB = 1024.0 * 1024.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss() -> int:
    """Resident set size of this process in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss() -> int:
    """The process's resident high-water mark in bytes (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    v = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(v) if sys.platform == "darwin" else int(v) * 1024


def _cuda(device) -> int | None:
    """The CUDA device index to account on, or None (CPU jobs, or no CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return dev.index if dev.index is not None else torch.cuda.current_device()


class CudaPeak:
    """The CUDA peak-memory counter of one device (``torch.cuda.max_memory_allocated``), as the meter reads it. A
    test passes an object with the same four members (``key``, ``peak``, ``reset``, ``sync``) instead."""

    def __init__(self, index: int):
        self.index = index
        self.key = ("cuda", index)

    def peak(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(self.index))

    def reset(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.index)

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)


# the open stages of every meter, by peak counter (CudaPeak.key): a reset folds the peak into all of them
_OPEN_GPU: dict = {}
_OPEN_GPU_LOCK = threading.Lock()


def reset_gpu_peak(device) -> None:
    """Reset the CUDA peak counter of ``device`` (a no-op off CUDA) for a measurement of one's own, first folding the
    peak so far into every open meter stage on it (so a stage around the caller still sees its own peak)."""
    idx = _cuda(device)
    if idx is None:
        return
    import torch

    peak = CudaPeak(idx)
    with _OPEN_GPU_LOCK:
        for o in _OPEN_GPU.get(peak.key, ()):
            o.gpu_peaks[peak.key] = max(o.gpu_peaks.get(peak.key, 0), peak.peak())
    torch.cuda.reset_peak_memory_stats(idx)


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Open:
    __slots__ = ("name", "t0", "cpu0", "peak", "gpu_peaks", "start_rss", "hwm0")

    def __init__(self, name: str, start_rss: int, hwm0: int):
        self.name, self.t0, self.cpu0, self.peak = name, time.perf_counter(), cpu_seconds(), start_rss
        self.gpu_peaks: dict = {}  # peak counter key -> bytes
        self.start_rss, self.hwm0 = start_rss, hwm0


def device_label(key) -> str:
    """A peak counter's device as the record names it (``("cuda", 1)`` -> ``cuda:1``)."""
    return f"{key[0]}:{key[1]}" if isinstance(key, tuple) and len(key) == 2 else str(key)


def _other_gpus(index: int | None) -> list:
    """The peak counters of every visible CUDA device but ``index`` (a job's model may be spread over them)."""
    if index is None:
        return []
    import torch

    return [CudaPeak(i) for i in range(torch.cuda.device_count()) if i != index]


class ResourceMeter:
    """Per-stage wall time and peak memory (see the module docstring). ``device``: the job's device; GPU memory is
    accounted when it is a CUDA device, on it and on every other visible CUDA device. ``gpu``: the peak counter to
    read instead (:class:`CudaPeak`'s members; tests); ``others``: the other devices' counters (default: with
    ``gpu`` none, else every other visible CUDA device)."""

    def __init__(self, device: str | None = "cpu", interval: float = 0.005, gpu=None, others=None):
        self.interval = float(interval)
        self.cuda = _cuda(device) if gpu is None else getattr(gpu, "index", 0)
        self.gpu = gpu if gpu is not None else (CudaPeak(self.cuda) if self.cuda is not None else None)
        if others is None:
            others = _other_gpus(self.cuda) if gpu is None else []
        self.gpus = [] if self.gpu is None else [self.gpu, *others]  # the job's device first
        self._open: list[_Open] = []
        self._seconds: dict[str, float] = {}
        self._mem: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._paused = 0  # open stages that asked for no sampling (they time something)
        self.overall_peak = current_rss()

    # -- sampling ------------------------------------------------------------------------------------------------
    def _sample(self) -> None:
        rss = current_rss()
        with self._lock:
            self.overall_peak = max(self.overall_peak, rss)
            for o in self._open:
                if rss > o.peak:
                    o.peak = rss

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self._sample()

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="gac-rss-sampler", daemon=True)
        self._thread.start()

    def _stop_thread(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
        self._stop = self._thread = None

    def _fold_gpu(self) -> None:
        """The peak since the last reset, into every open stage on each device (this meter's and any other's)."""
        for g in self.gpus:
            p = int(g.peak())
            with _OPEN_GPU_LOCK:
                for o in _OPEN_GPU.get(g.key, ()):
                    o.gpu_peaks[g.key] = max(o.gpu_peaks.get(g.key, 0), p)

    def _sync(self) -> None:
        for g in self.gpus:
            g.sync()

    # -- stages --------------------------------------------------------------------------------------------------
    @property
    def sampling(self) -> bool:
        """Whether the sampler thread runs now."""
        return self._thread is not None

    @contextlib.contextmanager
    def stage(self, name: str, sample: bool = True):
        """Time ``name`` and record its peak host (and GPU) memory; repeated entries add up (time) or max (peak).
        ``sample=False``: no sampler thread while it runs (a stage that times something; module docstring)."""
        self._sync()
        self._fold_gpu()
        for g in self.gpus:
            g.reset()
        rss = current_rss()
        o = _Open(name, rss, peak_rss())
        with self._lock:
            self._open.append(o)
        with _OPEN_GPU_LOCK:
            for g in self.gpus:
                _OPEN_GPU.setdefault(g.key, []).append(o)
        if not sample:
            self._paused += 1
            self._stop_thread()
        elif self._thread is None and not self._paused:
            self._start_thread()
        try:
            yield self
        finally:
            self._sync()
            self._sample()
            self._fold_gpu()
            with _OPEN_GPU_LOCK:
                for g in self.gpus:
                    opened = _OPEN_GPU.get(g.key, [])
                    opened[:] = [x for x in opened if x is not o]
                    if not opened:
                        _OPEN_GPU.pop(g.key, None)
            end = current_rss()
            hwm = peak_rss()
            with self._lock:
                self._open.remove(o)
                idle = not self._open
            if not sample:
                self._paused -= 1
            if idle:
                self._stop_thread()
            elif not self._paused and self._thread is None:
                self._start_thread()  # the stages around a paused one sample again
            if hwm > o.hwm0:  # this stage raised the process high-water mark: that value is its exact peak
                o.peak = max(o.peak, hwm)
                self.overall_peak = max(self.overall_peak, hwm)
            self._record(o, end, time.perf_counter() - o.t0)

    def _record(self, o: _Open, end_rss: int, seconds: float) -> None:
        self._seconds[o.name] = self._seconds.get(o.name, 0.0) + seconds
        m = self._mem.get(o.name)
        if m is None:
            m = self._mem[o.name] = {"peak_rss_mb": 0.0, "start_rss_mb": round(o.start_rss / MB, 1), "cpu_s": 0.0}
            if self.gpu is not None:
                m["gpu_peak_mb"] = 0.0
        m["cpu_s"] = round(m["cpu_s"] + cpu_seconds() - o.cpu0, 3)
        m["peak_rss_mb"] = round(max(m["peak_rss_mb"], o.peak / MB), 1)
        m["end_rss_mb"] = round(end_rss / MB, 1)
        if self.gpu is not None:
            m["gpu_peak_mb"] = round(max(m["gpu_peak_mb"], o.gpu_peaks.get(self.gpu.key, 0) / MB), 1)
        if len(self.gpus) > 1:  # one peak per device the job may use (a model spread over them)
            peaks = m.setdefault("gpu_peaks_mb", {})
            for g in self.gpus:
                label = device_label(g.key)
                peaks[label] = round(max(peaks.get(label, 0.0), o.gpu_peaks.get(g.key, 0) / MB), 1)

    def timings(self, suffix: str = "_s") -> dict[str, float]:
        return {f"{k}{suffix}": v for k, v in self._seconds.items()}

    def memory(self) -> dict[str, dict]:
        return {k: dict(v) for k, v in self._mem.items()}

    def peak_mb(self) -> float:
        """The highest RSS seen while any stage was open (exact when a stage raised the process high-water mark)."""
        return round(self.overall_peak / MB, 1)


def device_memory(device: str = "cpu") -> dict:
    """What the job's device holds: ``{"device", "total_mb", "available_mb"}`` (host: MemAvailable and any cgroup
    limit; CUDA: ``torch.cuda.mem_get_info``'s free memory plus what this process's caching allocator holds
    reserved but unused: the driver counts that as used, yet this process's next allocations get it first)."""
    idx = _cuda(device)
    if idx is not None:
        import torch

        free, total = torch.cuda.mem_get_info(idx)
        cached = max(int(torch.cuda.memory_reserved(idx)) - int(torch.cuda.memory_allocated(idx)), 0)
        return {"device": f"cuda:{idx}", "total_mb": total / MB, "available_mb": (free + cached) / MB}
    total = avail = None
    try:
        with open("/proc/meminfo") as f:
            info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f if ":" in ln}
        total, avail = info.get("MemTotal"), info.get("MemAvailable")
    except (OSError, ValueError):
        pass
    limit, left = cgroup_memory()
    if limit is not None:
        total = min(total or limit, limit)
        avail = min(avail if avail is not None else left, left)
    return {"device": "cpu", "total_mb": None if total is None else total / MB,
            "available_mb": None if avail is None else avail / MB}


def _read_int(path: str | os.PathLike) -> int | None:
    try:
        with open(path) as f:
            s = f.read().strip()
        return None if s in ("max", "") else int(s)
    except (OSError, ValueError):
        return None


def cgroup_memory(proc: str | os.PathLike = "/proc", cgroup: str | os.PathLike = "/sys/fs/cgroup"
                  ) -> tuple[int | None, int | None]:
    """The memory limit that binds this process and what is left under it, in bytes (None, None: no limit).

    The process's own cgroup comes from ``/proc/self/cgroup`` (cgroup v2's ``0::PATH`` line, or v1's ``memory``
    controller line), since a Slurm job's limit is set on its job cgroup, not on the root. Every cgroup from that one
    up to the mount's root can hold a limit; the tightest wins: the smallest ``memory.max`` (v1:
    ``memory.limit_in_bytes``) and the smallest limit minus usage. Usage counts the page cache of files the job read
    (a model's weights just loaded: gigabytes), which the kernel reclaims before it kills anything in the cgroup, so
    the file pages on its LRU lists (``memory.stat``'s ``active_file`` + ``inactive_file``; v1's ``total_*``) are
    taken off usage, as the host's MemAvailable takes off the page cache. tmpfs and shared memory are not on those
    lists and stay counted. ``proc`` and ``cgroup``: the roots of /proc and the cgroup mount."""
    limit = left = None
    for d, v2 in _cgroup_dirs(Path(proc), Path(cgroup)):
        if v2:
            lim, used = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        else:
            lim, used = _read_int(d / "memory.limit_in_bytes"), _read_int(d / "memory.usage_in_bytes")
            if lim is not None and lim >= 1 << 60:  # cgroup v1 "unlimited"
                lim = None
        if lim is None:
            continue
        limit = lim if limit is None else min(limit, lim)
        used = max((used or 0) - _page_cache(d, v2), 0)
        rest = max(lim - used, 0)
        left = rest if left is None else min(left, rest)
    return limit, left


def _page_cache(d: Path, v2: bool) -> int:
    """The reclaimable file pages a cgroup's usage includes (0 when its ``memory.stat`` cannot be read)."""
    try:
        stat = dict(ln.split()[:2] for ln in (d / "memory.stat").read_text().splitlines() if len(ln.split()) >= 2)
    except (OSError, ValueError):
        return 0
    names = ("active_file", "inactive_file") if v2 else ("total_active_file", "total_inactive_file")
    if not v2 and not any(n in stat for n in names):  # a v1 kernel without the hierarchical counters
        names = ("active_file", "inactive_file")
    total = 0
    for n in names:
        try:
            total += int(stat.get(n, 0))
        except ValueError:
            continue
    return total


def _cgroup_dirs(proc: Path, cgroup: Path) -> list[tuple[Path, bool]]:
    """This process's memory cgroup directory and its ancestors up to the mount's root, each with whether it is
    cgroup v2. Without a readable ``/proc/self/cgroup``: the mount's root (v2, then v1's memory hierarchy)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    own = None
    for ln in lines:
        parts = ln.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(",") and (cgroup / "memory").is_dir():  # v1 (or hybrid): memory's own tree
            own = (cgroup / "memory", path, False)
            break
        if controllers == "" and own is None:  # v2's unified hierarchy
            own = (cgroup, path, True)
    if own is None:
        return [(cgroup, True), (cgroup / "memory", False)]
    base, path, v2 = own
    parts = [p for p in path.strip("/").split("/") if p and p not in (".", "..")]
    return [(base.joinpath(*parts[:i]), v2) for i in range(len(parts), -1, -1)]
