"""Latency tables from a measured profile: target -> {candidate dim: ms}, the costs of a latency-budget plan.

A target's latency at dimension d is the time of its own kernels at d, measured at the job's token count on the job's
device (:func:`gac.profiling.measure_for_targets`: the ``sweep="target"`` rows of the target's kernel context):

==============  ===========================================================================================
kind            kernels timed at d (``T = batch * seq_len`` tokens)
==============  ===========================================================================================
``lowrank``     ``x[T, in] @ B[d, in]^T`` then ``h[T, d] @ A[out, d]^T``; the dense option (d = min(out, in)):
                ``x[T, in] @ W[out, in]^T``, measured by :func:`measure_dense` (``context="dense:in=..,out=.."``)
``width``       gate and up ``x[T, hidden] @ W[d, hidden]^T``, their product, down ``h[T, d] @ W[hidden, d]^T``
``head_dim``    scaled-dot-product attention over ``(batch, heads, seq_len, d)``
==============  ===========================================================================================

Targets that share a kernel context (every ``q_proj`` of a model) share one measurement per dimension; each target
then counts it once, since each runs its own kernels. Where the device is busy (a prefill on a GPU, any forward on a
CPU) the kernels of a forward run one after another, so the targets' latencies add up: the latency-budget solver
(:mod:`gac.align.latency_budget`) sums them. A target of kind ``generic`` has no known kernels: give its latencies
yourself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from gac.align.targets import Target
from gac.dtypes import dtype_name, resolve_dtype
from gac.errors import GacError
from gac.profiling.device import device_info, resolve_device
from gac.profiling.kernels import kernel_tier
from gac.profiling.profile import COLUMNS, HardwareProfile, empty_table
from gac.profiling.sweeps import context_key, measure_for_targets, target_shape
from gac.profiling.timing import TimingProtocol, time_op

log = logging.getLogger(__name__)


def dense_context(target: Target) -> str | None:
    """The kernel context of a low-rank target's dense option (``"dense:in=..,out=.."``), or None without one."""
    if not target.has_dense:
        return None
    if target.shape is not None:
        out, inp = target.shape
    else:
        shape = target_shape(target)
        inp, out = shape["in"], shape["out"]
    return context_key("dense", {"in": int(inp), "out": int(out)})


def _rows(profile: HardwareProfile, context: str, batch: int, seq_len: int) -> pd.DataFrame:
    t = profile.table
    t = t[(t["sweep"] == "target") & (t["context"] == context) & (t["backend"] == "auto")]
    t = t[t["supported"].fillna(True).astype(bool) & t["latency_ms"].notna()]
    if context.startswith("head_dim:"):
        return t[(t["batch"] == batch) & (t["seq_len"] == seq_len)]
    return t[t["M"] == batch * seq_len]


def profile_latency_tables(
    profile: HardwareProfile,
    targets: Sequence[Target],
    cands: Sequence[Sequence[int]],
    batch: int = 1,
    seq_len: int = 1024,
) -> dict[str, dict[int, float]]:
    """``{target name: {dim: ms}}`` for every candidate of every target, read from ``profile``'s target rows measured
    at ``batch * seq_len`` tokens (the median over repeated measurements of a dim).

    Raises :class:`GacError` naming the contexts and dims the profile lacks, and how to measure them.
    """
    if batch < 1 or seq_len < 1:
        raise GacError(f"batch and seq_len must be positive, got batch={batch} seq_len={seq_len}")
    curves: dict[str, dict[int, float]] = {}
    tables: dict[str, dict[int, float]] = {}
    missing: dict[str, set[int]] = {}
    for t, cs in zip(targets, cands):
        shape = target_shape(t)
        if shape is None:
            raise GacError(f"target {t.name!r} has kind {t.kind!r}: no kernels are known for it, so no latency can be "
                           f"measured; give its latencies in the table yourself or give it a kernel kind")
        row = {}
        for d in cs:
            ctx = dense_context(t) if t.is_dense(d) else context_key(t.kind, shape)
            if ctx not in curves:
                rows = _rows(profile, ctx, batch, seq_len)
                curves[ctx] = rows.groupby(rows["dim"].astype("int64"))["latency_ms"].median().to_dict()
            ms = curves[ctx].get(int(d))  # a dense option's row has dim = min(out, in), the dense weight's rank
            if ms is None:
                missing.setdefault(ctx, set()).add(int(d))
            else:
                row[int(d)] = float(ms)
        tables[t.name] = row
    if missing:
        some = "; ".join(f"{ctx} at {sorted(ds)[:8]}" for ctx, ds in sorted(missing.items())[:4])
        more = f" and {len(missing) - 4} more contexts" if len(missing) > 4 else ""
        raise GacError(f"the profile {profile.device_name!r} lacks latencies at {batch * seq_len} tokens for {some}{more}; "
                       f"measure them on this device with gac.profiling.latency_tables.measure_latency_tables (or "
                       f"dimension_sweep with the same unit, window, batch and seq_len, and measure_dense for dense "
                       f"options)")
    return tables


