"""Kernel time models, calibrated on kernel-level data only (a published or measured hardware profile).

Three kinds of kernels make a transformer prefill, each with its own model (times in milliseconds):

* **GEMM** (:func:`gemm_ms`). Aligned (K and N multiples of 8: the tensor-core kernel family): a tile-level roofline.
  cuBLAS runs an ``M x N`` output as CTA tiles of ``tm x tn`` from the GPU's tile set (:data:`ARCH`),
  split along K into up to :data:`SPLITS` parts where the grid is small: split-K's gain is taken in full below a
  quarter of the SMs and not at all above half of them, faded geometrically in between (:data:`SPLIT_FADE`,
  hand-set: a hard gate "split only when the grid fills less than a quarter of the SMs" made a step of its own,
  +11.4% on the H100 at S=1024->1025; the upper end is where the published data show no split's gain, the H100's
  M=512 sweep, 64 tiles of 256 x 128 on 132 SMs running at the half-empty wave's rate); the tiles run in waves of one tile per SM, so the time is ``waves x tile time`` (tile quantization: a 4097-wide GEMM pays a whole
  extra column of tiles). How whole the waves are (:attr:`Calibration.waves`) is a **model assumption**, switched by
  the published M sweep (``gemm_M_filtered``, K=128, near the per-kernel floor) rising more than a hand-set 10%
  between adjacent multiples of 16: ``fractional`` (work spread evenly over the SMs, as stream-K and split kernels
  do: ``max(1, tiles / SMs)``) where it does not (the H100), ``middle`` where it does (the A100, whose sweep steps
  at M=1104 and 1744, not at tile boundaries, and is flat at 1024->1025: it does not show wave quantization, only
  that cuBLAS switches kernels): the geometric middle (exponent 0.5, hand-set) of whole waves ``ceil(tiles / SMs)``
  and balanced ones, whose ends :func:`gac.predict.Predictor.wave_bounds` carries into the interval. A tile runs at
  the per-SM rate ``R_sm`` times its operand-reuse efficiency
  ``(AI(tm, tn) / AI(ref tile))^gamma`` (``AI = tm tn / (tm + tn)``, capped at 1; the reference tile is the one the
  architecture reaches its rate with: 128 x 128 on Ampere, 256 x 128 on Hopper), divided by the ``mod8`` tier of K
  and N (8-aligned but not 16-aligned dims run the same family a little slower on the A100). The configuration with
  the least time is taken (an ideal cuBLAS heuristic). Misaligned (K or N not a multiple of 8): cuBLAS runs another
  kernel family with **its own absolute rate** (:attr:`Calibration.family`: TFLOPS per (axis, class) measured at
  one or two sizes, interpolated log-log in the GEMM's FLOPs and held flat outside), never faster than the aligned
  model. Every GEMM is at least its bytes at the streaming bandwidth slowed by the **row-load tier** of K (a row
  whose length is not a multiple of 16 loads at the misaligned rate of the ``l2_rowload_K`` sweep), and at least the
  **per-kernel floor** (the back-to-back time of the smallest cuBLAS GEMMs measured).
* **SDPA** (:func:`sdpa_ms`): FlashAttention-2 forward. One CTA per (batch, head, block of ``BR`` queries); a CTA
  walks its key blocks; the CTAs run in waves over the SMs (causal CTAs differ in length: the bound
  ``max(total / SMs, longest)``). The per-key-block rate of each head-dim template (64, 96, ..., 256) is calibrated on
  the aligned dims of the SDPA sweep. A head dim that is not a multiple of 8 also pays the **padding copy** PyTorch
  makes (``constant_pad_nd`` of q, k and v to the next multiple of 8: a fill and a copy each), fitted as
  ``t0 + bytes / BW`` to the excess of every misaligned dim over its next multiple of 8.
* **element-wise / norm** (:func:`stream_ms`): bandwidth-bound, ``bytes / BW_stream``, with ``BW_stream`` the padding
  copy's bandwidth (the one memory-bound copy kernel the data measure over a 4x range of sizes). These kernels run on
  contiguous tensors, so their row length does not matter.

The launch cost of a kernel is not a GPU time: see :mod:`gac.predict.predictor` (the CPU issue interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: per-architecture CTA tile sets (rows of A x columns of B) and the tile that reaches the full per-SM rate
TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
ARCH = {
    "a100": {"sms": 108, "tiles": TILES, "ref_tile": (128, 128)},  # Ampere mma.sync: 128 x 128 reaches the rate
    "h100": {"sms": 132, "tiles": TILES, "ref_tile": (256, 128)},  # Hopper wgmma: a 2-warpgroup 256 x 128 tile
}
#: split-K factors the GEMM model chooses from (a split writes and re-reads fp32 partial sums), and the fill of the
#: SMs (unsplit grid / SMs) over which its gain fades from full to none (module docstring); both hand-set
SPLITS: tuple[int, ...] = (1, 2, 3, 4)
SPLIT_FADE = (0.25, 0.5)
#: FlashAttention-2 head-dim templates and their key-block width B_c (the paper's Table 2); B_r = 128
FA2_TEMPLATES: tuple[int, ...] = (32, 64, 96, 128, 160, 192, 224, 256)
FA2_BC = {32: 128, 64: 128, 96: 64, 128: 64, 160: 32, 192: 32, 224: 32, 256: 32}
BR = 128
#: how whole a GEMM's waves are (module docstring)
WAVE_MODES = ("integer", "fractional", "middle")
#: alignment classes of a GEMM dim, best first: the residue rule and its name
CLASSES: tuple[tuple[str, int], ...] = (("mod16", 16), ("mod8", 8), ("even", 2), ("odd", 1))
#: the classes that leave the tensor-core family (their own kernels, their own absolute rates)
MISALIGNED = ("even", "odd")
DTYPE_BYTES = 2  # fp16/bf16


def dim_class(d: int) -> str:
    """The alignment class of a GEMM dim: ``mod16``, ``mod8`` (8 but not 16), ``even`` (2 but not 8), ``odd``."""
    for name, m in CLASSES:
        if d % m == 0:
            return name
    return "odd"


@dataclass
class Calibration:
    """Every fitted number the models use, for one GPU; built by :func:`gac.predict.calibrate.calibrate`."""

    gpu: str
    sms: int
    r_sm: float  # GEMM FLOP/ms per SM of the reference tile (aligned)
    tier_k: dict[str, float]  # class -> throughput relative to mod16 at the M=512 sweep, from the K sweep
    tier_n: dict[str, float]  # the same from the N sweep
    bw_stream: float  # bytes/ms of a streaming copy
    pad_t0: float  # ms: fixed part of the SDPA padding copy (3 tensors)
    pad_bw: float  # bytes/ms of the padding copy (= bw_stream)
    sdpa_rate: dict[int, float]  # template -> (query x key x template-dim) MAC/ms per CTA (one SM)
    tiles: tuple[tuple[int, int], ...] = TILES
    ref_tile: tuple[int, int] = (128, 128)
    gamma: float = 1.0  # exponent of the operand-reuse efficiency of tiles smaller than the reference tile
    #: (axis, class) -> ((GFLOP, TFLOPS), ...) sorted by GFLOP: the misaligned families' absolute rates
    family: dict[tuple[str, str], tuple[tuple[float, float], ...]] = field(default_factory=dict)
    row_tier: dict[str, float] = field(default_factory=dict)  # class -> row-load slowdown (>= 1) of a K-long row
    floor_ms: float = 0.0  # the least time of one GEMM kernel
    waves: str = "middle"  # one of WAVE_MODES
    fits: dict = field(default_factory=dict)  # residuals and sources, for reports
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # kernel times by shape

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "sms": self.sms, "waves": self.waves, "r_sm_tflops_per_sm": self.r_sm / 1e9,
                "tiles": self.tiles,
                "ref_tile": self.ref_tile, "gamma": self.gamma, "tier_k": self.tier_k, "tier_n": self.tier_n,
                "misaligned_tflops": {f"{a} {c}": [list(p) for p in v] for (a, c), v in self.family.items()},
                "row_load_tier": self.row_tier, "gemm_floor_ms": self.floor_ms,
                "bw_stream_tb_s": self.bw_stream / 1e9, "pad_t0_ms": self.pad_t0,
                "sdpa_tflops_per_sm": {str(k): 2 * v / 1e9 for k, v in self.sdpa_rate.items()}, "fits": self.fits}


def tier_factor(cal: Calibration, K: int, N: int, lead_k: int | None = None) -> float:
    """Throughput of a GEMM with inner dim K and output dim N relative to a fully aligned one at the M=512 sweep's
    size: the worse of the two dims' classes (its vector width is set by the least aligned leading dimension).
    ``lead_k``: the leading dimension of A when A is a strided slice (else K)."""
    k = min(cal.tier_k[dim_class(K)], cal.tier_k[dim_class(lead_k)] if lead_k is not None else 1.0)
    return min(k, cal.tier_n[dim_class(N)])


def _reuse(cal, tm: int, tn: int) -> float:
    rt = cal.ref_tile
    ai = (tm * tn / (tm + tn)) / (rt[0] * rt[1] / (rt[0] + rt[1]))
    return min(1.0, ai) ** cal.gamma


def gemm_config_ms(cal: Calibration, M: int, N: int, K: int, tm: int, tn: int, split: int) -> float:
    """Compute time of one configuration (aligned, tier 1): waves x per-tile time, plus split-K's partial sums."""
    tiles = math.ceil(M / tm) * math.ceil(N / tn) * split
    waves = wave_count(tiles, cal.sms, cal.waves)
    k_part = math.ceil(K / split)
    tile_ms = 2.0 * tm * tn * k_part / (cal.r_sm * _reuse(cal, tm, tn))
    extra = 0.0 if split == 1 else (2 * split * M * N * 4) / cal.bw_stream  # fp32 partials written and read back
    return waves * tile_ms + extra


