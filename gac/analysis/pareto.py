"""Quality against measured latency: the plans by parameters (unaligned, gac) beside the plans by latency
(``gac_latency``), one point per record, for the Pareto figure (:func:`gac.analysis.figures.plot_latency_pareto`).

The latency of a point is **measured**: the side-by-side bench's median at (batch 1, ``seq_len``) with its paired
95% interval when one bench measured every point (``gac bench``), else each job's own ``prefill_ms`` (timed alone,
no interval). A latency-budget point also carries its budget and its table latency (what the plan was solved
against: measured kernels plus the fixed rest, or predicted).
"""

from __future__ import annotations

import math

import pandas as pd

from gac.analysis.benches import bench_source, pick_bench
from gac.analysis.labels import (
    baseline_mask,
    budget_note,
    is_baseline,
    method_label,
    method_order,
    ppl_column,
    row_number,
)
from gac.analysis.selection import resolve_point
from gac.errors import GacError
from gac.registry import BASELINE_STRATEGY

PARETO_STRATEGIES = ("unaligned", "gac", "gac_latency")
COLUMNS = ["method", "compressor", "strategy", "ratio", "key", "quality", "latency_ms", "lo_ms", "hi_ms",
           "budget_ms", "table_ms", "budget", "params", "bench_check", "budget_measured_ms"]


def latency_pareto(df: pd.DataFrame, *, model: str | None = None, gpu: str | None = None,
                   seq_len: int | None = None, bench=None) -> pd.DataFrame:
    """One row per record (the baseline first): ``method, compressor, strategy, ratio, key, quality`` (the
    perplexity), ``latency_ms`` (measured), ``lo_ms``/``hi_ms`` (the bench's 95% interval, NaN without a bench),
    ``budget_ms``, ``table_ms`` and ``budget`` (a latency-budget plan's note), ``params``. ``attrs``: ``quality``
    (the perplexity column), ``source`` (how latency was measured), ``model``, ``gpu``, ``seq_len``."""
    what = "latency Pareto"
    bench = df.attrs.get("bench") if bench is None else bench
    df, model, gpu, seq_len = resolve_point(df, model, gpu, seq_len, what)
    quality = ppl_column(df)
    comp = df[~baseline_mask(df) & df["strategy"].astype(str).isin(PARETO_STRATEGIES)]
    if not (comp["strategy"].astype(str) == "gac_latency").any():
        raise GacError(f"{what}: no gac_latency records for {model} on {gpu}; run align=gac_latency jobs "
                       f"(experiment=latency_budget)")
    rows = pd.concat([df[baseline_mask(df)].head(1), comp])
    keys = [str(k) for k in comp["key"]]
    hit = pick_bench(bench, keys, model, 1, seq_len) if seq_len is not None else None
    out = []
    for _, rec in rows.iterrows():
        base = is_baseline(rec["compressor"], rec["strategy"])
        r = {"method": pareto_label(rec), "compressor": str(rec["compressor"]),
             "strategy": BASELINE_STRATEGY if base else str(rec["strategy"]), "ratio": row_number(rec, "ratio"),
             "key": str(rec["key"]), "quality": row_number(rec, quality), "params": row_number(rec, "params"),
             "budget_ms": row_number(rec, "latency_budget_ms"), "table_ms": row_number(rec, "latency_table_ms"),
             "budget": budget_note(rec), "lo_ms": math.nan, "hi_ms": math.nan}
        if hit is not None:
            pt = hit[1]
            v = None if base else pt["variants"][str(rec["key"])]
            r["latency_ms"] = pt["baseline_ms"] if v is None else v["ms"]
            if v is not None and v["lo"] is not None and pt["baseline_ms"]:
                r["lo_ms"], r["hi_ms"] = v["lo"] * pt["baseline_ms"], v["hi"] * pt["baseline_ms"]
        else:
            r["latency_ms"] = row_number(rec, "prefill_ms")
        out.append(r)
    for r, (_, rec) in zip(out, rows.iterrows()):  # a latency-budget plan against its reference plan's point
        budget = latency_budget_of(rec)
        ref = _reference(r, budget[0], out) if budget is not None and budget[0] is not None else None
        r["budget_measured_ms"] = _budget_measured(budget, ref)
        r["bench_check"] = "" if budget is None or hit is None else bench_check(r, budget, ref, hit[1])
    frame = pd.DataFrame(out, columns=COLUMNS)
    frame["_order"] = [method_order(c, s) for c, s in zip(frame["compressor"], frame["strategy"])]
    frame = frame.sort_values(["_order", "latency_ms"], kind="stable").drop(columns="_order").reset_index(drop=True)
    source = bench_source(hit[0]) if hit is not None else \
        "latency: each job's own prefill_ms, timed alone (run `gac bench` for a side-by-side measurement with CIs)"
    frame.attrs.update(quality=quality, source=source, model=model, gpu=gpu,
                       seq_len=None if seq_len is None else int(seq_len),
                       device=hit[0].get("device") if hit is not None else None)
    return frame


def latency_budget_of(rec) -> tuple[str | None, float, float] | None:
    """A latency-budget plan's ``(reference, share, budget_ms)`` (reference None: an absolute budget in ms); None for
    a plan by parameters or a ``min_latency`` plan (no latency budget). ``rec``: a results-frame row."""
    if str(rec["strategy"]) != "gac_latency" or rec.get("budget_kind") == "min_latency":
        return None
    ref, share = rec.get("latency_reference"), row_number(rec, "latency_share")
    if not isinstance(ref, str) or math.isnan(share):
        return None, math.nan, row_number(rec, "latency_budget_ms")
    return ref, share, row_number(rec, "latency_budget_ms")


