"""Fit a :class:`~gac.predict.kernels.Calibration` to the kernel sweeps of a hardware profile (no end-to-end data).

Every constant and the sweep it comes from:

* ``R_sm`` (aligned GEMM rate per SM of the reference tile): the median of (model time at ``R_sm = 1``) / (measured
  time) over the aligned points of the **largest** aligned GEMMs the profile has: the H100's 8k sweeps
  (``gemm_{M,K,N}_filtered_8k``, read as ``8192^3`` with one dim swept) where they exist, else the ``M=512``
  tensor-core sweeps ``gemm_tput_K``/``gemm_tput_N``;
* ``gamma`` (the operand-reuse exponent of tiles smaller than the reference tile): where ``R_sm`` came from the 8k
  sweeps, the value on a grid that best matches the aligned ``M=512`` points (the small-grid regime); else 1;
* ``tier_k`` / ``tier_n``: per alignment class the median TFLOPS of the ``M=512`` sweep over that of ``mod16``;
* the misaligned families (``even``, ``odd`` per axis): their median TFLOPS at each size a sweep measured them (the
  ``M=512`` sweeps; the 8k sweeps where present), as absolute rates;
* the row-load tier: per class the median latency of the ``l2_rowload_K`` sweep over that of ``mod16`` (>= 1);
* the GEMM floor: the least per-call latency of the small ``K=128`` GEMM sweeps (``gemm_{M,N,K}_filtered``);
* the wave mode (:data:`~gac.predict.kernels.WAVE_MODES`): from the M sweep (``gemm_M_filtered``: M = 1024..2048 at
  N = 2048, K = 128), the largest rise between adjacent multiples of 16: above :data:`WAVE_STEP` (the A100: +65%,
  cuBLAS switching to a kernel of more waves) the waves are uncertain (``middle``), below it (the H100: +2%) they
  are balanced (``fractional``); ``R_sm`` is fitted under the mode chosen;
* the SDPA padding copy: ``excess(d) = latency(d) - latency(next multiple of 8)`` for every misaligned d of
  ``sdpa_head_dim`` fitted by least squares as ``t0 + pad_bytes(d) / BW`` (``BW`` is also the streaming bandwidth);
* the SDPA rate per FA2 template: the median over the template's aligned dims of work / (latency x SMs) for the
  sweep's non-causal shape.

``rng``: resample the rows of every sweep with replacement first, within each alignment class (and FA2 template)
(one bootstrap replicate of the calibration).
"""

from __future__ import annotations

import numpy as np

from gac.errors import GacError
from gac.predict.kernels import (
    ARCH,
    CLASSES,
    MISALIGNED,
    TILES,
    WAVE_MODES,
    Calibration,
    aligned_ms,
    dim_class,
    pad_bytes,
    sdpa_work,
    template_of,
)
from gac.profiling.profile import HardwareProfile

NEEDED = ("gemm_tput_K", "gemm_tput_N", "sdpa_head_dim")
BIG = 8192  # the 8k sweeps' fixed dims (the figure's x axis is 7900..8200; 8192^3 reads 1.63 ms, 674 TFLOPS)
GAMMAS = tuple(np.round(np.arange(0.5, 4.01, 0.05), 2))
WAVE_STEP = 0.10  # an M sweep rising more than this between adjacent multiples of 16 steps by waves