def wave_count(tiles: int, sms: int, mode: str) -> float:
    """Waves of ``tiles`` over ``sms``: whole (``integer``), balanced (``fractional``) or their geometric middle."""
    whole = math.ceil(tiles / sms)
    if mode == "integer":
        return float(whole)
    even = max(1.0, tiles / sms)
    return even if mode == "fractional" else math.sqrt(whole * even)


def aligned_ms(cal: Calibration, M: int, N: int, K: int) -> float:
    """The tensor-core family's time: the best tile configuration, each split along K as :func:`split_weight` says."""
    best = math.inf
    for tm, tn in cal.tiles:
        unsplit = gemm_config_ms(cal, M, N, K, tm, tn, 1)
        split = min(gemm_config_ms(cal, M, N, K, tm, tn, s) for s in SPLITS)
        w = split_weight(math.ceil(M / tm) * math.ceil(N / tn), cal.sms)
        best = min(best, split ** w * unsplit ** (1 - w))
    return best


def split_weight(grid: int, sms: int) -> float:
    """How far a grid of ``grid`` tiles takes split-K's gain: fully below :data:`SPLIT_FADE`'s lower fill of the
    SMs, not at all above its upper one, geometrically in between (a hand-set fade, so the rule makes no step)."""
    lo, hi = SPLIT_FADE
    return min(1.0, max(0.0, (hi - grid / sms) / (hi - lo)))


