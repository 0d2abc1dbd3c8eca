"""A device's kernel profile (:mod:`gac.profiling`) as tables: the profile as a tidy frame, and per kernel sweep the
staircase (latency of aligned against misaligned dims, the worst misalignment penalty)."""

from __future__ import annotations

import math

import pandas as pd

from gac.align.candidates import DEFAULT_UNIT
from gac.errors import GacError


def profile_table(profile) -> pd.DataFrame:
    """A kernel profile as a tidy frame: a :class:`gac.profiling.HardwareProfile`, its directory, or a
    DataFrame with at least ``sweep, dim, latency_ms`` (optional ``op, axis, backend, tflops, tier, kernel``)."""
    if isinstance(profile, pd.DataFrame):
        table = profile
    elif hasattr(profile, "table") and isinstance(profile.table, pd.DataFrame):
        table = profile.table
    else:
        from gac.profiling import load_profile  # imports torch: only when a path is given

        table = load_profile(profile).table
    missing = [c for c in ("sweep", "dim", "latency_ms") if c not in table.columns]
    if missing:
        raise GacError(f"kernel profile table lacks columns {missing}; expected a gac HardwareProfile table "
                       f"(sweep, op, axis, dim, backend, latency_ms, tflops, ...)")
    out = table.copy()
    for c, default in (("op", ""), ("axis", "dim"), ("backend", "auto"), ("tier", ""), ("kernel", ""),
                       ("context", "")):
        if c not in out.columns:
            out[c] = default
        out[c] = out[c].astype("object").where(out[c].notna(), default).astype(str)
    if "tflops" not in out.columns:
        out["tflops"] = math.nan
    out["dim"] = pd.to_numeric(out["dim"]).astype("int64")
    out["latency_ms"] = pd.to_numeric(out["latency_ms"]).astype("float64")
    return out


def staircase_summary(table: pd.DataFrame, unit: int = DEFAULT_UNIT, backend: str | None = "auto") -> pd.DataFrame:
    """Per kernel sweep: dims swept, median latency of ``unit``-aligned and misaligned dims, and the worst
    misalignment penalty: ``max over misaligned d of latency(d) / latency(next aligned d above) - 1`` (%)."""
    t = profile_table(table)
    t = t[(t["context"] == "")]
    if backend is not None:
        t = t[t["backend"] == backend]
    rows = []
    for sweep, g in t.groupby("sweep", sort=True):
        g = g.groupby("dim")["latency_ms"].median()
        aligned = g[g.index % unit == 0]
        mis = g[g.index % unit != 0]
        worst = math.nan
        for d, v in mis.items():
            up = aligned[aligned.index > d]
            if len(up):
                worst = max(worst if not math.isnan(worst) else -math.inf, 100.0 * (v / up.iloc[0] - 1.0))
        rows.append((sweep, {"dims": float(len(g)), "from": float(g.index.min()), "to": float(g.index.max()),
                             "aligned median (ms)": float(aligned.median()) if len(aligned) else math.nan,
                             "misaligned median (ms)": float(mis.median()) if len(mis) else math.nan,
                             "worst penalty (%)": worst}))
    out = pd.DataFrame([r for _, r in rows], index=pd.Index([s for s, _ in rows], name="Sweep"))
    out.attrs["formats"] = {"dims": "{:.0f}", "from": "{:.0f}", "to": "{:.0f}", "aligned median (ms)": "{:.4g}",
                            "misaligned median (ms)": "{:.4g}", "worst penalty (%)": "{:+.0f}%"}
    return out
