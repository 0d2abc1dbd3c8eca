"""Write every table and figure the results support into one directory (what ``gac report`` runs).

For each (model, gpu, seq_len) in the results:

* ``table5_<model>_<gpu>_r<ratio>[_<proxy>]``: a Table 5 for every ratio where some compressor has a ``gac`` run
  (one table per proxy where a compressor was run with several);
* ``ratio_sweep_<model>_<gpu>``: PPL and latency against ratio (figure + table) when a compressor has 2+ ratios;
* ``latency_seq_<model>_<gpu>_r<ratio>``: Figure 10 (and a table per batch size) from ``prefill_ms@S`` metrics;
* ``proxies_<model>_<compressor>_r<ratio>``: Figure 2 (and misaligned fraction per proxy) when 2+ proxies
  have ``unaligned`` plans at one ratio;
* ``staircase_<profile>_<op>``: Figures 5-7 (and a summary table) for each kernel profile given.

``index.md`` lists what was written and what was skipped, and why.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gac.analysis import figures as F
from gac.analysis import tables as T
from gac.errors import GacError

log = logging.getLogger(__name__)

TABLE_FORMATS = {"md": "md", "markdown": "md", "tex": "tex", "latex": "tex"}


@dataclass
class Report:
    out_dir: Path
    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)


def slug(*parts) -> str:
    out = []
    for p in parts:
        if p is None or (isinstance(p, float) and math.isnan(p)):
            continue
        text = f"{p:g}" if isinstance(p, float) else str(p)
        out.append(re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x")
    return "_".join(out)


def check_out_dir(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Refuse a non-empty output directory unless ``force`` (then its files with our names are replaced)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GacError(f"output {str(out)!r} is a file; give a directory for the report")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise GacError(f"output directory {str(out)!r} is not empty; refusing to overwrite its files (choose a new "
                       f"directory or pass --force)")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_report(
    df: pd.DataFrame,
    out_dir: str | os.PathLike,
    table_formats: Sequence[str] = ("md", "tex"),
    figure_formats: Sequence[str] = ("png", "pdf"),
    profiles: Sequence[str | os.PathLike] = (),
    force: bool = False,
) -> Report:
    """Write the tables (``table_formats``) and figures (``figure_formats``) the results in ``df`` support."""
    kinds = []
    for f in table_formats:
        if f.lower() not in TABLE_FORMATS:
            raise GacError(f"unknown table format {f!r}; use md and/or tex")
        kinds.append(TABLE_FORMATS[f.lower()])
    for f in figure_formats:
        if f.lower() not in ("png", "pdf", "svg"):
            raise GacError(f"unknown figure format {f!r}; use png, pdf and/or svg")
    df = T.completed(df)
    if df.empty:
        raise GacError("no completed records to report on; run jobs first")
    rep = Report(check_out_dir(out_dir, force))
    fig_formats = [f.lower() for f in figure_formats]

    def table(name: str, t: pd.DataFrame, caption: str | None = None):
        if t.empty:
            rep.skipped.append(f"{name}: empty table")
            return
        for k in dict.fromkeys(kinds):
            p = rep.out_dir / f"{name}.{k}"
            p.write_text(T.format_table(t, k, caption=caption if k == "md" else None))
            rep.written.append(p)
        if "md" in kinds:
            rep.sections.append(f"## {caption or name}\n\n" + T.format_table(t, "md"))

    def figure(name: str, fig):
        rep.written += F.save_figure(fig, rep.out_dir / name, fig_formats)

    tag_seq = df["seq_len"].nunique() > 1
    for (model, gpu, seq_len), g in _groups(df, ["model", "gpu", "seq_len"]):
        _table5s(g, model, gpu, seq_len, tag_seq, table, rep)
        _ratio_sweep(g, model, gpu, seq_len, tag_seq, table, figure, rep)
    for (model, gpu), g in _groups(df, ["model", "gpu"]):
        _latency(g, model, gpu, table, figure, rep)
    _proxies(df, table, figure, rep)
    for prof in profiles:
        _staircases(prof, table, figure, rep)

    index = rep.out_dir / "index.md"
    lines = ["# gac report", "", f"{len(df)} completed records.", "", "## Files", ""]
    lines += [f"- {p.name}" for p in rep.written]
    if rep.skipped:
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in rep.skipped]
    lines += [""] + rep.sections
    index.write_text("\n".join(lines) + "\n")
    rep.written.append(index)
    log.info("report: %d files in %s (%d skipped)", len(rep.written), rep.out_dir, len(rep.skipped))
    return rep


def _groups(df: pd.DataFrame, by: list[str]):
    keys = df[by].astype("object").where(df[by].notna(), None)
    combos = list(dict.fromkeys(tuple(r) for r in keys.itertuples(index=False)))
    for combo in combos:
        mask = pd.Series(True, index=df.index)
        for col, v in zip(by, combo):
            mask &= df[col].isna() if v is None else T._match(df[col], v)
        yield combo, df[mask]


def _table5s(g, model, gpu, seq_len, tag_seq, table, rep):
    comp = g[~T.baseline_mask(g) & g["strategy"].isin(["unaligned", "gac"])]
    ratios = T._values(comp.loc[comp["strategy"] == "gac", "ratio"])
    if not ratios:
        rep.skipped.append(f"Table 5 for {model} on {gpu}: no gac runs")
    for r in ratios:
        at = comp[T._match(comp["ratio"], r)]
        proxies_of = {c: T._values(x["proxy"]) for c, x in at.groupby("compressor")}
        ambiguous = {c: ps for c, ps in proxies_of.items() if len(ps) > 1}
        choices = [None] if not ambiguous else sorted({p for ps in ambiguous.values() for p in ps})
        for p in choices:
            keep = [c for c in proxies_of if c not in ambiguous or p in ambiguous[c]]
            sel = {c: p for c in ambiguous if p in ambiguous[c]} or None
            name = slug("table5", model, gpu, f"r{r:g}", f"s{int(seq_len)}" if tag_seq and seq_len is not None else None,
                        p if ambiguous else None)
            try:
                t = T.table5(g, model=model, gpu=gpu, seq_len=seq_len, ratio=r, proxy=sel, compressors=keep)
            except GacError as e:
                rep.skipped.append(f"{name}: {e}")
                continue
            table(name, t, caption=t.attrs.get("caption") + (f", proxy {p}" if ambiguous else ""))


def _ratio_sweep(g, model, gpu, seq_len, tag_seq, table, figure, rep):
    comp = g[~T.baseline_mask(g)]
    measured = comp[[m for m in ("ppl_wikitext2", "prefill_ms") if m in comp.columns]].notna().any(axis=1) \
        if any(m in comp.columns for m in ("ppl_wikitext2", "prefill_ms")) else pd.Series(False, index=comp.index)
    counts = comp[measured].groupby("compressor")["ratio"].nunique()
    if counts.empty or counts.max() < 2:
        rep.skipped.append(f"ratio sweep for {model} on {gpu}: no compressor was run at 2+ ratios")
        return
    name = slug("ratio_sweep", model, gpu, f"s{int(seq_len)}" if tag_seq and seq_len is not None else None)
    try:
        sw = T.ratio_sweep(g, model=model, gpu=gpu, seq_len=seq_len,
                           compressor=[c for c, n in counts.items() if n >= 2])
    except GacError as e:
        rep.skipped.append(f"{name}: {e}")
        return
    figure(name, F.plot_ratio_sweep(sw, title=f"{model} on {gpu}: PPL and latency against ratio"))
    table(name, T.ratio_sweep_table(sw), caption=f"Ratio sweep: {model} on {gpu}")


def _latency(g, model, gpu, table, figure, rep):
    cols = [c for c in g.columns if (p := T.parse_seq_metric(c)) and p[0] == "prefill_ms"]
    benched = {k for b in g.attrs.get("bench") or [] for p in (b.get("points") or {}).values() for k in p["variants"]}
    if not cols and not benched:
        rep.skipped.append(f"latency vs sequence length for {model} on {gpu}: no prefill_ms@<seq_len> metrics")
        return
    has = g[(g[cols].notna().any(axis=1) if cols else False) | g["key"].astype(str).isin(benched)
            | (T.baseline_mask(g) & bool(benched))]
    comp = has[~T.baseline_mask(has) & has["strategy"].isin(["unaligned", "gac"])]
    for r in T._values(comp["ratio"]) or [None]:
        name = slug("latency_seq", model, gpu, f"r{r:g}" if r is not None else None)
        try:
            lat = T.latency_vs_seq_len(has, model=model, gpu=gpu, ratio=r)
        except GacError as e:
            rep.skipped.append(f"{name}: {e}")
            continue
        figure(name, F.plot_latency_vs_seq_len(lat, title=f"{model} on {gpu}: prefill latency across sequence lengths"
                                                         f"\n({lat.attrs.get('source')})"))
        for b in sorted(lat["batch"].unique()):
            table(f"{name}_b{b}", T.latency_table(lat, batch=b),
                  caption=f"Prefill latency by sequence length: {model} on {gpu}, ratio {r}, batch {b} "
                          f"({lat.attrs.get('source')})")


def _proxies(df, table, figure, rep):
    plans = df[df["dims"].map(lambda d: isinstance(d, dict) and len(d) > 0) & (df["strategy"] == "unaligned")]
    for (model, comp, ratio), g in _groups(plans, ["model", "compressor", "ratio"]):
        if g["proxy"].nunique() < 2:
            continue
        name = slug("proxies", model, comp, f"r{ratio:g}" if ratio is not None else None)
        try:
            dims = T.proxy_dims(g, model=model, compressor=comp, ratio=ratio)
        except GacError as e:
            rep.skipped.append(f"{name}: {e}")
            continue
        figure(name, F.plot_proxy_comparison(dims, title=f"{model}, {T.compressor_label(comp)}, ratio {ratio:g}: "
                                                         f"unconstrained dims per proxy"))
        table(name, T.proxy_comparison(dims), caption=f"Misaligned dims per proxy: {model}, {comp}, ratio {ratio:g}")
    if not rep.written or not any(p.name.startswith("proxies_") for p in rep.written):
        rep.skipped.append("proxy comparison: no (model, compressor, ratio) has unaligned plans from 2+ proxies")


def _staircases(prof, table, figure, rep):
    name = Path(prof).name or "profile"
    try:
        t = T.profile_table(prof)
        figs = F.kernel_staircase(t)
    except (GacError, ValueError) as e:
        raise GacError(f"cannot plot kernel profile {str(prof)!r}: {e}") from None
    for op, fig in figs.items():
        figure(slug("staircase", name, op), fig)
    table(slug("staircase", name), T.staircase_summary(t), caption=f"Kernel staircases: {name}")