def family_tflops(points: tuple[tuple[float, float], ...], gflop: float) -> float:
    """A misaligned family's rate at ``gflop``: log-log interpolation between its measured sizes, flat outside."""
    if gflop <= points[0][0] or len(points) == 1:
        return points[0][1]
    if gflop >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= gflop <= x1:
            w = (math.log(gflop) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    return points[-1][1]


def gemm_ms(cal: Calibration, M: int, N: int, K: int, lead_k: int | None = None) -> float:
    """``x[M, K] @ W[N, K]^T`` in fp16 (module docstring); ``lead_k``: A's leading dimension when it is a slice."""
    if min(M, N, K) <= 0:
        raise ValueError(f"GEMM dims must be positive, got M={M} N={N} K={K}")
    key = ("gemm", M, N, K, lead_k)
    if key in cal.memo:
        return cal.memo[key]
    kc = dim_class(K) if lead_k is None else max(dim_class(K), dim_class(lead_k), key=_CLASS_RANK.__getitem__)
    nc = dim_class(N)
    t = aligned_ms(cal, M, N, K)
    t /= min(cal.tier_k["mod8"] if kc == "mod8" else 1.0, cal.tier_n["mod8"] if nc == "mod8" else 1.0)
    gflop = 2.0 * M * N * K / 1e9
    for axis, c in (("K", kc), ("N", nc)):
        if c in MISALIGNED:
            pts = cal.family.get((axis, c))
            if pts:  # own absolute rate (TFLOPS = GFLOP/ms)
                t = max(t, gflop / family_tflops(pts, gflop))
            else:  # no sweep point of this class: the relative tier at the M=512 size
                t = max(t, aligned_ms(cal, M, N, K) / tier_factor(cal, K, N, lead_k))
    memory = DTYPE_BYTES * (M * K + N * K + M * N) * cal.row_tier.get(kc, 1.0) / cal.bw_stream
    out = max(t, memory, cal.floor_ms)
    cal.memo[key] = out
    return out


_CLASS_RANK = {name: i for i, (name, _) in enumerate(CLASSES)}


def template_of(d: int) -> int:
    for t in FA2_TEMPLATES:
        if d <= t:
            return t
    raise ValueError(f"head dim {d} is above FlashAttention-2's largest template {FA2_TEMPLATES[-1]}")


def sdpa_work(batch: int, heads: int, seq_len: int, t: int, causal: bool) -> tuple[float, float]:
    """(total, longest CTA) work in units of (query x key x template dim) MACs for FA2's CTAs."""
    bc = FA2_BC[t]
    nq = math.ceil(seq_len / BR)
    per = []
    for i in range(nq):
        keys = min(seq_len, (i + 1) * BR) if causal else seq_len
        per.append(math.ceil(keys / bc) * bc * BR * t)
    return batch * heads * sum(per), max(per)


def sdpa_compute_ms(cal: Calibration, batch: int, heads: int, seq_len: int, d: int, causal: bool) -> float:
    t = template_of(d)
    total, longest = sdpa_work(batch, heads, seq_len, t, causal)
    rate = cal.sdpa_rate[t]
    return max(total / cal.sms, longest) / rate


def pad_bytes(batch: int, heads_q: int, heads_kv: int, seq_len: int, d: int) -> int:
    """Bytes of PyTorch's padding of q, k, v to the next multiple of 8: per tensor a fill of the padded size and a copy
    of the original (read + write)."""
    if d % 8 == 0:
        return 0
    d8 = (d + 7) // 8 * 8
    rows = batch * seq_len * (heads_q + 2 * heads_kv)
    return DTYPE_BYTES * rows * (d8 + 2 * d)


def sdpa_ms(cal: Calibration, batch: int, heads: int, seq_len: int, d: int, causal: bool = True,
            kv_heads: int | None = None) -> float:
    """FlashAttention-2 forward over (batch, heads, seq_len, d), with the padding copy of a misaligned d."""
    t = sdpa_compute_ms(cal, batch, heads, seq_len, (d + 7) // 8 * 8, causal)
    if d % 8:
        t += cal.pad_t0 + pad_bytes(batch, heads, kv_heads or heads, seq_len, d) / cal.pad_bw
    return t


def stream_ms(cal: Calibration, nbytes: float) -> float:
    """A bandwidth-bound kernel moving ``nbytes``."""
    return float(nbytes) / cal.bw_stream
