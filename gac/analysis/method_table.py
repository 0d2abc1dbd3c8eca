"""Table 5: one row per method (baseline, then each compressor unaligned and with GAC) with its alignment,
quality and prefill latency against the baseline, from the tidy results frame (:func:`gac.analysis.load_results`).

The filters and what a table may hold are the package's rule (:mod:`gac.analysis`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import pandas as pd

from gac.analysis.benches import bench_source, pick_bench
from gac.analysis.labels import (
    PPL,
    TASK_FORMAT,
    baseline_mask,
    budget_note,
    compressor_order,
    engine_label,
    method_label,
    ppl_column,
    row_number,
    rows_engine,
    task_metric_labels,
)
from gac.analysis.selection import (
    describe_setting,
    filter_settings,
    one_proxy,
    one_setting,
    resolve,
    resolve_point,
)
from gac.errors import GacError
from gac.registry import BASELINE_LABEL, LATENCY_STRATEGIES

log = logging.getLogger(__name__)

#: strategies whose plans budget latency (gac.registry.LATENCY_STRATEGIES): Table 5 names each row's budget
LATENCY_BUDGET_STRATEGIES = tuple(LATENCY_STRATEGIES)

#: Table 5's metric columns: (column label, metric name); a task column is labelled by the data its rows were
#: scored on (:func:`gac.analysis.labels.task_metric_labels`): ``PiQA`` for the real dataset, ``PiQA-format (enwiki)`` for a
#: look-alike set
TABLE5_METRICS = (("PPL", PPL), ("PiQA", "piqa_acc"), ("PiQA (norm)", "piqa_acc_norm"),
                  ("HSwag", "hellaswag_acc"), ("HSwag (norm)", "hellaswag_acc_norm"))
PAPER_PAIR = ("unaligned", "gac")  # Table 5's rows per compressor; a missing one is said
ALIGN_COL, LAT_COL, DELTA_COL = "Align (%)", "Prefill (ms)", "vs. baseline (%)"
CI_LO_COL, CI_HI_COL = "CI95 low (%)", "CI95 high (%)"  # only when latency comes from a side-by-side bench
TABLE5_FORMATS = {ALIGN_COL: "{:.0f}%", "PPL": "{:.2f}", "PiQA": "{:.3f}", "PiQA (norm)": "{:.3f}",
                  "HSwag": "{:.3f}", "HSwag (norm)": "{:.3f}", LAT_COL: "{:.1f}", DELTA_COL: "{:+.0f}%",
                  CI_LO_COL: "{:+.1f}%", CI_HI_COL: "{:+.1f}%"}


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
    df, model, gpu, seq_len = resolve_point(df, model, gpu, seq_len, what)
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
