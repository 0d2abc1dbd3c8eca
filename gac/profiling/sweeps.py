"""Dimension sweeps over the kernels compression touches (paper §3 and §4.2 Step 2).

=================  ==========================================  =============================================
sweep              kernel                                      swept (others fixed)
=================  ==========================================  =============================================
``sdpa_head_dim``  ``scaled_dot_product_attention``            head_dim d (B, S, H fixed); auto + each backend
``gemm_M``         ``F.linear(x[M,K], W[N,K])``                M from 50% to 100% of its full size
``gemm_N``         same                                        N from 50% to 100%
``gemm_K``         same                                        K from 50% to 100%
``gemm_tput_K``    same, M = N = K = center                    K in center +/- radius (stride 1), as TFLOPS
``gemm_tput_N``    same                                        N in center +/- radius
``gemv_K``         ``F.linear(x[1,K], W[N,K])`` (M = 1)        K in center +/- radius
``gemv_N``         same                                        N in center +/- radius
=================  ==========================================  =============================================

GEMMs use the ``nn.Linear`` layout (``x @ W^T``, W stored ``[N, K]`` row-major) because that is what a
compressed model runs. SDPA inputs are allocated ``(B, S, H, d)`` and transposed to ``(B, H, S, d)`` as in
Hugging Face attention, so a misaligned ``d`` also misaligns the head stride — as it does in a real model.
Every row records the latency (median of the trials), the kernel that ran where the profiler can see it, and
for SDPA the backend PyTorch picked plus each backend's latency where that backend accepts the shape.

Kernel names are captured *after every shape is timed* (``kernel_names=True``: in this process, once the sweep's
timing is done; ``"process"``: in a child process, so this process never opens a profiler session at all). A
``torch.profiler`` session with CUDA activities leaves CUPTI attached after it closes (torch 2.5-2.9; pytorch issue
144455: 10-20% slower kernels afterwards), so a capture between two timings would slow every later one: the first
shapes of a sweep would be timed clean and the rest with CUPTI attached, and in a job, the latency measured after
a dimension sweep would pay for it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
import torch
import torch.nn.functional as F

from gac.align.targets import Target
from gac.dtypes import dtype_name, resolve_dtype
from gac.errors import GacError
from gac.profiling.device import device_info, resolve_device
from gac.profiling.kernels import (
    available_sdpa_backends,
    gemm_aligned,
    kernel_tier,
    main_kernel,
    sdpa_with_backend,
    selected_sdpa_backend,
)
from gac.profiling.profile import COLUMNS, HardwareProfile, empty_table
from gac.profiling.timing import TimingProtocol, time_op

log = logging.getLogger(__name__)

KERNEL_NAME_MODES = (True, False, "process")  # in this process after all timing / none / in a child process

SWEEPS = ("sdpa", "gemm", "tput", "gemv")
GEMM_AXES = ("M", "N", "K")


@dataclass(frozen=True)
class SweepPlan:
    """Sizes of the sweeps. :meth:`paper` is the paper's setting; :meth:`quick` a CPU smoke size."""

    sweeps: tuple[str, ...] = SWEEPS
    sdpa_dims: tuple[int, ...] = tuple(range(64, 257))
    sdpa_batch: int = 4
    sdpa_seq_len: int = 2048
    sdpa_heads: int = 32
    sdpa_backends: bool = True
    is_causal: bool = False
    gemm_M: int = 2048
    gemm_N: int = 2048
    gemm_K: int = 128
    gemm_axes: tuple[str, ...] = GEMM_AXES
    gemm_low: float = 0.5
    gemm_step: int = 1
    tput_center: int = 4096
    tput_radius: int = 64
    gemv_center: int = 4096
    gemv_radius: int = 64
    kernel_names: bool | str = True  # True: captured after all timing, in this process; "process": in a child

    def __post_init__(self):
        unknown = set(self.sweeps) - set(SWEEPS)
        if unknown:
            raise GacError(f"unknown sweep(s) {sorted(unknown)}; known: {', '.join(SWEEPS)}")
        bad = set(self.gemm_axes) - set(GEMM_AXES)
        if bad:
            raise GacError(f"unknown GEMM axis {sorted(bad)}; use M, N and/or K")
        if not self.sdpa_dims or min(self.sdpa_dims) < 1:
            raise GacError(f"sdpa_dims must be positive head dimensions, got {self.sdpa_dims!r}")
        for name in (
            "sdpa_batch",
            "sdpa_seq_len",
            "sdpa_heads",
            "gemm_M",
            "gemm_N",
            "gemm_K",
            "gemm_step",
            "tput_center",
            "gemv_center",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise GacError(f"sweep plan: {name} must be a positive integer, got {v!r}")
        for name in ("tput_radius", "gemv_radius"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0 or v >= min(self.tput_center, self.gemv_center):
                raise GacError(f"sweep plan: {name} must be in [0, center), got {v!r}")
        if self.kernel_names not in KERNEL_NAME_MODES:
            raise GacError(f"sweep plan: kernel_names must be true, false or 'process', got {self.kernel_names!r}")
        if not 0 < self.gemm_low <= 1:
            raise GacError(
                f"sweep plan: gemm_low must be in (0, 1] (the sweep starts at that fraction), got {self.gemm_low}"
            )

    @classmethod
    def paper(cls, **overrides) -> SweepPlan:
        """B=4, S=2048, H=32, d=64..256; M=N=2048, K=128 swept from 50%; near-4096 stride-1 sweeps."""
        return replace(cls(), **overrides)

    @classmethod
    def quick(cls, **overrides) -> SweepPlan:
        """Small shapes that run in seconds on a CPU (tests, CI, a smoke run); not for conclusions."""
        base = cls(
            sdpa_dims=tuple(range(60, 77)),
            sdpa_batch=1,
            sdpa_seq_len=128,
            sdpa_heads=4,
            gemm_M=128,
            gemm_N=128,
            gemm_K=64,
            gemm_low=0.75,
            tput_center=256,
            tput_radius=8,
            gemv_center=512,
            gemv_radius=8,
        )
        return replace(base, **overrides)

    def gemm_range(self, axis: str) -> list[int]:
        full = {"M": self.gemm_M, "N": self.gemm_N, "K": self.gemm_K}[axis]
        lo = max(1, math.ceil(self.gemm_low * full))
        return list(range(lo, full + 1, self.gemm_step)) + ([full] if (full - lo) % self.gemm_step else [])

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass
class _Ctx:
    device: torch.device
    dtype: torch.dtype
    protocol: TimingProtocol | None
    kernel_names: bool | str
    rows: list = field(default_factory=list)
    pending: list = field(default_factory=list)  # (row, op spec): kernel names to capture once all timing is done

    def want_kernel(self, row: dict, spec: dict) -> None:
        if self.kernel_names:
            self.pending.append((row, spec))


def _randn(shape, ctx: _Ctx) -> torch.Tensor:
    return torch.randn(*shape, device=ctx.device, dtype=ctx.dtype)


def op_of(spec: Mapping, ctx: _Ctx):
    """``(make_inputs, fn)`` of one op spec (what a row measured; JSON-able, so a child process can rebuild it):
    ``{"op": "linear", M, N, K}``, ``{"op": "sdpa", batch, seq_len, heads, d, is_causal}`` or a target's
    ``{"op": "lowrank" | "width" | "head_dim", shape, d, tokens, batch, seq_len}``."""
    op = spec["op"]
    if op == "linear":
        M, N, K = int(spec["M"]), int(spec["N"]), int(spec["K"])
        return (lambda: (_randn((M, K), ctx), _randn((N, K), ctx))), F.linear
    if op == "sdpa":
        b, s_, h, d = (int(spec[k]) for k in ("batch", "seq_len", "heads", "d"))
        return ((lambda: tuple(_randn((b, s_, h, d), ctx).transpose(1, 2) for _ in range(3))),
                sdpa_with_backend(None, bool(spec.get("is_causal", False))))
    make, fn, _ = _target_op(op, spec["shape"], int(spec["d"]), int(spec["tokens"]), int(spec["batch"]),
                             int(spec["seq_len"]), ctx)
    return make, fn


def capture_kernel_names(specs: Sequence[Mapping], device: torch.device, dtype: torch.dtype) -> list[str | None]:
    """The longest kernel of each op spec, each run once under ``torch.profiler`` in this process."""
    ctx = _Ctx(device, dtype, None, False)
    out = []
    with torch.inference_mode():
        for spec in specs:
            make, fn = op_of(spec, ctx)
            out.append(main_kernel(fn, make(), device))
    return out


def _capture_pending(ctx: _Ctx) -> None:
    """Fill the kernel (and, for GEMMs, the tier) of every row that asked for one: after all timing (module doc)."""
    if not ctx.pending:
        return
    specs = [spec for _, spec in ctx.pending]
    if ctx.kernel_names == "process":
        from gac.profiling.capture import capture_in_child

        names = capture_in_child(specs, ctx.device, ctx.dtype)
    else:
        names = capture_kernel_names(specs, ctx.device, ctx.dtype)
    cc = torch.cuda.get_device_capability(ctx.device) if ctx.device.type == "cuda" else None
    for (row, spec), name in zip(ctx.pending, names, strict=True):
        row["kernel"] = name or ""
        if spec["op"] != "sdpa":  # an SDPA row's tier is the backend the dispatcher picked
            aligned = gemm_aligned(spec["K"], spec["N"], ctx.dtype.itemsize) if "K" in spec and "N" in spec else None
            row["tier"] = kernel_tier(name, cc, aligned)  # an older generation's kernel on a misaligned GEMM: "fallback"
    log.info("kernel names of %d shapes captured after timing (%s)", len(specs),
             "in a child process" if ctx.kernel_names == "process" else "in this process")
    ctx.pending.clear()


def _row(**kw) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(kw)
    return row


def _timed_row(common: Mapping, timing, flops: float, kernel: str | None, tier: str, **kw) -> dict:
    """The one row builder of every timed op (GEMM, GEMV, SDPA auto or forced, a target's kernels): ``common``
    (sweep, op, axis, dim, shape, dtype, context), the timing (median/min/max ms), TFLOPS from ``flops``."""
    return _row(**common, **kw, supported=True, latency_ms=timing.median_ms, latency_min_ms=timing.min_ms,
                latency_max_ms=timing.max_ms, tflops=flops / (timing.median_ms * 1e-3) / 1e12, kernel=kernel or "",
                tier=tier)


def _gemm_row(
    ctx: _Ctx, sweep: str, op: str, axis: str, dim: int, M: int, N: int, K: int, context: str = ""
) -> dict:
    def make():
        return (_randn((M, K), ctx), _randn((N, K), ctx))

    timing = time_op(make, F.linear, ctx.device, ctx.protocol)
    common = dict(sweep=sweep, op=op, axis=axis, dim=dim, M=M, N=N, K=K, dtype=dtype_name(ctx.dtype),
                  context=context)
    row = _timed_row(common, timing, 2.0 * M * N * K, None, kernel_tier(None), backend="auto", selected_backend="")
    ctx.want_kernel(row, {"op": "linear", "M": M, "N": N, "K": K})
    return row


def sweep_gemm(
    axis: str,
    values: Sequence[int],
    M: int,
    N: int,
    K: int,
    ctx: _Ctx,
    sweep: str | None = None,
    op: str = "gemm",
) -> list[dict]:
    """Time ``F.linear`` with ``axis`` taking each of ``values`` and the other two dims fixed."""
    sweep = sweep or f"{op}_{axis}"
    rows = []
    for v in values:
        shape = {"M": M, "N": N, "K": K, axis: int(v)}
        rows.append(_gemm_row(ctx, sweep, op, axis, int(v), shape["M"], shape["N"], shape["K"]))
    log.info("%s: %d shapes, %s=%d..%d", sweep, len(rows), axis, min(values), max(values))
    return rows


def _sdpa_rows(
    ctx: _Ctx,
    sweep: str,
    d: int,
    batch: int,
    seq_len: int,
    heads: int,
    backends: Sequence[str],
    is_causal: bool,
    context: str = "",
) -> list[dict]:
    def make():
        return tuple(_randn((batch, seq_len, heads, d), ctx).transpose(1, 2) for _ in range(3))

    flops = 4.0 * batch * heads * seq_len * seq_len * d * (0.5 if is_causal else 1.0)
    common = dict(
        sweep=sweep,
        op="sdpa",
        axis="head_dim",
        dim=d,
        batch=batch,
        seq_len=seq_len,
        heads=heads,
        head_dim=d,
        dtype=dtype_name(ctx.dtype),
        context=context,
    )
    q, k, v = make()
    chosen = selected_sdpa_backend(q, k, v, is_causal)
    rows = []
    auto = sdpa_with_backend(None, is_causal)
    try:
        t = time_op(make, auto, ctx.device, ctx.protocol)
        rows.append(_timed_row(common, t, flops, None, chosen, backend="auto", selected_backend=chosen))
        ctx.want_kernel(rows[-1], {"op": "sdpa", "batch": batch, "seq_len": seq_len, "heads": heads, "d": d,
                                   "is_causal": is_causal})
    except RuntimeError as e:
        log.warning("SDPA d=%d failed with PyTorch's default dispatch: %s", d, str(e).splitlines()[0])
        rows.append(
            _row(**common, backend="auto", selected_backend=chosen, supported=False, kernel="", tier=chosen)
        )
    del q, k, v
    for b in backends:
        fn = sdpa_with_backend(b, is_causal)
        try:
            t = time_op(make, fn, ctx.device, ctx.protocol)
        except RuntimeError:
            rows.append(_row(**common, backend=b, selected_backend=b, supported=False, kernel="", tier=b))
            continue
        rows.append(_timed_row(common, t, flops, "", b, backend=b, selected_backend=b))
    return rows


def sweep_sdpa(
    dims: Sequence[int],
    batch: int,
    seq_len: int,
    heads: int,
    ctx: _Ctx,
    backends: bool = True,
    is_causal: bool = False,
    sweep: str = "sdpa_head_dim",
) -> list[dict]:
    """Time SDPA per head dimension with PyTorch's own dispatch and, if ``backends``, each backend forced."""
    names = available_sdpa_backends(ctx.device) if backends else ()
    rows = []
    for d in dims:
        rows.extend(_sdpa_rows(ctx, sweep, int(d), batch, seq_len, heads, names, is_causal))
    picked = sorted({r["selected_backend"] for r in rows if r["backend"] == "auto"})
    log.info(
        "%s: %d head dims %d..%d (B=%d S=%d H=%d), backends picked: %s",
        sweep,
        len(dims),
        min(dims),
        max(dims),
        batch,
        seq_len,
        heads,
        ", ".join(picked),
    )
    return rows


def _around(center: int, radius: int) -> list[int]:
    return list(range(center - radius, center + radius + 1))


def run_sweeps(
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    plan: SweepPlan | None = None,
    protocol: TimingProtocol | None = None,
) -> HardwareProfile:
    """Run the sweeps of ``plan`` on ``device`` and return them as a :class:`HardwareProfile`."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    plan = plan or (SweepPlan.paper() if dev.type == "cuda" else SweepPlan.quick())
    protocol = protocol or (TimingProtocol.paper() if dev.type == "cuda" else TimingProtocol.quick())
    ctx = _Ctx(dev, dt, protocol, plan.kernel_names)
    torch.manual_seed(0)
    info = device_info(dev)
    log.info(
        "profiling %s (%s), dtype %s, protocol %s",
        info["device_name"],
        dev,
        dtype_name(dt),
        protocol.to_dict(),
    )
    rows: list[dict] = []
    with torch.inference_mode():
        if "sdpa" in plan.sweeps:
            rows += sweep_sdpa(
                plan.sdpa_dims,
                plan.sdpa_batch,
                plan.sdpa_seq_len,
                plan.sdpa_heads,
                ctx,
                backends=plan.sdpa_backends,
                is_causal=plan.is_causal,
            )
        if "gemm" in plan.sweeps:
            for axis in plan.gemm_axes:
                rows += sweep_gemm(axis, plan.gemm_range(axis), plan.gemm_M, plan.gemm_N, plan.gemm_K, ctx)
        if "tput" in plan.sweeps:
            c = plan.tput_center
            for axis in ("K", "N"):
                rows += sweep_gemm(
                    axis, _around(c, plan.tput_radius), c, c, c, ctx, sweep=f"gemm_tput_{axis}"
                )
        if "gemv" in plan.sweeps:
            c = plan.gemv_center
            for axis in ("K", "N"):
                rows += sweep_gemm(axis, _around(c, plan.gemv_radius), 1, c, c, ctx, op="gemv")
    _capture_pending(ctx)  # every shape is timed: only now a profiler session (module docstring)
    meta = dict(info, dtype=dtype_name(dt), protocol=protocol.to_dict(), plan=plan.to_dict(), kind="sweeps")
    return HardwareProfile(pd.DataFrame(rows, columns=COLUMNS) if rows else empty_table(), meta)


# --------------------------------------------------------------------------------------------------------------
# Step 2 of a job: measure the kernels at exactly the candidate shapes its targets need
# --------------------------------------------------------------------------------------------------------------


def target_shape(target: Target) -> dict | None:
    """The fixed dimensions of the kernels ``target``'s dimension reaches, from ``target.meta``.

    ``lowrank``: ``meta["in_features"]`` and ``meta["out_features"]``; without them, solved from
    ``meta["dense_params"]`` (= in * out) and ``params_per_dim`` (= in + out) taking in >= out, else a square
    weight (in = out = params_per_dim / 2). ``width``: ``meta["hidden_size"]`` (default ``params_per_dim / 3``).
    ``head_dim``: ``meta["num_heads"]`` (default 32). ``generic``: None (no kernels known).
    """
    m = target.meta or {}
    if target.kind == "lowrank":
        fin, fout = m.get("in_features"), m.get("out_features")
        if fin is None or fout is None:
            fin = fout = target.params_per_dim // 2
            dense = m.get("dense_params")
            if isinstance(dense, int) and dense > 0:
                disc = target.params_per_dim**2 - 4 * dense
                root = math.isqrt(disc) if disc >= 0 else -1
                if root >= 0 and root * root == disc and (target.params_per_dim + root) % 2 == 0:
                    fin, fout = (target.params_per_dim + root) // 2, (target.params_per_dim - root) // 2
        return {"in": int(fin), "out": int(fout)}
    if target.kind == "width":
        return {"hidden": int(m.get("hidden_size", target.params_per_dim // 3))}
    if target.kind == "head_dim":
        return {"heads": int(m.get("num_heads", 32))}
    return None


def context_key(kind: str, shape: Mapping[str, int]) -> str:
    """A stable name for a kernel context, e.g. ``"lowrank:in=4096,out=1024"``."""
    return f"{kind}:" + ",".join(f"{k}={shape[k]}" for k in sorted(shape))


def width_kernels(tokens: int, hidden: int, d: int) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """A width target's kernels at width ``d`` over ``tokens`` tokens, the one definition of what is measured here and
    what :mod:`gac.predict.latency_tables` predicts: gate and up ``x[T, hidden] @ W[d, hidden]^T``, their
    element-wise product (two ``[T, d]`` read, one written), down ``h[T, d] @ W[hidden, d]^T``. Each is ``(name,
    "gemm", (M, N, K))`` or ``(name, "elementwise", (elements moved,))``. The activation is the model's, not the
    target's (it is timed with neither)."""
    return (("gate", "gemm", (tokens, d, hidden)), ("up", "gemm", (tokens, d, hidden)),
            ("gate_product", "elementwise", (3 * tokens * d,)), ("down", "gemm", (tokens, hidden, d)))


def _target_op(kind: str, shape: Mapping[str, int], d: int, tokens: int, batch: int, seq_len: int, ctx: _Ctx):
    """(make_inputs, fn) for one composite op of a target at dimension d."""
    if kind == "lowrank":
        fin, fout = shape["in"], shape["out"]

        def make():
            return (_randn((tokens, fin), ctx), _randn((d, fin), ctx), _randn((fout, d), ctx))

        def fn(x, b, a):  # x @ B^T (N = d), then h @ A^T (K = d)
            return F.linear(F.linear(x, b), a)

        return make, fn, 2.0 * tokens * d * (fin + fout)
    if kind == "width":
        h = shape["hidden"]

        def make():
            return (_randn((tokens, h), ctx), _randn((d, h), ctx), _randn((d, h), ctx), _randn((h, d), ctx))

        def fn(x, g, u, dn):  # width_kernels: gate and up (N = d), their product, down (K = d)
            return F.linear(F.linear(x, g) * F.linear(x, u), dn)

        return make, fn, sum(2.0 * math.prod(mnk) for _, op, mnk in width_kernels(tokens, h, d) if op == "gemm")
    if kind == "head_dim":
        heads = shape["heads"]

        def make():
            return tuple(_randn((batch, seq_len, heads, d), ctx).transpose(1, 2) for _ in range(3))

        return make, sdpa_with_backend(None), 4.0 * batch * heads * seq_len * seq_len * d
    raise GacError(f"no kernels are known for target kind {kind!r}")


def measure_for_targets(
    targets: Sequence[Target],
    candidates: Mapping[str, Sequence[int]] | Sequence[Sequence[int]],
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    seq_len: int = 1024,
    batch: int = 1,
    protocol: TimingProtocol | None = None,
    kernel_names: bool | str = True,
) -> HardwareProfile:
    """Time each target's own kernels at each of its candidate dimensions (paper Algorithm 1, lines 2-5).

    ``kernel_names``: capture each shape's kernel after all of them are timed, in this process (True), in a child
    process ("process": what a job uses, so no profiler session ever precedes its latency measurement) or not at
    all (False).

    Targets with the same kernel context (e.g. all ``q_proj`` of a model) share one measurement per dimension.
    Rows have ``sweep="target"`` and ``context=context_key(...)``; a :class:`gac.profiling.ProfileFilter`
    built from the result removes the candidates that are slower than a larger candidate of the same context.
    ``candidates`` maps target name -> dims (or is a list parallel to ``targets``).
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    protocol = protocol or (TimingProtocol.paper() if dev.type == "cuda" else TimingProtocol.quick())
    if kernel_names not in KERNEL_NAME_MODES:
        raise GacError(f"kernel_names must be True, False or 'process', got {kernel_names!r}")
    if not isinstance(candidates, Mapping):
        candidates = {t.name: c for t, c in zip(targets, candidates, strict=True)}
    wanted: dict[tuple[str, str], set[int]] = {}
    shapes: dict[tuple[str, str], dict] = {}
    for t in targets:
        shape = target_shape(t)
        if shape is None:
            continue
        key = (t.kind, context_key(t.kind, shape))
        shapes[key] = shape
        wanted.setdefault(key, set()).update(int(d) for d in candidates.get(t.name, ()))
    ctx = _Ctx(dev, dt, protocol, kernel_names)
    tokens = batch * seq_len
    rows = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for (kind, key), dims in sorted(wanted.items()):
            for d in sorted(dims):
                make, fn, flops = _target_op(kind, shapes[(kind, key)], d, tokens, batch, seq_len, ctx)
                t = time_op(make, fn, dev, protocol)
                common = dict(sweep="target", op=kind, axis="d", dim=d, M=tokens if kind != "head_dim" else None,
                              batch=batch, seq_len=seq_len, heads=shapes[(kind, key)].get("heads"),
                              head_dim=d if kind == "head_dim" else None, dtype=dtype_name(dt), context=key)
                rows.append(_timed_row(common, t, flops, None, kernel_tier(None), backend="auto",
                                       selected_backend=""))
                ctx.want_kernel(rows[-1], {"op": kind, "shape": dict(shapes[(kind, key)]), "d": d, "tokens": tokens,
                                           "batch": batch, "seq_len": seq_len})
            log.info("measured %s at %d candidate dims", key, len(dims))
        _capture_pending(ctx)  # after every shape is timed (module docstring)
    meta = dict(
        device_info(dev),
        dtype=dtype_name(dt),
        protocol=protocol.to_dict(),
        kind="targets",
        plan={"seq_len": seq_len, "batch": batch},
    )
    return HardwareProfile(pd.DataFrame(rows, columns=COLUMNS) if rows else empty_table(), meta)
