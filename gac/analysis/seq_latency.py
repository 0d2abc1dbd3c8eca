"""Latency by sequence length (Figure 10) from the tidy results frame (:func:`gac.analysis.load_results`):
each method's prefill latency and its change against the baseline at every measured (batch, length), from a
side-by-side bench where one measured every row, else each job's own numbers.

The filters and what a table may hold are the package's rule (:mod:`gac.analysis`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from gac.analysis.benches import bench_source, latest_bench
from gac.analysis.labels import baseline_mask, is_baseline, method_label, method_order
from gac.analysis.load import parse_seq_metric
from gac.analysis.selection import LATENCY_AXES, completed, filter_settings, one_proxy, one_setting, resolve
from gac.errors import GacError
from gac.registry import BASELINE, BASELINE_STRATEGY


def latency_vs_seq_len(
    df: pd.DataFrame,
    *,
    model: str | None = None,
    gpu: str | None = None,
    ratio: float | None = None,
    proxy: str | Mapping[str, str] | None = None,
    strategies: Sequence[str] = ("unaligned", "gac"),
    metric: str = "prefill_ms",
    bench: Sequence[Mapping] | None = None,
    where: Mapping[str, object] | None = None,
) -> pd.DataFrame:
    """Latency by sequence length (Figure 10) from the ``<metric>@S`` / ``<metric>@bB_S`` columns: a long frame
    ``method, compressor, strategy, batch, seq_len, latency_ms, change_lo, change_hi, change_pct`` (change against
    the baseline at the same batch and length, in %; NaN on baseline rows and without a baseline; ``change_lo`` /
    ``change_hi``: the bench's 95% interval of the change where the latency came from a side-by-side bench)."""
    what = "latency vs sequence length"
    bench = df.attrs.get("bench") if bench is None else bench
    df = completed(df)
    cols = {c: parse_seq_metric(c) for c in df.columns}
    cols = {c: p for c, p in cols.items() if p is not None and p[0] == metric}
    benched = {k for b in (bench or []) for p in (b.get("points") or {}).values() for k in p["variants"]} \
        if metric == "prefill_ms" else set()
    if not cols and not benched:
        raise GacError(f"{what}: no '{metric}@<seq_len>' columns in the results; measure latency at several "
                       f"sequence lengths (eval latency seq_lens, or gac bench --point ...)")
    has = df[list(cols)].notna().any(axis=1) if cols else pd.Series(False, index=df.index)
    df = df[has | df["key"].astype(str).isin(benched) | (baseline_mask(df) & bool(benched))]
    df, model = resolve(df, "model", model, what)
    df, gpu = resolve(df, "gpu", gpu, what)
    base = df[baseline_mask(df)]
    comp = df[~baseline_mask(df) & df["strategy"].astype(str).isin([str(s) for s in strategies])]
    comp, ratio = resolve(comp, "ratio", ratio, what) if not comp.empty else (comp, ratio)
    comp = one_proxy(comp, proxy, what)
    both = one_setting(filter_settings(pd.concat([base, comp]), where, what), what, axes=LATENCY_AXES)
    rows = []
    recs = both.to_dict("records")
    source = None
    if metric == "prefill_ms" and bench:  # the latest bench that measured every compressed row, at all its points
        keys = {str(r["key"]) for r in recs if not is_baseline(r["compressor"], r["strategy"])}
        source = latest_bench(bench, model, lambda b: bool(keys) and all(
            keys <= set(p["variants"]) for p in (b.get("points") or {}).values()))
        if source is not None:
            cols = {n: ("prefill_ms", int(p["batch"]), int(p["seq_len"])) for n, p in source["points"].items()}
    if source is not None:  # the bench's own baseline (a baseline record is not needed)
        recs = [{"compressor": BASELINE, "strategy": BASELINE_STRATEGY, "key": None}] + \
            [r for r in recs if not is_baseline(r["compressor"], r["strategy"])]
    for rec in recs:
        for c, (_, batch, seq) in cols.items():
            lo = hi = None
            if source is not None:
                pt = source["points"][c]
                base_row = is_baseline(rec["compressor"], rec["strategy"])
                var = {} if base_row else (pt["variants"].get(str(rec["key"])) or {})
                v = pt["baseline_ms"] if base_row else var.get("ms")
                lo, hi = var.get("lo"), var.get("hi")
            else:
                v = rec.get(c)
            if v is None or math.isnan(v):
                continue
            rows.append({"method": method_label(rec["compressor"], rec["strategy"]),
                         "compressor": rec["compressor"],
                         "strategy": (BASELINE_STRATEGY if is_baseline(rec["compressor"], rec["strategy"])
                                      else rec["strategy"]),
                         "batch": batch, "seq_len": seq, "latency_ms": float(v),
                         "_ratio": math.nan if source is None or var.get("ratio") is None else float(var["ratio"]),
                         "change_lo": math.nan if lo is None else 100.0 * (lo - 1.0),
                         "change_hi": math.nan if hi is None else 100.0 * (hi - 1.0)})
    out = pd.DataFrame(rows, columns=["method", "compressor", "strategy", "batch", "seq_len", "latency_ms",
                                      "_ratio", "change_lo", "change_hi"])
    b = out[out["strategy"] == BASELINE_STRATEGY].set_index(["batch", "seq_len"])["latency_ms"]
    out["change_pct"] = [100.0 * (v / b[(bt, s)] - 1.0) if (bt, s) in b.index and st != BASELINE_STRATEGY else math.nan
                         for bt, s, v, st in zip(out["batch"], out["seq_len"], out["latency_ms"], out["strategy"])]
    paired = out["_ratio"].notna()  # from a bench: its own paired ratio (what the interval is about)
    out.loc[paired, "change_pct"] = 100.0 * (out.loc[paired, "_ratio"] - 1.0)
    out = out.drop(columns="_ratio")
    out.attrs["selection"] = {"model": model, "gpu": gpu, "ratio": ratio, "metric": metric}
    out.attrs["device"] = source.get("device") if source is not None else None
    out.attrs["source"] = bench_source(source) if source is not None else \
        "latency: per-job smoke numbers, each job timed alone (run `gac bench` for side-by-side ratios)"
    out["_order"] = [method_order(c, s) for c, s in zip(out["compressor"], out["strategy"])]
    out = out.sort_values(["batch", "_order", "seq_len"], kind="stable").drop(columns="_order")
    return out.reset_index(drop=True)


def latency_table(lat: pd.DataFrame, batch: int = 1) -> pd.DataFrame:
    """Latency (ms) and change against the baseline by method (rows) and sequence length (columns)."""
    sel = lat[lat["batch"] == batch]
    if sel.empty:
        return pd.DataFrame()
    methods = list(dict.fromkeys(sel["method"]))
    seqs = sorted(sel["seq_len"].unique())
    table = pd.DataFrame(index=pd.Index(methods, name=f"Method (batch {batch})"))
    fm = {}
    for s in seqs:
        one = sel[sel["seq_len"] == s].set_index("method")
        table[f"S={s} (ms)"] = one["latency_ms"].reindex(methods).to_numpy()
        table[f"S={s} vs. base"] = one["change_pct"].reindex(methods).to_numpy()
        fm[f"S={s} (ms)"], fm[f"S={s} vs. base"] = "{:.1f}", "{:+.0f}%"
    table.attrs["formats"] = fm
    return table
