"""The ratio sweep: quality and latency against the compression ratio per method, as a long frame and as a
wide table, from the tidy results frame (:func:`gac.analysis.load_results`).

The filters and what a table may hold are the package's rule (:mod:`gac.analysis`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from gac.analysis.labels import (
    PPL,
    STRATEGY_LABELS,
    TASK_FORMAT,
    baseline_mask,
    compressor_label,
    is_baseline,
    method_label,
    method_order,
    metric_label,
    ppl_column,
    sweep_metric_rank,
    sweep_task_labels,
    task_of,
)
from gac.analysis.load import row_task_data
from gac.analysis.selection import completed, filter_settings, one_proxy, one_setting, resolve
from gac.registry import BASELINE_STRATEGY


def ratio_sweep(
    df: pd.DataFrame,
    *,
    model: str | None = None,
    gpu: str | None = None,
    seq_len: int | None = None,
    compressor: str | Sequence[str] | None = None,
    proxy: str | Mapping[str, str] | None = None,
    strategies: Sequence[str] | None = None,
    metrics: Sequence[str] = (PPL, "prefill_ms"),
    where: Mapping[str, object] | None = None,
) -> pd.DataFrame:
    """PPL and latency against ratio per strategy: a long frame
    ``model, gpu, compressor, proxy, strategy, method, ratio, metric, value, task_data`` (baseline rows have
    strategy ``baseline`` and ratio 0; ``task_data``: what a task accuracy was scored on,
    :func:`gac.metrics.task_data`, None for other metrics). Records measuring none of ``metrics`` are left
    out (allocation-only runs)."""
    what = "ratio sweep"
    df = completed(df)
    metrics = [ppl_column(df) if m == PPL else m for m in metrics]
    df, model = resolve(df, "model", model, what)
    df, gpu = resolve(df, "gpu", gpu, what)
    df = df[df[[m for m in metrics if m in df.columns]].notna().any(axis=1)] if any(m in df.columns for m in metrics) else df.iloc[0:0]
    df, seq_len = resolve(df, "seq_len", seq_len, what)
    base = df[baseline_mask(df)]
    comp = df[~baseline_mask(df)]
    if compressor is not None:
        names = [compressor] if isinstance(compressor, str) else list(compressor)
        comp = comp[comp["compressor"].astype(str).isin(names)]
    if strategies is not None:
        comp = comp[comp["strategy"].astype(str).isin([str(s) for s in strategies])]
    parts = []
    for _, g in comp.groupby(["compressor", "strategy", "ratio"], sort=False):
        parts.append(one_proxy(g, proxy, what))
    comp = pd.concat(parts) if parts else comp
    both = one_setting(filter_settings(pd.concat([base, comp]), where, what), what,
                       slot=("compressor", "strategy", "ratio"), axes=("ratio",))
    rows = []
    for rec in both.to_dict("records"):
        for m in metrics:
            v = rec.get(m)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            base_row = is_baseline(rec["compressor"], rec["strategy"])
            rows.append({"model": model, "gpu": gpu, "compressor": rec["compressor"], "proxy": rec.get("proxy"),
                         "strategy": BASELINE_STRATEGY if base_row else rec["strategy"],
                         "method": method_label(rec["compressor"], rec["strategy"]),
                         "ratio": 0.0 if base_row else float(rec["ratio"]), "metric": m, "value": float(v),
                         "task_data": row_task_data(rec, task_of(m)) if task_of(m) else None})
    cols = ["model", "gpu", "compressor", "proxy", "strategy", "method", "ratio", "metric", "value",
            "task_data"]
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["compressor", "strategy", "metric", "ratio"], kind="stable").reset_index(drop=True)



def ratio_sweep_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """The long ratio sweep as a wide table: one row per (compressor, ratio), one column per (metric, strategy)."""
    comp = sweep[sweep["strategy"] != BASELINE_STRATEGY]
    if comp.empty:
        return pd.DataFrame()
    wide = comp.pivot_table(index=["compressor", "ratio"], columns=["metric", "strategy"], values="value",
                            aggfunc="first")
    order = sorted(wide.columns, key=lambda ms: (sweep_metric_rank(ms[0]), list(sweep["metric"].unique()).index(ms[0]),
                                                 method_order("x", ms[1])))
    wide = wide[order]
    labels, task_data, note = sweep_task_labels(sweep)
    accs = {f"{labels[m]} {STRATEGY_LABELS.get(s) or s}" for m, s in wide.columns if m in labels}
    wide.columns = [f"{labels.get(m) or metric_label(m)} {STRATEGY_LABELS.get(s) or s}"
                    for m, s in wide.columns]
    wide.index = pd.Index([f"{compressor_label(c)} {r:g}" for c, r in wide.index], name="Compressor, ratio")
    wide.attrs["formats"] = {c: ("{:.2f}" if c.startswith("PPL") else TASK_FORMAT if c in accs
                                 else "{:.1f}" if "(ms" in c else "{:.4g}")
                             for c in wide.columns}
    wide.attrs.update(task_data=task_data, task_note=note)
    return wide
