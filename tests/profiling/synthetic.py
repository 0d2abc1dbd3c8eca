"""Synthetic profiles with planted cliffs (and flat ones) for the cliff-detection and filter tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from gac.profiling.profile import COLUMNS, HardwareProfile

GPU = "Synthetic GPU 80GB"


def rows_for(
    sweep: str,
    op: str,
    axis: str,
    dims: Iterable[int],
    latency: Callable[[int], float],
    noise: float = 0.0,
    spread: float = 0.005,
    seed: int = 0,
    context: str = "",
    tier: Callable[[int], str] | None = None,
    backend: Callable[[int], str] | None = None,
    kernel: Callable[[int], str] | None = None,
) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for d in dims:
        lat = latency(int(d)) * (1.0 + noise * rng.uniform(-1, 1))
        row = {c: None for c in COLUMNS}
        row.update(
            sweep=sweep,
            op=op,
            axis=axis,
            dim=int(d),
            dtype="float16",
            backend="auto",
            selected_backend=backend(d) if backend else "",
            supported=True,
            latency_ms=lat,
            latency_min_ms=lat * (1 - spread),
            latency_max_ms=lat * (1 + spread),
            tflops=1.0,
            kernel=kernel(d) if kernel else "",
            tier=tier(d) if tier else "",
            context=context,
        )
        if op == "sdpa":
            row.update(batch=4, seq_len=2048, heads=32, head_dim=int(d))
        out.append(row)
    return out


def profile_of(rows: list[dict], device_name: str = GPU) -> HardwareProfile:
    meta = {
        "device_name": device_name,
        "device_type": "cuda",
        "compute_capability": "9.0",
        "torch": "2.x",
        "cuda": "12.8",
        "dtype": "float16",
        "protocol": {"warmup": 50, "iters": 200, "trials": 3},
    }
    return HardwareProfile(pd.DataFrame(rows, columns=COLUMNS), meta)


def fa2_sdpa(d: int) -> float:
    """Paper Fig. 5 / Table 2: FA2 templates every 32 dims, Math fallback (+90%) when d % 8 != 0."""
    template = -(-d // 32) * 32
    return 0.01 * template * (1.9 if d % 8 else 1.0)


def cublas_tiers(d: int) -> float:
    """Paper Table 3: native (d%8=0), align2 (+15%), align1 (+30%), on a linear cost."""
    return 0.001 * d * (1.0 if d % 8 == 0 else 1.15 if d % 2 == 0 else 1.3)


def tier_name(d: int) -> str:
    return "native" if d % 8 == 0 else "align2" if d % 2 == 0 else "align1"


def tc_k16(d: int) -> float:
    """Paper §3.3: Tensor Core K%16 (+70% when misaligned to 16)."""
    return 0.001 * d * (1.0 if d % 16 == 0 else 1.7)


def sdpa_rows(dims=range(64, 257), **kw) -> list[dict]:
    return rows_for(
        "sdpa_head_dim",
        "sdpa",
        "head_dim",
        dims,
        fa2_sdpa,
        backend=lambda d: "flash" if d % 8 == 0 else "math",
        **kw,
    )


def gemm_rows(
    axis: str = "K", dims=range(64, 129), fn=cublas_tiers, sweep: str | None = None, **kw
) -> list[dict]:
    return rows_for(sweep or f"gemm_{axis}", "gemm", axis, dims, fn, tier=tier_name, **kw)
