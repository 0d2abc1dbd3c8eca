"""Step 2 of a job (paper Algorithm 1): the dimension sweep on the job's own device.

:func:`dimension_sweep` returns a profile that covers every target's candidate dims at its own kernel shapes:
it reuses a cached profile measured on the same device and software stack when one covers them, measures what
is missing otherwise (and caches the merged result), or loads an explicit profile (refused when it was
measured on another device, unless ``allow_device_mismatch``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from gac.align.candidates import DEFAULT_UNIT, DEFAULT_WINDOW, rank_candidates
from gac.align.targets import Target
from gac.dtypes import dtype_name, resolve_dtype
from gac.errors import GacError
from gac.hashing import digest
from gac.profiling.device import device_info, resolve_device, stack_key
from gac.profiling.profile import META_FILE, HardwareProfile, load_profile
from gac.profiling.sweeps import context_key, measure_for_targets, target_shape
from gac.profiling.timing import TimingProtocol

log = logging.getLogger(__name__)


def needed_shapes(
    targets: Sequence[Target], unit: int = DEFAULT_UNIT, window: int = DEFAULT_WINDOW
) -> dict[str, set[int]]:
    """context key -> the candidate dims the targets of that context need (rule-based or explicit candidates; a dense
    option runs the model's own kernels and needs no sweep)."""
    need: dict[str, set[int]] = {}
    for t in targets:
        shape = target_shape(t)
        if shape is None:
            continue
        dims = t.candidates if t.candidates is not None else rank_candidates(t, unit, window)
        need.setdefault(context_key(t.kind, shape), set()).update(int(d) for d in dims)
    return need


def _covered(profile: HardwareProfile, need: dict[str, set[int]], tokens: int) -> dict[str, set[int]]:
    """What ``need`` lacks in ``profile`` (at ``tokens`` rows for GEMM contexts)."""
    t = profile.table[profile.table["sweep"] == "target"]
    missing = {}
    for ctx, dims in need.items():
        rows = t[t["context"] == ctx]
        if not ctx.startswith("head_dim:"):
            rows = rows[rows["M"] == tokens]
        have = set(rows["dim"].astype(int))
        if dims - have:
            missing[ctx] = dims - have
    return missing


SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles"


def find_profiles(
    device_name: str, dtype: str | None = None, dirs: Sequence[str | Path] = (SHIPPED_DIR,)
) -> list[Path]:
    """Profile directories under ``dirs`` (one level deep) measured on ``device_name`` (and ``dtype``), newest first."""
    from gac.profiling.profile import normalize_device_name

    found = []
    for root in dirs:
        for meta_file in sorted(Path(root).glob(f"*/{META_FILE}")) if Path(root).is_dir() else []:
            try:
                meta = json.loads(meta_file.read_text())
            except (OSError, ValueError):
                log.warning("skipping unreadable profile %s", meta_file)
                continue
            if normalize_device_name(meta.get("device_name")) != normalize_device_name(device_name):
                continue
            if dtype is not None and meta.get("dtype") != dtype:
                continue
            found.append((str(meta.get("date", "")), meta_file.parent))
    return [p for _, p in sorted(found, reverse=True)]


def cache_name(info: dict, dtype: str) -> str:
    key = "|".join(str(x) for x in stack_key(info)) + f"|{dtype}"
    slug = re.sub(r"[^a-z0-9]+", "-", str(info.get("device_name", "device")).lower()).strip("-")[:40]
    return f"{slug}-{dtype}-{digest(key, 10, 'sha1')}"  # the length and algorithm cached tables were named with


def dimension_sweep(
    targets: Sequence[Target],
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    seq_len: int = 1024,
    batch: int = 1,
    unit: int = DEFAULT_UNIT,
    window: int = DEFAULT_WINDOW,
    cache_dir: str | Path | None = None,
    profile_dir: str | Path | None = None,
    allow_device_mismatch: bool = False,
    protocol: TimingProtocol | None = None,
    measure: bool = True,
    kernel_names: bool | str = "process",
) -> HardwareProfile:
    """A profile holding the targets' kernels at their candidate dims, measured on ``device``.

    ``profile_dir``: use that profile (device-checked) and measure nothing. Otherwise look in ``cache_dir`` for a
    profile of the same device, compute capability, torch, CUDA and dtype; measure the contexts/dims it lacks
    (unless ``measure=False``, which raises if anything is missing) and save the merged profile back.
    ``kernel_names``: by default the kernel names are captured in a child process after the timing, so the job
    that runs this sweep never opens a profiler session before its own latency measurement
    (:mod:`gac.profiling.capture`).
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if profile_dir is not None:
        return load_profile(profile_dir, device=dev, allow_device_mismatch=allow_device_mismatch)
    info = device_info(dev)
    need = needed_shapes(targets, unit, window)
    tokens = batch * seq_len
    cached = None
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / cache_name(info, dtype_name(dt))
        if (path / META_FILE).is_file():
            cached = HardwareProfile.load(path)
            if stack_key(cached.meta) != stack_key(info):  # a hash collision or a hand-copied directory
                log.warning("ignoring cached profile %s: measured on another device/stack", path)
                cached = None
    missing = need if cached is None else _covered(cached, need, tokens)
    if not missing:
        log.info("dimension sweep: reusing cached profile %s (%d contexts)", path, len(need))
        return cached
    if not measure:
        dirs = [SHIPPED_DIR] + ([Path(cache_dir)] if cache_dir is not None else [])
        for found in find_profiles(info["device_name"], dtype_name(dt), dirs):
            prof = HardwareProfile.load(found)
            if prof.sweeps() and prof.sweeps() != ["target"]:
                log.info(
                    "dimension sweep: not measuring; using the sweep profile %s (its rules and cliffs)", found
                )
                return prof
        raise GacError(
            f"no cached or shipped profile for {info['device_name']} covers {len(missing)} target shape(s) "
            f"(e.g. {next(iter(missing))}); allow measuring, pass a profile directory, or measure one with "
            f"python experiments/profile_device.py device={dev.type} out_dir=..."
        )
    sub = [
        t for t in targets if target_shape(t) is not None and context_key(t.kind, target_shape(t)) in missing
    ]
    cands = {t.name: sorted(missing[context_key(t.kind, target_shape(t))]) for t in sub}
    log.info(
        "dimension sweep: measuring %d contexts, %d shapes on %s",
        len(missing),
        sum(len(v) for v in missing.values()),
        info["device_name"],
    )
    fresh = measure_for_targets(sub, cands, dev, dt, seq_len, batch, protocol, kernel_names=kernel_names)
    profile = fresh if cached is None else cached.merged(fresh)
    if path is not None:
        profile.save(path)
    return profile
