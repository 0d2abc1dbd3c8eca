"""Kernel time models, calibrated on kernel-level data only (a published or measured hardware profile).

Three kinds of kernels make a transformer prefill, each with its own model (times in milliseconds):

* **GEMM** (:func:`gemm_ms`): a tile-level roofline. cuBLAS runs an ``M x N`` output as CTA tiles of ``tm x tn``
  (one of :data:`TILES`), optionally split along K; the tiles run in waves of one tile per SM, so the time is
  ``waves x tile time`` (tile and wave quantization: a 4097-wide GEMM pays a whole extra column of tiles, 109 tiles
  on 108 SMs pay two waves). A tile's rate is the calibrated per-SM rate ``R_sm`` times its operand-reuse
  efficiency (a tile smaller than 128 x 128 reuses each loaded operand less: ``AI(tm, tn) / AI(128, 128)`` with
  ``AI = tm tn / (tm + tn)``, capped at 1), divided by the **alignment tier** of K and N (:func:`tier_factor`). The
  configuration with the least time is taken (an ideal cuBLAS heuristic). The time is at least the bytes moved at
  the streaming bandwidth (a memory-bound GEMM).
* **SDPA** (:func:`sdpa_ms`): FlashAttention-2 forward. One CTA per (batch, head, block of ``BR`` queries); a CTA
  walks its key blocks; the CTAs run in waves over the SMs (causal CTAs differ in length: the bound
  ``max(total / SMs, longest)``). The per-key-block rate of each head-dim template (64, 96, ..., 256) is calibrated on
  the aligned dims of the SDPA sweep. A head dim that is not a multiple of 8 also pays the **padding copy** PyTorch
  makes (``constant_pad_nd`` of q, k and v to the next multiple of 8: a fill and a copy each), fitted as
  ``t0 + bytes / BW`` to the excess of every misaligned dim over its next multiple of 8.
* **element-wise / norm** (:func:`stream_ms`): bandwidth-bound, ``bytes / BW_stream``, with ``BW_stream`` the padding
  copy's bandwidth (the one memory-bound copy kernel the data measure over a 4x range of sizes).

The launch cost of a kernel is not a GPU time: see :mod:`gac.predict.predictor` (the CPU issue interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: CTA tile shapes (rows of A x columns of B) the GEMM model chooses from
TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
#: split-K factors the GEMM model chooses from (a split writes and re-reads fp32 partial sums)
SPLITS: tuple[int, ...] = (1, 2, 3, 4)
#: FlashAttention-2 head-dim templates and their key-block width B_c (the paper's Table 2); B_r = 128
FA2_TEMPLATES: tuple[int, ...] = (32, 64, 96, 128, 160, 192, 224, 256)
FA2_BC = {32: 128, 64: 128, 96: 64, 128: 64, 160: 32, 192: 32, 224: 32, 256: 32}
BR = 128
#: alignment classes of a GEMM dim, best first: the residue rule and its name
CLASSES: tuple[tuple[str, int], ...] = (("mod16", 16), ("mod8", 8), ("even", 2), ("odd", 1))
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
    r_sm: float  # GEMM FLOP/ms per SM at operand-reuse efficiency 1 (aligned)
    tier_k: dict[str, float]  # class -> throughput relative to mod16, from the K sweep
    tier_n: dict[str, float]  # the same from the N sweep
    bw_stream: float  # bytes/ms of a streaming copy
    pad_t0: float  # ms: fixed part of the SDPA padding copy (3 tensors)
    pad_bw: float  # bytes/ms of the padding copy (= bw_stream)
    sdpa_rate: dict[int, float]  # template -> (query x key x template-dim) MAC/ms per CTA (one SM)
    fits: dict = field(default_factory=dict)  # residuals and sources, for reports

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "sms": self.sms, "r_sm_tflops_per_sm": self.r_sm / 1e9, "tier_k": self.tier_k,
                "tier_n": self.tier_n, "bw_stream_tb_s": self.bw_stream / 1e9, "pad_t0_ms": self.pad_t0,
                "sdpa_tflops_per_sm": {str(k): 2 * v / 1e9 for k, v in self.sdpa_rate.items()}, "fits": self.fits}


def tier_factor(cal: Calibration, K: int, N: int, lead_k: int | None = None) -> float:
    """Throughput of a GEMM with inner dim K and output dim N relative to a fully aligned one: the worse of the two
    dims' classes (one kernel serves both; its vector width is set by the least aligned leading dimension).
    ``lead_k``: the leading dimension of A when A is a strided slice (else K)."""
    k = min(cal.tier_k[dim_class(K)], cal.tier_k[dim_class(lead_k)] if lead_k is not None else 1.0)
    return min(k, cal.tier_n[dim_class(N)])


def _reuse(tm: int, tn: int) -> float:
    return min(1.0, (tm * tn / (tm + tn)) / 64.0)


def gemm_config_ms(cal: Calibration, M: int, N: int, K: int, tm: int, tn: int, split: int) -> float:
    """Compute time of one configuration (aligned, tier 1): waves x per-tile time, plus split-K's partial sums."""
    tiles = math.ceil(M / tm) * math.ceil(N / tn) * split
    waves = math.ceil(tiles / cal.sms)
    k_part = math.ceil(K / split)
    tile_ms = 2.0 * tm * tn * k_part / (cal.r_sm * _reuse(tm, tn))
    extra = 0.0 if split == 1 else (2 * split * M * N * 4) / cal.bw_stream  # fp32 partials written and read back
    return waves * tile_ms + extra


def gemm_ms(cal: Calibration, M: int, N: int, K: int, lead_k: int | None = None) -> float:
    """``x[M, K] @ W[N, K]^T`` in fp16 (module docstring); ``lead_k``: A's leading dimension when it is a slice."""
    if min(M, N, K) <= 0:
        raise ValueError(f"GEMM dims must be positive, got M={M} N={N} K={K}")
    best = min(gemm_config_ms(cal, M, N, K, tm, tn, s) for tm, tn in TILES for s in SPLITS)
    compute = best / tier_factor(cal, K, N, lead_k)
    memory = DTYPE_BYTES * (M * K + N * K + M * N) / cal.bw_stream
    return max(compute, memory)


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
