"""Fit a :class:`~gac.predict.kernels.Calibration` to the kernel sweeps of a hardware profile (no end-to-end data).

* ``R_sm``: the median over the fully aligned (K, N % 16 == 0) points of the ``gemm_tput_K``/``gemm_tput_N`` sweeps of
  (model time at ``R_sm = 1``) / (measured time) — one number per GPU;
* tier factors: per alignment class (``mod16``, ``mod8``, ``even``, ``odd``) the median TFLOPS of that class over the
  median of ``mod16``, separately for the K and the N sweep;
* the SDPA padding copy: ``excess(d) = latency(d) - latency(next multiple of 8)`` for every misaligned d of
  ``sdpa_head_dim`` fitted by least squares as ``t0 + pad_bytes(d) / BW`` (``BW`` is also the streaming bandwidth);
* the SDPA rate per FA2 template: the median over the template's aligned dims of work / (latency x SMs) for the
  sweep's non-causal shape.
"""

from __future__ import annotations

import numpy as np

from gac.errors import GacError
from gac.predict.kernels import (
    CLASSES,
    TILES,
    Calibration,
    dim_class,
    gemm_config_ms,
    pad_bytes,
    sdpa_work,
    template_of,
)
from gac.profiling.profile import HardwareProfile

NEEDED = ("gemm_tput_K", "gemm_tput_N", "sdpa_head_dim")


def calibrate(profile: HardwareProfile, sms: int, gpu: str | None = None) -> Calibration:
    """The calibration of ``profile`` for a GPU with ``sms`` streaming multiprocessors."""
    missing = [s for s in NEEDED if s not in profile.sweeps()]
    if missing:
        raise GacError(f"profile {profile.device_name!r} lacks the sweeps {missing} the predictor calibrates on; "
                       f"measure them (python experiments/profile_device.py device=cuda) or use a published profile")
    fits: dict = {"source": profile.meta.get("published", {}).get("source") or profile.device_name}
    # --- streaming bandwidth and the padding copy, from SDPA's misaligned excess
    sd = profile.sweep("sdpa_head_dim")
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
                        "t0_ms": float(t0), "bw_tb_s": float(1 / slope / 1e9)}
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
    # --- GEMM: tier factors and R_sm
    tiers = {}
    r_sm = []
    for axis in ("K", "N"):
        sw = profile.sweep(f"gemm_tput_{axis}")
        sw = sw[sw["tflops"].notna()]
        cls = sw["dim"].astype(int).map(dim_class)
        med = {c: float(sw.loc[cls == c, "tflops"].median()) for c, _ in CLASSES if (cls == c).any()}
        if "mod16" not in med:
            raise GacError(f"gemm_tput_{axis} has no dim that is a multiple of 16; cannot fit the alignment tiers")
        tiers[axis] = {c: min(1.0, med.get(c, med["mod16"]) / med["mod16"]) for c, _ in CLASSES}
        for _, row in sw[cls == "mod16"].iterrows():
            M, N, K = int(row["M"]), int(row["N"]), int(row["K"])
            unit = min(gemm_config_ms(_Unit(sms), M, N, K, tm, tn, 1) for tm, tn in TILES)
            r_sm.append(unit / float(row["latency_ms"]))
    fits["gemm"] = {"aligned_points": len(r_sm), "r_sm_spread": [float(min(r_sm)), float(max(r_sm))]}
    fits["sdpa_shape"] = {"batch": b, "heads": h, "seq_len": s}
    return Calibration(gpu=gpu or profile.meta.get("gpu") or profile.device_name, sms=int(sms),
                       r_sm=float(np.median(r_sm)), tier_k=tiers["K"], tier_n=tiers["N"], bw_stream=float(bw),
                       pad_t0=float(max(t0, 0.0)), pad_bw=float(bw), sdpa_rate=sdpa_rate, fits=fits)


class _Unit:
    """A stand-in calibration with ``R_sm = 1`` (for the fit: time at unit rate / measured time = R_sm)."""

    def __init__(self, sms: int):
        self.sms, self.r_sm, self.bw_stream = sms, 1.0, float("inf")


def _sdpa_shape(sd) -> tuple[int, int, int]:
    shapes = sd[["batch", "heads", "seq_len"]].drop_duplicates()
    if len(shapes) != 1 or shapes.isna().any(axis=None):
        raise GacError("the SDPA sweep must hold one (batch, heads, seq_len) shape to calibrate on")
    b, h, s = (int(v) for v in shapes.iloc[0])
    return b, h, s
