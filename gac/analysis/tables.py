"""The paper's tables from the tidy results frame (:func:`gac.analysis.load_results`): what each table computes.

Every function takes the frame plus optional filters (``model``, ``gpu``, ``ratio``, ...). A filter left as
``None`` must be unambiguous in the data (one value), otherwise a :class:`GacError` names the values to choose
from; which records may share a table is :mod:`gac.analysis.selection`'s rule (records that differ in a setting are
never mixed; ``where={"align.window": 8}``, ``sweep``, ``experiment`` choose). Numbers stay numbers (NaN where
not run); :func:`gac.analysis.table_format.format_table` renders them, NaN as a blank cell.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import pandas as pd

from gac.align.candidates import DEFAULT_UNIT
from gac.analysis.labels import (
    DEFAULT_ENGINE,
    PPL,
    STRATEGY_LABELS,
    baseline_mask,
    budget_note,
    compressor_label,
    compressor_order,
    engine_label,
    is_baseline,
    method_label,
    method_order,
    metric_label,
    ppl_column,
    proxy_order,
    row_number,
    rows_engine,
    sweep_metric_rank,
    sweep_task_labels,
    task_metric_labels,
    task_of,
)
from gac.analysis.load import parse_seq_metric, plan_dims, row_task_data
from gac.analysis.selection import (
    LATENCY_AXES,
    completed,
    describe_setting,
    distinct_values,
    filter_settings,
    one_proxy,
    one_setting,
    resolve,
)
from gac.errors import GacError
from gac.metrics import prefill_point
from gac.registry import BASELINE, BASELINE_LABEL, BASELINE_STRATEGY, LATENCY_STRATEGIES

log = logging.getLogger(__name__)

#: strategies whose plans budget latency (gac.registry.LATENCY_STRATEGIES): Table 5 names each row's budget
LATENCY_BUDGET_STRATEGIES = tuple(LATENCY_STRATEGIES)

#: Table 5's metric columns: (column label, metric name); a task column is labelled by the data its rows were
#: scored on (:func:`gac.analysis.labels.task_metric_labels`): ``PiQA`` for the real dataset, ``PiQA-format (enwiki)`` for a
#: look-alike set
TABLE5_METRICS = (("PPL", PPL), ("PiQA", "piqa_acc"), ("PiQA (norm)", "piqa_acc_norm"),
                  ("HSwag", "hellaswag_acc"), ("HSwag (norm)", "hellaswag_acc_norm"))
TASK_FORMAT = "{:.3f}"
PAPER_PAIR = ("unaligned", "gac")  # Table 5's rows per compressor; a missing one is said
ALIGN_COL, LAT_COL, DELTA_COL = "Align (%)", "Prefill (ms)", "vs. baseline (%)"
CI_LO_COL, CI_HI_COL = "CI95 low (%)", "CI95 high (%)"  # only when latency comes from a side-by-side bench
TABLE5_FORMATS = {ALIGN_COL: "{:.0f}%", "PPL": "{:.2f}", "PiQA": "{:.3f}", "PiQA (norm)": "{:.3f}",
                  "HSwag": "{:.3f}", "HSwag (norm)": "{:.3f}", LAT_COL: "{:.1f}", DELTA_COL: "{:+.0f}%",
                  CI_LO_COL: "{:+.1f}%", CI_HI_COL: "{:+.1f}%"}


# ---------------------------------------------------------------------------------------------- Table 5
def table5(
    df: pd.DataFrame,
    *,
    model: str | None = None,
    gpu: str | None = None,
    ratio: float | None = None,
    seq_len: int | None = None,
    proxy: str | Mapping[str, str] | None = None,
    compressors: Sequence[str] | None = None,
    strategies: Sequence[str] = ("unaligned", "gac", "authors_dp", "round_to"),
    unit: int | None = None,
    latency: str = "prefill_ms",
    bench: Sequence[Mapping] | None = None,
    where: Mapping[str, object] | None = None,
    baseline_row: bool = True,
) -> pd.DataFrame:
    """Table 5: rows Baseline, then ``<Compressor>``/``<Compressor> (GAC)`` (one per strategy) per compressor; the
    GAC authors' own rows (``authors_dp``, ``round_to``; ``stable_rank_svd``) when the records hold them.

    Columns ``Align (%)``, ``PPL``, ``PiQA``, ``PiQA (norm)``, ``HSwag``, ``HSwag (norm)``, ``Prefill (ms)``,
    ``vs. baseline (%)`` (``100 * (latency / baseline latency - 1)``, blank on the baseline row). The task
    columns are named by the data their rows were scored on (the frame's ``task_data``): ``PiQA`` for
    lm-eval's datasets (or data the records do not name), ``PiQA-format (enwiki)`` / ``HSwag-format (tiny,
    norm)`` for gac's look-alike sets (the caption says what their items are made from), ``PiQA (own
    files)``, and ``PiQA (mixed data)`` when rows differ (the caption names the sources). ``Align`` is the
    record's ``aligned_fraction`` (or the plan's at ``unit`` when given).
    Latency comes from a side-by-side bench when one
    measured every compressed row at batch 1 and ``seq_len`` (``bench``: summaries, default ``df.attrs["bench"]``
    from :func:`load_results`; the latest wins): ``Prefill (ms)`` is its median, ``vs. baseline (%)`` its ratio and
    ``CI95 low/high (%)`` the paired bootstrap interval. Otherwise latency is each job's own metric ``latency``
    (falling back to ``latency@<seq_len>``), a per-job smoke number; the caption says which. The baseline is matched on model, gpu and seq_len (not ratio). A metric a run did
    not measure is NaN. ``baseline_row=False``: a table of compressed rows only, with no warning for the missing
    baseline. ``df.attrs`` carries ``formats`` (for :func:`format_table`), ``caption``, ``task_data``
    (``{task: data}``), ``task_note`` (the caption's part about it) and ``task_columns``.
    """
    what = "Table 5"
    bench = df.attrs.get("bench") if bench is None else bench
    df = completed(df)
    df, model = resolve(df, "model", model, what)
    df, gpu = resolve(df, "gpu", gpu, what)
    df, seq_len = resolve(df, "seq_len", seq_len, what)
    ppl = ppl_column(df)
    base = df[baseline_mask(df)]
    comp = df[~baseline_mask(df) & df["strategy"].astype(str).isin([str(s) for s in strategies])]
    if compressors is not None:
        comp = comp[comp["compressor"].astype(str).isin([str(c) for c in compressors])]
    if comp.empty and base.empty:
        raise GacError(f"{what}: no baseline or compressor runs with strategies {list(strategies)} for model "
                       f"{model!r}; check the filters")
    comp, ratio = resolve(comp, "ratio", ratio, what) if not comp.empty else (comp, ratio)
    comp = one_proxy(comp, proxy, what)
    rows = one_setting(filter_settings(pd.concat([base, comp]), where, what), what)
    base, comp = rows[baseline_mask(rows)], rows[~baseline_mask(rows)]
    if base.empty and baseline_row:
        log.warning("Table 5: no baseline record for model %r; the baseline row and latency change stay blank", model)

    order = list(compressors) if compressors is not None else compressor_order(comp["compressor"].tolist())
    rows: list[tuple[str, pd.Series | None]] = [(BASELINE_LABEL, base.iloc[0] if len(base) else None)]
    for c in order:
        for s in strategies:
            hit = comp[(comp["compressor"].astype(str) == str(c)) & (comp["strategy"].astype(str) == str(s))]
            if hit.empty:
                if str(s) in PAPER_PAIR:  # the authors' own rows appear where they ran; their absence is no news
                    log.info("Table 5: no %s run for %s; row left out", s, c)
                continue
            if str(s) in LATENCY_BUDGET_STRATEGIES:  # one row per budget, each naming its budget and whether it held
                for _, rec in hit.iterrows():
                    rows.append((f"{method_label(c, s)} [{budget_note(rec)}]", rec))
                continue
            rows.append((method_label(c, s), hit.iloc[0]))
    if base.empty:
        rows = rows[1:]

    def lat(rec):
        if rec is None:
            return math.nan
        v = row_number(rec, latency)
        if math.isnan(v) and seq_len is not None:
            v = row_number(rec, f"{latency}@{int(seq_len)}")
        return v

    labels, task_data, task_note = task_metric_labels([r for _, r in rows], [m for _, m in TABLE5_METRICS])
    base_lat = lat(rows[0][1]) if not base.empty else math.nan
    keys = [str(rec["key"]) for label, rec in rows if rec is not None and label != BASELINE_LABEL]
    hit = pick_bench(bench, keys, model, 1, seq_len) if latency == "prefill_ms" and seq_len is not None else None
    engine = hit[0].get("engine") if hit is not None else rows_engine(rec for _, rec in rows)
    lat_col = engine_label(LAT_COL, engine)  # torch's column keeps its name; another engine's says which
    out = []
    for label, rec in rows:
        align = row_number(rec, f"aligned_{unit}") if unit is not None else row_number(rec, "aligned_fraction")
        r = {ALIGN_COL: 100.0 * align}
        for col, metric in TABLE5_METRICS:
            r[labels.get(metric, col)] = row_number(rec, ppl if metric == PPL else metric)
        if hit is not None:
            pt = hit[1]
            v = None if label == BASELINE_LABEL else pt["variants"][str(rec["key"])]
            r[lat_col] = pt["baseline_ms"] if v is None else v["ms"]
            r[DELTA_COL] = math.nan if v is None else 100.0 * (v["ratio"] - 1.0)
            r[CI_LO_COL] = math.nan if v is None or v["lo"] is None else 100.0 * (v["lo"] - 1.0)
            r[CI_HI_COL] = math.nan if v is None or v["hi"] is None else 100.0 * (v["hi"] - 1.0)
            pr = pt.get("predicted")
            if pr:  # the bench also predicted another GPU (gac bench --predict): its own, labelled column
                r[f"Prefill (ms), {pr['label']}"] = pr["baseline_ms"] if v is None else pr["by_key"].get(str(rec["key"]))
        else:
            r[lat_col] = lat(rec)
            has_base = label != BASELINE_LABEL and base_lat and not math.isnan(base_lat)
            r[DELTA_COL] = 100.0 * (r[lat_col] / base_lat - 1.0) if has_base else math.nan
        out.append(r)
    cols = [ALIGN_COL] + [labels.get(m, c) for c, m in TABLE5_METRICS] + [lat_col, DELTA_COL]
    pred_cols = sorted({k for r in out for k in r if k.startswith("Prefill (ms), predicted")})
    table = pd.DataFrame(out, index=pd.Index([lbl for lbl, _ in rows], name="Method"),
                         columns=cols + ([CI_LO_COL, CI_HI_COL] if hit is not None else []) + pred_cols).astype(float)
    table.attrs["formats"] = dict(TABLE5_FORMATS) | {c: TASK_FORMAT for c in labels.values()} | \
        {c: "{:.1f}" for c in pred_cols} | {lat_col: TABLE5_FORMATS[LAT_COL]}
    parts = [str(model)]
    if gpu is not None:
        parts.append(f"on {gpu}")
    if ratio is not None:
        parts.append(f"at ratio {float(ratio):g}")
    if where:
        parts.append(f"[{describe_setting(where)}]")
    lat_where = f"{latency}, seq_len {int(seq_len)}" if seq_len is not None else latency
    if ppl != PPL:
        lat_where = f"{ppl}; {lat_where}"
    if hit is not None:
        lat_where += "; " + bench_source(hit[0])
    elif table[lat_col].notna().any():
        lat_where += "; latency: per-job smoke numbers, each job timed alone (run `gac bench` for ratios with CIs)"
    if lat_col != LAT_COL:
        lat_where += f"; latency measured in {engine}, not PyTorch eager"
    if task_note:
        lat_where += f"; {task_note}"
    table.attrs["caption"] = f"Table 5: {' '.join(parts)} ({lat_where})"
    table.attrs.update(task_data=task_data, task_note=task_note, task_columns=list(labels.values()))
    table.attrs["bench"] = hit[0]["key"] if hit is not None else None
    table.attrs["selection"] = {"model": model, "gpu": gpu, "ratio": ratio, "seq_len": seq_len, "where": dict(where or {})}
    return table


def pick_bench(bench: Sequence[Mapping] | None, keys: Sequence[str], model, batch: int, seq_len) -> tuple | None:
    """The latest bench (summary, see :func:`gac.analysis.load.bench_summary`) of ``model`` that measured every
    record in ``keys`` at (``batch``, ``seq_len``): ``(summary, point)``, or None."""
    if not bench or not keys or seq_len is None:
        return None
    name = prefill_point(batch, seq_len)
    hits = [b for b in bench if (b.get("model") is None or str(b.get("model")) == str(model))
            and name in (b.get("points") or {}) and set(keys) <= set(b["points"][name]["variants"])]
    if not hits:
        return None
    best = max(hits, key=lambda b: (str(b.get("created") or ""), str(b.get("path") or "")))
    return best, best["points"][name]


def bench_ratios(summary: Mapping) -> pd.DataFrame:
    """One side-by-side bench (a summary from ``df.attrs["bench"]``) as a long frame, one row per (measured
    record, point): ``method, compressor, strategy, ratio_param, key, batch, seq_len, ms, ratio, lo, hi,
    baseline_ms`` (``ratio``: latency / baseline latency, ``lo``/``hi`` its paired-bootstrap 95% interval).
    ``attrs``: ``source`` (for a caption), ``device``, ``model``."""
    rows = []
    for pt in (summary.get("points") or {}).values():
        for key, v in pt["variants"].items():
            comp, strat = v.get("compressor"), v.get("strategy")
            rows.append({"method": method_label(comp, strat) if comp is not None else (v.get("label") or key[:8]),
                         "compressor": comp, "strategy": strat, "ratio_param": v.get("ratio_param"), "key": key,
                         "batch": int(pt["batch"]), "seq_len": int(pt["seq_len"]), "ms": v["ms"],
                         "ratio": v["ratio"], "lo": v["lo"], "hi": v["hi"], "baseline_ms": pt["baseline_ms"]})
    cols = ["method", "compressor", "strategy", "ratio_param", "key", "batch", "seq_len", "ms", "ratio", "lo", "hi",
            "baseline_ms"]
    out = pd.DataFrame(rows, columns=cols)
    for c in ("ms", "ratio", "lo", "hi", "baseline_ms"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    out["_order"] = [method_order(c, s) for c, s in zip(out["compressor"], out["strategy"])]
    out = out.sort_values(["batch", "seq_len", "_order"], kind="stable").drop(columns="_order").reset_index(drop=True)
    out.attrs.update(source=bench_source(summary), device=summary.get("device"), model=summary.get("model"),
                     key=summary.get("key"))
    return out


def bench_source(summary: Mapping) -> str:
    """How a table's latency was measured, for its caption (the engine named when it is not torch)."""
    engine = summary.get("engine")
    run_by = "" if engine in (None, DEFAULT_ENGINE) else f" in {engine}"
    return (f"latency: side-by-side bench {str(summary.get('key'))[:8]} on {summary.get('device')} "
            f"({summary.get('device_type')}){run_by}, {summary.get('rounds')} interleaved rounds, paired bootstrap "
            f"95% CI over rounds")


# ---------------------------------------------------------------------------------------------- ratio sweep
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


# ---------------------------------------------------------------------------------------------- proxies
def proxy_dims(
    df: pd.DataFrame,
    *,
    model: str | None = None,
    compressor: str | None = None,
    ratio: float | None = None,
    strategy: str = "unaligned",
    unit: int = DEFAULT_UNIT,
    where: Mapping[str, object] | None = None,
) -> pd.DataFrame:
    """The plan dims of one (model, compressor, ratio, strategy) per proxy, one row per target (see
    :func:`gac.analysis.plan_dims`): what Figure 2 scatters."""
    what = "proxy comparison"
    df = completed(df)
    df = df[df["dims"].map(lambda d: isinstance(d, Mapping) and len(d) > 0)]
    df = df[df["strategy"].astype(str) == str(strategy)]
    if df.empty:
        raise GacError(f"{what}: no records with a plan and strategy {strategy!r}; proxy comparison needs "
                       f"allocation runs that saved their plan")
    df, model = resolve(df, "model", model, what)
    df, ratio = resolve(df, "ratio", ratio, what)
    df, compressor = resolve(df, "compressor", compressor, what)
    df = one_setting(filter_settings(df, where, what), what, slot=("proxy",), axes=("proxy",))
    return plan_dims(df, unit=unit)


def proxy_comparison(dims: pd.DataFrame, units: Sequence[int] = (8, 16, 32)) -> pd.DataFrame:
    """Misaligned fraction per proxy (rows) from :func:`proxy_dims`: ``targets`` and ``misaligned <u> (%)``
    for each unit in ``units``."""
    rows = []
    for proxy in proxy_order(dims["proxy"]):
        g = dims[dims["proxy"].astype(str) == proxy]
        r = {"targets": float(len(g))}
        for u in units:
            r[f"misaligned {u} (%)"] = 100.0 * float((g["dim"] % u != 0).mean())
        rows.append((proxy, r))
    out = pd.DataFrame([r for _, r in rows], index=pd.Index([p for p, _ in rows], name="Proxy"))
    out.attrs["formats"] = {"targets": "{:.0f}", **{f"misaligned {u} (%)": "{:.0f}%" for u in units}}
    return out


def proxy_quality(
    df: pd.DataFrame,
    *,
    model: str | None = None,
    gpu: str | None = None,
    compressor: str | None = None,
    ratio: float | None = None,
    seq_len: int | None = None,
) -> pd.DataFrame:
    """Per proxy, unaligned against GAC at the same budget: the Table 5 columns of one (model, compressor, ratio)
    for each proxy (rows ``(proxy, method)``; no baseline row, columns nothing measured are dropped). Raises
    :class:`GacError` when no record of it measured quality (the proxy comparison ran with ``eval=none``)."""
    what = "proxy quality"
    df = completed(df)
    comp = df[~baseline_mask(df)]
    comp, model = resolve(comp, "model", model, what)
    comp, compressor = resolve(comp, "compressor", compressor, what)
    comp, ratio = resolve(comp, "ratio", ratio, what)
    parts, formats, notes = [], {}, []
    for proxy in proxy_order(distinct_values(comp["proxy"])):
        t = table5(comp[comp["proxy"].astype(str) == str(proxy)], model=model, gpu=gpu, ratio=ratio,
                   seq_len=seq_len, compressors=[compressor], proxy=str(proxy), baseline_row=False)
        formats.update(t.attrs["formats"])
        notes.append((t.attrs.get("task_note") or "", t.attrs.get("task_columns") or []))
        t = t.drop(index=BASELINE_LABEL, errors="ignore")
        t.index = pd.MultiIndex.from_tuples([(str(proxy), m) for m in t.index], names=["Proxy", "Method"])
        parts.append(t)
    if not parts:
        raise GacError(f"{what}: no {compressor} records for {model} at ratio {ratio}")
    out = pd.concat(parts)
    measured = [c for c in out.columns if c != ALIGN_COL and out[c].notna().any()]
    if not measured:
        raise GacError(f"{what}: no record measured perplexity, tasks or latency (eval=none); run the proxy "
                       f"comparison with eval=default for its quality columns")
    out = out[[ALIGN_COL] + measured]
    out.attrs["formats"] = {c: f for c, f in formats.items() if c in out.columns}
    note = "; ".join(dict.fromkeys(n for n, cols in notes if n and any(c in out.columns for c in cols)))
    out.attrs["caption"] = (f"Proxy comparison: {compressor_label(compressor)} on {model} at ratio {float(ratio):g}, "
                            f"unaligned against GAC at the same budget, per proxy")
    if note:
        out.attrs["caption"] += f" ({note})"
    return out


def alignment_table(dims: pd.DataFrame, units: Sequence[int] = (8, 16, 32)) -> pd.DataFrame:
    """Per method (rows, from :func:`gac.analysis.plan_dims`): ``targets``, ``dense`` (left unfactorised) and the
    share of chosen dims that are multiples of each unit, ``aligned <u> (%)``; where d* is known, also the mean
    ``|d - d*|``."""
    rows = []
    pairs = sorted(dict.fromkeys(zip(dims["compressor"].astype(str), dims["strategy"].astype(str))),
                   key=lambda cs: method_order(*cs))
    for c, s in pairs:
        g = dims[(dims["compressor"].astype(str) == c) & (dims["strategy"].astype(str) == s)]
        r = {"targets": float(len(g)), "dense": float(g["dense"].sum()) if "dense" in g.columns else math.nan}
        for u in units:
            r[f"aligned {u} (%)"] = 100.0 * float((g["dim"] % u == 0).mean())
        if "d_star" in g.columns and g["d_star"].notna().any():
            r["mean |d - d*|"] = float((g["dim"] - g["d_star"]).abs().mean())
        rows.append((method_label(c, s), r))
    out = pd.DataFrame([r for _, r in rows], index=pd.Index([m for m, _ in rows], name="Method"))
    out.attrs["formats"] = {"targets": "{:.0f}", "dense": "{:.0f}", "mean |d - d*|": "{:.2f}",
                            **{f"aligned {u} (%)": "{:.0f}%" for u in units}}
    return out


# ---------------------------------------------------------------------------------------------- latency
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
        hits = [b for b in bench if (b.get("model") is None or str(b.get("model")) == str(model)) and keys
                and all(keys <= set(p["variants"]) for p in (b.get("points") or {}).values())]
        if hits:
            source = max(hits, key=lambda b: (str(b.get("created") or ""), str(b.get("path") or "")))
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


# ---------------------------------------------------------------------------------------------- kernels
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