def calibrate(profile: HardwareProfile, sms: int, gpu: str | None = None, rng=None,
              waves: str | None = None) -> Calibration:
    """The calibration of ``profile`` for a GPU with ``sms`` streaming multiprocessors; ``waves`` forces a wave mode
    (the bounds of :meth:`gac.predict.Predictor.wave_bounds`) instead of the one the M sweep gives."""
    missing = [s for s in NEEDED if s not in profile.sweeps()]
    if missing:
        raise GacError(f"profile {profile.device_name!r} lacks the sweeps {missing} the predictor calibrates on; "
                       f"measure them (python experiments/profile_device.py device=cuda) or use a published profile")
    have = set(profile.sweeps())

    def sweep(name):
        sw = profile.sweep(name)
        if rng is None or not len(sw):
            return sw
        # stratified: rows are resampled within their alignment class (and FA2 template), so every class a fit
        # needs keeps its count
        dims = sw["dim"].astype(int)
        key = dims.map(dim_class) + (dims.map(lambda d: f"/{template_of(d)}") if name == "sdpa_head_dim" else "")
        take = []
        for _, idx in sw.groupby(key.values).indices.items():
            take.extend(idx[rng.integers(0, len(idx), len(idx))])
        return sw.iloc[sorted(take)]

    g = str(gpu or profile.meta.get("gpu") or profile.device_name).lower()
    arch = ARCH.get(g, {"tiles": TILES, "ref_tile": (128, 128)})
    fits: dict = {"source": profile.meta.get("published", {}).get("source") or profile.device_name}
    # --- streaming bandwidth and the padding copy, from SDPA's misaligned excess
    sd = sweep("sdpa_head_dim")
    sd = sd[sd["latency_ms"].notna()]
    lat = dict(zip(sd["dim"].astype(int), sd["latency_ms"].astype(float)))
    b, h, s = _sdpa_shape(sd)
    xs, ys = [], []
    for d, v in lat.items():
        d8 = (d + 7) // 8 * 8
        if d % 8 and d8 in lat:
            xs.append(pad_bytes(b, h, h, s, d))
            ys.append(v - lat[d8])
    if len(xs) < 4:
        raise GacError("the SDPA sweep has too few misaligned dims next to an aligned one to fit the padding copy")
    A = np.column_stack([np.ones(len(xs)), xs])
    (t0, slope), *_ = np.linalg.lstsq(A, np.array(ys), rcond=None)
    if slope <= 0:
        raise GacError("the SDPA padding excess does not grow with the bytes copied; cannot fit a bandwidth")
    pred = A @ np.array([t0, slope])
    fits["pad_copy"] = {"points": len(xs), "r2": float(1 - np.var(np.array(ys) - pred) / np.var(ys)),
                        "t0_ms": float(t0), "bw_tb_s": float(1 / slope / 1e9), "from": "sdpa_head_dim"}
    bw = 1.0 / slope
    # --- SDPA rate per template (aligned dims only)
    rate: dict[int, list[float]] = {}
    for d, v in lat.items():
        if d % 8:
            continue
        t = template_of(d)
        total, longest = sdpa_work(b, h, s, t, causal=False)
        rate.setdefault(t, []).append(max(total / sms, longest) / v)
    sdpa_rate = {t: float(np.median(v)) for t, v in rate.items()}
    # --- GEMM: tiers and the misaligned families at M=512
    tiers, family, small = {}, {}, []
    for axis in ("K", "N"):
        sw = sweep(f"gemm_tput_{axis}")
        sw = sw[sw["tflops"].notna()]
        cls = sw["dim"].astype(int).map(dim_class)
        med = {c: float(sw.loc[cls == c, "tflops"].median()) for c, _ in CLASSES if (cls == c).any()}
        if "mod16" not in med:
            raise GacError(f"gemm_tput_{axis} has no dim that is a multiple of 16; cannot fit the alignment tiers")
        tiers[axis] = {c: min(1.0, med.get(c, med["mod16"]) / med["mod16"]) for c, _ in CLASSES}
        for c in MISALIGNED:
            sel = sw[cls == c]
            if len(sel):
                gf = float(np.median(2.0 * sel["M"] * sel["N"] * sel["K"] / 1e9))
                family.setdefault((axis, c), []).append((gf, med[c]))
        small += [(int(r.M), int(r.N), int(r.K), float(r.latency_ms)) for r in sw[cls == "mod16"].itertuples()]
    # --- GEMM: the large aligned rate (the 8k sweeps where they exist) and the misaligned families at 8k
    big = []
    for axis in ("M", "K", "N"):
        name = f"gemm_{axis}_filtered_8k"
        if name not in have:
            continue
        sw = sweep(name)
        sw = sw[sw["latency_ms"].notna()]
        dims = sw["dim"].astype(int)
        cls = dims.map(dim_class)
        for r, c in zip(sw.itertuples(), cls):
            M, N, K = (int(r.dim) if axis == a else BIG for a in ("M", "N", "K"))
            if c == "mod16":
                big.append((M, N, K, float(r.latency_ms)))
        if axis != "M":
            for c in MISALIGNED:
                sel = sw[cls == c]
                if len(sel):
                    gf = float(np.median(2.0 * BIG * BIG * sel["dim"] / 1e9))
                    tf = float(np.median(2.0 * BIG * BIG * sel["dim"] / sel["latency_ms"] / 1e9))
                    family.setdefault((axis, c), []).append((gf, tf))
    ref = tuple(ARCH.get(g, {}).get("ref_tile", (128, 128)))
    step = _wave_step(profile)
    fits["waves"] = {"from": "gemm_M_filtered (M 1024..2048, N=2048, K=128; multiples of 16)",
                     "largest_step": None if step is None else step[0], "at_m": None if step is None else step[1]}
    if waves is None:
        waves = "middle" if step is None or step[0] > WAVE_STEP else "fractional"
    elif waves not in WAVE_MODES:
        raise GacError(f"wave mode must be one of {', '.join(WAVE_MODES)}, got {waves!r}")
    unit = _Unit(sms, arch["tiles"], ref, 1.0, waves=waves)
    if big:
        r_sm = float(np.median([aligned_ms(unit, M, N, K) / ms for M, N, K, ms in big]))
        gamma = min(GAMMAS, key=lambda gm: abs(np.median(
            [np.log(aligned_ms(_Unit(sms, arch["tiles"], ref, gm, r_sm, waves), M, N, K) / ms)
             for M, N, K, ms in small])))
        fits["gemm"] = {"r_sm_from": "gemm_{M,K,N}_filtered_8k (aligned, 8192^3 with one dim swept)",
                        "aligned_points": len(big), "gamma_from": f"gemm_tput_K/N aligned ({len(small)} points)"}
    else:
        r_sm = float(np.median([aligned_ms(unit, M, N, K) / ms for M, N, K, ms in small]))
        gamma = 1.0
        fits["gemm"] = {"r_sm_from": "gemm_tput_K/N aligned (M=512)", "aligned_points": len(small),
                        "gamma_from": "fixed at 1 (one GEMM size measured)"}
    # --- the row-load tier and the GEMM floor
    row_tier = {}
    if "l2_rowload_K" in have:
        sw = sweep("l2_rowload_K")
        sw = sw[sw["latency_ms"].notna()]
        cls = sw["dim"].astype(int).map(dim_class)
        base = float(sw.loc[cls == "mod16", "latency_ms"].median())
        row_tier = {c: max(1.0, float(sw.loc[cls == c, "latency_ms"].median()) / base)
                    for c, _ in CLASSES if (cls == c).any()}
    floors = [float(profile.sweep(n)["latency_ms"].min()) for n in ("gemm_M_filtered", "gemm_N_filtered",
                                                                     "gemm_K_filtered") if n in have]
    floor = min(floors) if floors else 0.0
    fits["sdpa_shape"] = {"batch": b, "heads": h, "seq_len": s}
    return Calibration(gpu=g, sms=int(sms), r_sm=r_sm, tier_k=tiers["K"], tier_n=tiers["N"], bw_stream=float(bw),
                       pad_t0=float(max(t0, 0.0)), pad_bw=float(bw), sdpa_rate=sdpa_rate, tiles=tuple(arch["tiles"]),
                       ref_tile=ref, gamma=float(gamma), waves=waves,
                       family={k: tuple(sorted(v)) for k, v in family.items()}, row_tier=row_tier,
                       floor_ms=floor, fits=fits)


