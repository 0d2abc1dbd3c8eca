"""The paired-bootstrap ratio interval the bench reports and the analysis re-reads: one definition for both (the
bench measures, ``gac.analysis`` compares two measured variants of a stored bench later)."""

from __future__ import annotations

from collections.abc import Sequence

from gac.errors import GacError


def paired_ratio_ci(num: Sequence[float], den: Sequence[float], resamples: int = 2000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float, float]:
    """``median(num) / median(den)`` and its paired-bootstrap interval over rounds.

    ``num[i]`` and ``den[i]`` come from the same round ``i``. Each resample draws ``len(num)`` round indices with
    replacement and takes the ratio of the medians of both sides over those rounds; the interval is the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of the ``resamples`` ratios.
    """
    import numpy as np

    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise GacError(f"a paired ratio needs two equally long series of >= 2 rounds, got {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(int(resamples), len(a)))
    ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(a) / np.median(b)), float(lo), float(hi)