def measure_dense(
    targets: Sequence[Target],
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    seq_len: int = 1024,
    batch: int = 1,
    protocol: TimingProtocol | None = None,
) -> HardwareProfile:
    """Time the dense weight ``x[T, in] @ W[out, in]^T`` of every low-rank target with a dense option (one
    measurement per shape), as ``sweep="target"`` rows of context :func:`dense_context` with ``dim = min(out, in)``."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    protocol = protocol or (TimingProtocol.paper() if dev.type == "cuda" else TimingProtocol.quick())
    tokens = batch * seq_len
    shapes = {}
    for t in targets:
        ctx = dense_context(t)
        if ctx is not None:
            shapes[ctx] = (t.dense_dim, *_in_out(ctx))
    rows = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for ctx, (dim, inp, out) in sorted(shapes.items()):
            def make(inp=inp, out=out):
                return (torch.randn(tokens, inp, device=dev, dtype=dt), torch.randn(out, inp, device=dev, dtype=dt))

            timing = time_op(make, F.linear, dev, protocol)
            row = {c: None for c in COLUMNS}
            row.update(sweep="target", op="dense", axis="d", dim=dim, M=tokens, N=out, K=inp, batch=batch,
                       seq_len=seq_len, dtype=dtype_name(dt), backend="auto", selected_backend="", supported=True,
                       latency_ms=timing.median_ms, latency_min_ms=timing.min_ms, latency_max_ms=timing.max_ms,
                       tflops=2.0 * tokens * inp * out / (timing.median_ms * 1e-3) / 1e12, kernel="",
                       tier=kernel_tier(None), context=ctx)
            rows.append(row)
    meta = dict(device_info(dev), dtype=dtype_name(dt), protocol=protocol.to_dict(), kind="targets",
                plan={"seq_len": seq_len, "batch": batch})
    return HardwareProfile(pd.DataFrame(rows, columns=COLUMNS) if rows else empty_table(), meta)


def _in_out(ctx: str) -> tuple[int, int]:
    parts = dict(p.split("=") for p in ctx.split(":", 1)[1].split(","))
    return int(parts["in"]), int(parts["out"])


def measure_latency_tables(
    targets: Sequence[Target],
    cands: Sequence[Sequence[int]],
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    seq_len: int = 1024,
    batch: int = 1,
    protocol: TimingProtocol | None = None,
    profile: HardwareProfile | None = None,
) -> tuple[dict[str, dict[int, float]], HardwareProfile]:
    """Measure what ``profile`` (if any) lacks of the targets' candidate kernels on ``device`` and return the tables
    with the merged profile (to cache or save). Kernel names are not captured (the tables need times only)."""
    dev = resolve_device(device)
    have = profile
    ranks = [[d for d in cs if not t.is_dense(d)] for t, cs in zip(targets, cands)]
    need_t, need_c = [], []
    for t, rs in zip(targets, ranks):
        if target_shape(t) is None or not rs:
            continue
        if have is not None:
            curve = _rows(have, context_key(t.kind, target_shape(t)), batch, seq_len)
            rs = sorted(set(rs) - set(curve["dim"].astype(int)))
        if rs:
            need_t.append(t)
            need_c.append(rs)
    fresh = []
    if need_t:
        fresh.append(measure_for_targets(need_t, need_c, dev, dtype, seq_len, batch, protocol, kernel_names=False))
    dense = [t for t, cs in zip(targets, cands) if any(t.is_dense(d) for d in cs)]
    if have is not None:
        dense = [t for t in dense if not len(_rows(have, dense_context(t), batch, seq_len))]
    if dense:
        fresh.append(measure_dense(dense, dev, dtype, seq_len, batch, protocol))
    for p in fresh:
        have = p if have is None else have.merged(p)
    if have is None:  # nothing to measure and nothing given: only targets without candidates
        have = HardwareProfile(empty_table(), dict(device_info(dev)))
    return profile_latency_tables(have, targets, cands, batch, seq_len), have