class _Unit:
    """A stand-in calibration at a given per-SM rate (1 for the fit: time at unit rate / measured time = R_sm)."""

    def __init__(self, sms, tiles, ref_tile, gamma, r_sm=1.0, waves="middle"):
        self.sms, self.tiles, self.ref_tile, self.gamma, self.r_sm = sms, tiles, ref_tile, gamma, r_sm
        self.waves = waves
        self.bw_stream = float("inf")


def _wave_step(profile: HardwareProfile) -> tuple[float, int] | None:
    """The largest relative rise of the M sweep between adjacent multiples of 16, and the M it rises to."""
    if "gemm_M_filtered" not in profile.sweeps():
        return None
    sw = profile.sweep("gemm_M_filtered")
    sw = sw[sw["latency_ms"].notna() & (sw["dim"].astype(int) % 16 == 0)].sort_values("dim")
    lat = sw["latency_ms"].astype(float).to_numpy()
    if len(lat) < 2:
        return None
    rise = lat[1:] / lat[:-1] - 1
    k = int(np.argmax(rise))
    return float(rise[k]), int(sw["dim"].iloc[k + 1])


def _sdpa_shape(sd) -> tuple[int, int, int]:
    shapes = sd[["batch", "heads", "seq_len"]].drop_duplicates()
    if len(shapes) != 1 or shapes.isna().any(axis=None):
        raise GacError("the SDPA sweep must hold one (batch, heads, seq_len) shape to calibrate on")
    b, h, s = (int(v) for v in shapes.iloc[0])
    return b, h, s