def _budget_measured(budget: tuple | None, ref: dict | None) -> float:
    """A latency budget on the measured axis: its share of its reference plan's measured latency, or its absolute
    ms; NaN without a budget or a measured reference. A budget by its table is in the table's units, which are not
    the measurement's."""
    if budget is None:
        return math.nan
    strategy, share, budget_ms = budget
    if strategy is None:
        return budget_ms
    return share * ref["latency_ms"] if ref is not None else math.nan


def _reference(point: dict, strategy: str, out: list[dict]) -> dict | None:
    """The Pareto point of ``strategy`` at ``point``'s compressor and ratio (a latency budget's reference plan)."""
    return next((o for o in out if o["compressor"] == point["compressor"] and o["strategy"] == strategy
                 and o["ratio"] == point["ratio"]), None)


def bench_check(point: dict, budget: tuple, ref: dict | None, bench_point: dict) -> str:
    """Whether the side-by-side bench confirms a latency-budget plan's budget, in the bench's own measurements.

    A budget as a share of a reference plan (``latency <= 1 x gac``) is checked as the paired ratio of the plan's
    rounds to its reference's (the same compressor and ratio, measured in the same bench) against the share: the
    table that chose the plan and the bench time the same kernels but not the same whole prefill, so the check is
    relative. An absolute budget (ms) is checked against the plan's measured interval. ``confirmed``: the whole 95%
    interval is within the budget; ``within CI``: the budget lies inside it; ``over``: the whole interval is above.
    ``point``/``ref``: Pareto points (the plan's, its reference plan's); ``budget``: :func:`latency_budget_of`;
    ``bench_point``: the bench summary's point."""
    from gac.stats import paired_ratio_ci

    variants = bench_point["variants"]
    mine = variants.get(point["key"]) or {}
    strategy, share, budget_ms = budget
    if strategy is not None:
        theirs = variants.get(ref["key"]) if ref is not None else None
        if not theirs or not mine.get("samples") or not theirs.get("samples"):
            return f"not checked: the {strategy} plan at ratio {point['ratio']:g} was not in the bench"
        r, lo, hi = paired_ratio_ci(mine["samples"], theirs["samples"])
        what, limit = f"{r:.3f} [{lo:.3f}, {hi:.3f}] x {strategy}, budget {share:g} x", share
    else:
        if math.isnan(budget_ms) or mine.get("lo") is None or not bench_point.get("baseline_ms"):
            return "not checked: no absolute budget or no interval"
        lo, hi = mine["lo"] * bench_point["baseline_ms"], mine["hi"] * bench_point["baseline_ms"]
        what, limit = f"{mine['ms']:.4g} ms [{lo:.4g}, {hi:.4g}], budget {budget_ms:.4g} ms", budget_ms
    verdict = "confirmed" if hi <= limit else "over" if lo > limit else "within CI"
    return f"{what}: {verdict}"


def pareto_label(rec) -> str:
    """A point's series: its method, and for a latency-budget plan its kind of budget (``ASVD (GAC, latency at GAC's)``,
    ``ASVD (GAC, latency <= 0.9 x unaligned)``, ``ASVD (GAC, latency <= 12 ms)``), so budgets of different kinds
    are different series."""
    label = method_label(rec["compressor"], rec["strategy"])
    if str(rec["strategy"]) != "gac_latency":
        return label
    kind, ref, share, ms = (rec.get(k) for k in ("budget_kind", "latency_reference", "latency_share",
                                                 "latency_budget_ms"))
    if kind == "min_latency":
        what = "min latency"
    elif isinstance(ref, str) and isinstance(share, float) and share == share:
        what = "latency at GAC's" if ref == "gac" and share == 1.0 else f"latency <= {share:g} x {ref}"
    else:
        what = f"latency <= {ms:.4g} ms" if isinstance(ms, float) and ms == ms else "latency"
    return label.replace("latency)", what + ")")


def pareto_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The Pareto frame as a table: one row per point, its quality, measured latency (with interval), budget and
    table latency."""
    cols = ["ratio", "quality", "latency_ms", "lo_ms", "hi_ms", "budget_ms", "table_ms", "params", "budget"]
    if frame["bench_check"].astype(bool).any():
        cols.append("bench_check")
    t = frame.set_index("method")[cols]
    t = t.rename(columns={"quality": frame.attrs.get("quality", "quality"), "latency_ms": "measured (ms)",
                          "lo_ms": "CI95 low (ms)", "hi_ms": "CI95 high (ms)", "budget_ms": "budget (ms)",
                          "table_ms": "table (ms)", "budget": "latency budget (by its table)",
                          "bench_check": "measured against the budget (bench)"})
    t.attrs["formats"] = {"ratio": "{:g}", frame.attrs.get("quality", "quality"): "{:.2f}", "measured (ms)": "{:.3f}",
                          "CI95 low (ms)": "{:.3f}", "CI95 high (ms)": "{:.3f}", "budget (ms)": "{:.3f}",
                          "table (ms)": "{:.3f}", "params": "{:,.0f}"}
    return t
