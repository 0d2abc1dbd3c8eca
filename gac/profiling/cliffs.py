"""Cliff detection: which dimensions a measured profile punishes, and why (paper Tables 2-4).

Definitions (all computed from the measured table, nothing typed in):

- **cliff**: a dimension d whose latency exceeds that of some *larger* measured dimension d' (within
  ``horizon``) by more than ``tolerance``: ``lat(d) > (1 + tolerance) * lat(d')``. A larger shape does
  more work, so being slower than it means d triggers a worse backend, kernel or tile. With ``robust``
  the trials must not overlap either (``min(d) > max(d')``), so timing noise does not make cliffs.
- **alignment rule** ``(period p, residues R)``: dims with ``d % p in R`` are (almost) all cliffs — at least
  ``min_fraction`` of each residue class with ``min_count`` or more samples. The *constraint* of a sweep is
  the largest p whose every non-zero residue is slow (``d % p == 0`` required), as in Table 4.
- **step**: among non-cliff dims, consecutive a < b where latency jumps by more than the size ratio allows:
  ``lat(b) / lat(a) > (b / a) * (1 + tolerance)`` — FA2's template staircase, cuBLAS kernel switches. The gcd
  of two or more step boundaries is reported as the staircase period (Table 2).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
import pandas as pd

from gac.profiling.kernels import mma_instruction

DEFAULT_TOLERANCE = 0.05
DEFAULT_HORIZON = 64
PERIODS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Rule:
    """Dims with ``d % period in residues`` are slow; ``penalty`` is the median slowdown vs the best larger dim."""

    period: int
    residues: tuple[int, ...]
    penalty: float
    max_penalty: float
    n_dims: int
    full: bool  # every non-zero residue with data is slow: "d % period == 0" is required

    def violated_by(self, d: int) -> bool:
        return int(d) % self.period in self.residues

    def describe(self, axis: str = "d") -> str:
        if self.full:
            return f"{axis}%{self.period}=0"
        return f"{axis}%{self.period}∉{{{','.join(map(str, self.residues))}}}"


def curve(
    table: pd.DataFrame, sweep: str | None = None, backend: str = "auto", context: str | None = None
) -> pd.DataFrame:
    """One latency curve: ``dim, latency_ms, latency_min_ms, latency_max_ms`` (supported rows, median of repeats)."""
    t = table
    if sweep is not None:
        t = t[t["sweep"] == sweep]
    if context is not None:
        t = t[t["context"] == context]
    if backend is not None and "backend" in t:
        t = t[t["backend"] == backend]
    if "supported" in t:
        t = t[t["supported"].fillna(True).astype(bool)]
    t = t[t["latency_ms"].notna()]
    cols = [c for c in ("latency_ms", "latency_min_ms", "latency_max_ms") if c in t]
    out = t.groupby(t["dim"].astype("int64"))[cols].median().reset_index().sort_values("dim")
    for c in ("latency_min_ms", "latency_max_ms"):
        if c not in out:
            out[c] = np.nan
    return out.reset_index(drop=True)


def penalties(
    c: pd.DataFrame,
    tolerance: float = DEFAULT_TOLERANCE,
    horizon: int | None = DEFAULT_HORIZON,
    robust: bool = True,
) -> pd.DataFrame:
    """Per dim: the fastest larger dim within ``horizon``, the penalty against it, and whether d is a cliff."""
    dims = c["dim"].to_numpy(dtype=np.int64)
    lat = c["latency_ms"].to_numpy(dtype=float)
    lo = c["latency_min_ms"].to_numpy(dtype=float)
    hi = c["latency_max_ms"].to_numpy(dtype=float)
    better_dim = np.full(len(dims), -1, dtype=np.int64)
    better_ms = np.full(len(dims), np.nan)
    penalty = np.zeros(len(dims))
    cliff = np.zeros(len(dims), dtype=bool)
    for i in range(len(dims)):
        j_end = len(dims) if horizon is None else np.searchsorted(dims, dims[i] + horizon, side="right")
        if j_end <= i + 1:
            continue
        j = i + 1 + int(np.argmin(lat[i + 1 : j_end]))
        better_dim[i], better_ms[i] = dims[j], lat[j]
        penalty[i] = lat[i] / lat[j] - 1.0
        cliff[i] = penalty[i] > tolerance
        if robust and cliff[i] and not (np.isnan(lo[i]) or np.isnan(hi[j])):
            cliff[i] = lo[i] > hi[j]
    return pd.DataFrame(
        {
            "dim": dims,
            "latency_ms": lat,
            "better_dim": better_dim,
            "better_ms": better_ms,
            "penalty": penalty,
            "cliff": cliff,
        }
    )


def find_cliffs(
    c: pd.DataFrame,
    tolerance: float = DEFAULT_TOLERANCE,
    horizon: int | None = DEFAULT_HORIZON,
    robust: bool = True,
) -> pd.DataFrame:
    """The cliff dims of one curve (see module docstring), with the larger dim that beats each."""
    p = penalties(c, tolerance, horizon, robust)
    return p[p["cliff"]].reset_index(drop=True)


def alignment_rules(
    pen: pd.DataFrame,
    periods: Sequence[int] = PERIODS,
    min_fraction: float = 0.75,
    min_count: int = 2,
    min_count_partial: int = 3,
) -> list[Rule]:
    """Period/residue classes that are (almost) all cliffs, from the output of :func:`penalties`.

    A period is *fully* required when every non-zero residue class with ``min_count`` samples is slow. Other
    slow residues are kept as partial rules only when they have ``min_count_partial`` samples and are not
    already implied by a smaller period's slow residues (so noise at large periods does not make rules).
    """
    rules: list[Rule] = []
    dims = pen["dim"].to_numpy(dtype=np.int64)
    cl = pen["cliff"].to_numpy(dtype=bool)
    has_better = pen["better_dim"].to_numpy() >= 0
    pv = pen["penalty"].to_numpy(dtype=float)

    def implied(p: int, r: int) -> bool:
        return any(p % q.period == 0 and (r % q.period) in q.residues for q in rules)

    for p in periods:
        slow, seen, counts = [], [], {}
        for r in range(1, p):
            m = (dims % p == r) & has_better
            counts[r] = int(m.sum())
            if counts[r] < min_count:
                continue
            seen.append(r)
            if cl[m].mean() >= min_fraction:
                slow.append(r)
        full = bool(slow) and len(slow) == len(seen)
        if not full:
            slow = [r for r in slow if counts[r] >= min_count_partial and not implied(p, r)]
        if slow:
            m = np.isin(dims % p, slow) & has_better
            rules.append(
                Rule(p, tuple(slow), float(np.median(pv[m])), float(pv[m].max()), int(m.sum()), full=full)
            )
    return rules


def constraint(rules: Sequence[Rule]) -> Rule | None:
    """The largest period whose alignment is fully required, or None."""
    full = [r for r in rules if r.full]
    return max(full, key=lambda r: r.period) if full else None


def find_steps(
    c: pd.DataFrame, pen: pd.DataFrame, tolerance: float = DEFAULT_TOLERANCE, robust: bool = True
) -> pd.DataFrame:
    """Latency jumps between consecutive non-cliff dims larger than their size ratio explains."""
    ok = c[~pen["cliff"].to_numpy()].reset_index(drop=True)
    rows = []
    for i in range(len(ok) - 1):
        a, b = ok.iloc[i], ok.iloc[i + 1]
        ratio = b["latency_ms"] / a["latency_ms"]
        size = b["dim"] / a["dim"]
        step = ratio > size * (1 + tolerance)
        if robust and step and not (np.isnan(b["latency_min_ms"]) or np.isnan(a["latency_max_ms"])):
            step = b["latency_min_ms"] > a["latency_max_ms"] * size
        if step:
            rows.append(
                {
                    "before": int(a["dim"]),
                    "after": int(b["dim"]),
                    "before_ms": float(a["latency_ms"]),
                    "after_ms": float(b["latency_ms"]),
                    "jump": float(ratio - 1.0),
                }
            )
    return pd.DataFrame(rows, columns=["before", "after", "before_ms", "after_ms", "jump"])


def step_period(steps: pd.DataFrame, min_period: int = 4) -> int | None:
    """The gcd of the step boundaries when there are two or more and it is at least ``min_period``."""
    if len(steps) < 2:
        return None
    g = reduce(math.gcd, steps["before"].astype(int).tolist())
    return g if g >= min_period else None


@dataclass
class SweepAnalysis:
    """Everything cliff detection says about one curve."""

    sweep: str
    axis: str
    penalties: pd.DataFrame
    rules: list[Rule]
    steps: pd.DataFrame

    @property
    def cliffs(self) -> list[int]:
        return self.penalties.loc[self.penalties["cliff"], "dim"].astype(int).tolist()

    @property
    def constraint(self) -> Rule | None:
        return constraint(self.rules)

    @property
    def dim_range(self) -> tuple[int, int]:
        d = self.penalties["dim"]
        return (int(d.min()), int(d.max())) if len(d) else (0, -1)

    def slow(self, d: int) -> list[str]:
        """Why ``d`` is slow on this curve (empty: not slow): a measured cliff or a violated rule."""
        why = []
        lo, hi = self.dim_range
        pen = self.penalties
        if lo <= d <= hi:
            hit = pen[(pen["dim"] == d) & pen["cliff"]]
            if len(hit):
                r = hit.iloc[0]
                why.append(
                    f"{self.sweep}: {self.axis}={d} is {100 * r['penalty']:.0f}% slower than "
                    f"{self.axis}={int(r['better_dim'])}"
                )
        for rule in self.rules:
            if rule.violated_by(d):
                why.append(
                    f"{self.sweep}: violates {rule.describe(self.axis)} (median penalty {100 * rule.penalty:.0f}%)"
                )
        return why


def analyze(
    table: pd.DataFrame,
    sweep: str,
    tolerance: float = DEFAULT_TOLERANCE,
    horizon: int | None = DEFAULT_HORIZON,
    robust: bool = True,
    context: str | None = None,
    min_fraction: float = 0.75,
    min_count: int = 2,
    min_count_partial: int = 3,
) -> SweepAnalysis:
    c = curve(table, sweep, context=context)
    pen = penalties(c, tolerance, horizon, robust)
    axis_vals = table.loc[table["sweep"] == sweep, "axis"]
    axis = str(axis_vals.iloc[0]) if len(axis_vals) else "d"
    axis = "d" if axis == "head_dim" else axis
    return SweepAnalysis(
        sweep,
        axis,
        pen,
        alignment_rules(
            pen, min_fraction=min_fraction, min_count=min_count, min_count_partial=min_count_partial
        ),
        find_steps(c, pen, tolerance, robust),
    )


# ----------------------------------------------------------------------------------------------- summaries


def _level(sweep: str) -> str:
    if sweep.startswith("sdpa"):
        return "Framework"
    if sweep.startswith(("gemm_tput", "l2_")):
        return "Hardware"
    if sweep.startswith(("gemm", "gemv")):
        return "Library"
    return "Target"


def _mode(values) -> str:
    vals = [v for v in values if v]
    return Counter(vals).most_common(1)[0][0] if vals else ""


def _mechanism(table: pd.DataFrame, a: SweepAnalysis, slow_dims: set[int]) -> str:
    t = table[(table["sweep"] == a.sweep) & (table["backend"] == "auto")]
    col = "selected_backend" if a.sweep.startswith("sdpa") else "tier"
    fast = _mode(t.loc[~t["dim"].isin(slow_dims), col].tolist())
    slow = _mode(t.loc[t["dim"].isin(slow_dims), col].tolist())
    if a.sweep.startswith("sdpa"):
        return (
            f"SDPA backend ({fast}→{slow})"
            if fast and slow and fast != slow
            else f"SDPA ({fast or 'kernel'})"
        )
    if a.sweep.startswith("gemm_tput"):
        return f"GEMM throughput ({a.axis})"
    op = "GEMV" if a.sweep.startswith("gemv") else "GEMM"
    if fast and slow and fast != slow and "unknown" not in (fast, slow):
        return f"{op} kernel tier ({fast}→{slow})"
    return f"{op} {a.axis}"


def summarize(
    table: pd.DataFrame,
    tolerance: float = DEFAULT_TOLERANCE,
    horizon: int | None = DEFAULT_HORIZON,
    robust: bool = True,
    sweeps: Sequence[str] | None = None,
) -> pd.DataFrame:
    """A Table 4-like summary: one row per sweep constraint and per staircase, computed from the data."""
    rows = []
    from gac.profiling.profile import is_derived_sweep

    names = sweeps or sorted(s for s in table["sweep"].unique() if s != "target" and not is_derived_sweep(s))
    for sweep in names:
        a = analyze(table, sweep, tolerance, horizon, robust)
        if not len(a.penalties):
            continue
        dims = a.penalties["dim"].astype(int)
        rule = a.constraint
        if rule is not None:
            slow = a.penalties[dims % rule.period != 0]
            slow = slow[slow["better_dim"] >= 0]
            slow_dims = set(slow["dim"].astype(int))
            rows.append(
                {
                    "level": _level(sweep),
                    "sweep": sweep,
                    "mechanism": _mechanism(table, a, slow_dims),
                    "constraint": rule.describe(a.axis),
                    "penalty_pct": round(100 * float(slow["penalty"].median()), 1),
                    "max_penalty_pct": round(100 * float(slow["penalty"].max()), 1),
                    "n_dims": len(dims),
                    "cliffs": len(a.cliffs),
                }
            )
        for extra in a.rules:
            if not extra.full and (rule is None or extra.period > rule.period):
                rows.append(
                    {
                        "level": _level(sweep),
                        "sweep": sweep,
                        "mechanism": _mechanism(table, a, set()),
                        "constraint": extra.describe(a.axis),
                        "penalty_pct": round(100 * extra.penalty, 1),
                        "max_penalty_pct": round(100 * extra.max_penalty, 1),
                        "n_dims": len(dims),
                        "cliffs": len(a.cliffs),
                    }
                )
        if len(a.steps):
            period = step_period(a.steps)
            if period:
                what = f"{a.axis}%{period}=0 boundaries"
            else:
                s = a.steps.loc[a.steps["jump"].idxmax()]
                what = f"step {a.axis}={int(s['before'])}→{int(s['after'])}"
            mech = "tile/template staircase" if sweep.startswith("sdpa") else "kernel switch"
            rows.append(
                {
                    "level": _level(sweep),
                    "sweep": sweep,
                    "mechanism": mech,
                    "constraint": what,
                    "penalty_pct": round(100 * float(a.steps["jump"].median()), 1),
                    "max_penalty_pct": round(100 * float(a.steps["jump"].max()), 1),
                    "n_dims": len(dims),
                    "cliffs": len(a.cliffs),
                }
            )
        if rule is None and not len(a.steps) and not any(not r.full for r in a.rules):
            rows.append(
                {
                    "level": _level(sweep),
                    "sweep": sweep,
                    "mechanism": _mechanism(table, a, set()),
                    "constraint": "none (flat)",
                    "penalty_pct": 0.0,
                    "max_penalty_pct": 0.0,
                    "n_dims": len(dims),
                    "cliffs": len(a.cliffs),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "level",
            "sweep",
            "mechanism",
            "constraint",
            "penalty_pct",
            "max_penalty_pct",
            "n_dims",
            "cliffs",
        ],
    )


def _condition(dims: Sequence[int]) -> str:
    dims = [int(d) for d in dims]
    if dims and all(d % 2 for d in dims):
        return "odd"
    g = reduce(math.gcd, dims, 0)
    p = g & -g if g else 0  # the largest power of two dividing every dim
    return f"d%{p}=0" if p > 1 else "any"


def tier_table(table: pd.DataFrame) -> pd.DataFrame:
    """Kernel tiers seen in the GEMM/GEMV sweeps (Table 3): condition (from the dims), kernel, MMA shape."""
    from gac.profiling.profile import is_derived_sweep

    t = table[(table["op"].isin(["gemm", "gemv"])) & (table["backend"] == "auto")]
    t = t[~t["sweep"].astype(str).map(is_derived_sweep)]
    rows = []
    for (op, tier), g in t.groupby(["op", "tier"]):
        kernel = _mode(g["kernel"].tolist())
        rows.append(
            {
                "op": op,
                "tier": tier,
                "condition": _condition(g["dim"].tolist()),
                "kernel": kernel,
                "mma": mma_instruction(kernel) or "",
                "n_shapes": len(g),
            }
        )
    return pd.DataFrame(rows, columns=["op", "tier", "condition", "kernel", "mma", "n_shapes"])


def sdpa_backend_table(table: pd.DataFrame) -> pd.DataFrame:
    """Which backend PyTorch picked for which head dims, and where each backend accepts the shape."""
    t = table[table["op"] == "sdpa"]
    rows = []
    auto = t[t["backend"] == "auto"]
    for b, g in auto.groupby("selected_backend"):
        rows.append(
            {
                "backend": b,
                "role": "selected",
                "condition": _condition(g["dim"].tolist()),
                "n_dims": len(g),
                "median_ms": float(g["latency_ms"].median()),
            }
        )
    for b, g in t[t["backend"] != "auto"].groupby("backend"):
        ok = g[g["supported"].fillna(False).astype(bool)]
        rows.append(
            {
                "backend": b,
                "role": "accepts",
                "condition": _condition(ok["dim"].tolist()) if len(ok) else "none",
                "n_dims": len(ok),
                "median_ms": float(ok["latency_ms"].median()) if len(ok) else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=["backend", "role", "condition", "n_dims", "median_ms"])
