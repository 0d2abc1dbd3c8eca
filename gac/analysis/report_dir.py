"""Write every table and figure the results support into one directory (what ``gac report`` runs).

For each (model, gpu, seq_len) in the results:

* ``table5_<model>_<gpu>_r<ratio>[_<proxy>]``: a Table 5 for every ratio where some compressor has a ``gac`` run
  (one table per proxy where a compressor was run with several);
* ``latency_pareto_<model>_<gpu>``: quality against measured prefill latency of unaligned, gac and the
  latency-budget plans (``gac_latency``), with each budget (figure + table), when gac_latency records exist;
* ``ratio_sweep_<model>_<gpu>``: PPL, task accuracy (PiQA and HellaSwag acc_norm, where measured) and latency against
  ratio (figure + table) when a compressor has 2+ ratios;
* ``latency_seq_<model>_<gpu>_r<ratio>``: Figure 10 (and a table per batch size) from ``prefill_ms@S`` metrics;
* ``proxies_<model>_<compressor>_r<ratio>``: Figure 2 (and misaligned fraction per proxy) when 2+ proxies
  have ``unaligned`` plans at one ratio;
* ``plans_<model>_<gpu>_r<ratio>_{dstar,residues,alignment}``: what gac changed — each target's chosen dim
  against the compressor's d*, and the chosen dims modulo 8/16/32 per method (with a table of aligned shares);
* ``bench_<model>_<key>``: each side-by-side bench's latency ratios with their 95% intervals;
* ``staircase_<profile>_<op>``: Figures 5-7 (and a summary table) for each kernel profile given.

Records that differ in a setting are never merged or dropped: each artefact is written once per setting group
(:func:`gac.analysis.selection.setting_groups`), its name and caption naming the setting; only re-runs of one record
key collapse to the latest. A figure that would be degenerate (a latency curve with one sequence length, d* plots
without ``plan.d_star``) is skipped. ``index.md`` lists what was written and what was skipped, and why.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

import gac.analysis.figures as F
import gac.analysis.labels as N
import gac.analysis.load as L
import gac.analysis.selection as S
from gac.analysis.benches import bench_ratios
from gac.analysis.kernel_tables import profile_table, staircase_summary
from gac.analysis.method_table import LATENCY_BUDGET_STRATEGIES, table5
from gac.analysis.proxies import alignment_table, proxy_comparison, proxy_dims, proxy_quality
from gac.analysis.seq_latency import latency_table, latency_vs_seq_len
from gac.analysis.sweeps import ratio_sweep, ratio_sweep_table
from gac.analysis.table_format import format_table
from gac.errors import GacError
from gac.io import write_text_atomic
from gac.layout import owned_directory
from gac.registry import BASELINE_STRATEGY
from gac.results.query import MISSING, config_value

log = logging.getLogger(__name__)

TABLE_FORMATS = {"md": "md", "markdown": "md", "tex": "tex", "latex": "tex"}


@dataclass
class Report:
    out_dir: Path
    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)

    def matching(self, *words: str) -> Report:
        """The artefacts whose names hold one of ``words`` (``"ratio_sweep"``, ``"proxies"``), written or skipped."""
        def hit(name: str) -> bool:
            return any(w in name for w in words)

        return Report(self.out_dir, [p for p in self.written if hit(p.name)], [s for s in self.skipped if hit(s)])


def show_report(rep: Report, *words: str) -> None:
    """Display in a notebook what ``rep`` wrote (tables as markdown, figures as PNG) and skipped, for the artefacts
    whose names hold one of ``words``: the notebooks in analysis/ show what ``gac report`` writes, by its rules."""
    from IPython.display import Image, Markdown, display

    part = rep.matching(*words)
    for p in part.written:
        if p.suffix == ".md":
            display(Markdown(p.read_text()))
        elif p.suffix == ".png":
            display(Image(filename=str(p)))
    for s in part.skipped:
        print("skipped:", s)
    if not part.written and not part.skipped:
        print(f"this store has nothing for {', '.join(words)} (the report writes what its experiments define)")


def slug(*parts) -> str:
    out = []
    for p in parts:
        if p is None or (isinstance(p, float) and math.isnan(p)):
            continue
        text = f"{p:g}" if isinstance(p, float) else str(p)
        out.append(re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x")
    return "_".join(out)


def check_out_dir(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Refuse a non-empty output directory unless ``force`` (then its files with our names are replaced: each is
    written to a temp file and renamed over the old name, so a symbolic link planted there is replaced, never
    written through to the file it points at)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GacError(f"output {str(out)!r} is a file; give a directory for the report")
    owner = owned_directory(out)
    if owner:
        raise GacError(f"output {str(out)!r} {owner}; give the report a directory of its own (e.g. report/)")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise GacError(f"output directory {str(out)!r} is not empty; refusing to overwrite its files (choose a new "
                       f"directory or pass --force)")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _discard(rep: Report, made: bool) -> None:
    """Remove what a failed report wrote (and its directory, when the report made it and nothing else is there)."""
    for p in rep.written:
        with contextlib.suppress(OSError):
            p.unlink()
    for tmp in rep.out_dir.glob(f".*.{os.getpid()}.*.tmp"):  # this process's temp file a write stopped in
        with contextlib.suppress(OSError):
            tmp.unlink()
    if made:
        with contextlib.suppress(OSError):
            rep.out_dir.rmdir()


def write_report(
    df: pd.DataFrame,
    out_dir: str | os.PathLike,
    table_formats: Sequence[str] = ("md", "tex"),
    figure_formats: Sequence[str] = ("png", "pdf"),
    profiles: Sequence[str | os.PathLike] = (),
    force: bool = False,
    where: dict | None = None,
) -> Report:
    """Write the tables (``table_formats``) and figures (``figure_formats``) the results in ``df`` support.

    ``where`` keeps only the matching records (``{"sweep": "s1"}``, ``{"align.window": 8}``: see
    :func:`gac.analysis.selection.filter_settings`). Records that differ in a setting (other than re-runs of one key)
    are never merged: each table or figure is written once per setting group, its name and caption naming the
    setting (:func:`gac.analysis.selection.setting_groups`)."""
    kinds = []
    for f in table_formats:
        if f.lower() not in TABLE_FORMATS:
            raise GacError(f"unknown table format {f!r}; use md and/or tex")
        kinds.append(TABLE_FORMATS[f.lower()])
    for f in figure_formats:
        if f.lower() not in ("png", "pdf", "svg"):
            raise GacError(f"unknown figure format {f!r}; use png, pdf and/or svg")
    bench = df.attrs.get("bench")
    df = S.completed(df)
    if df.empty:
        raise GacError("no completed records to report on; run jobs first")
    df = S.filter_settings(df, where, "gac report")
    df.attrs["bench"] = bench
    made = not Path(out_dir).exists()
    rep = Report(check_out_dir(out_dir, force))
    try:
        fig_formats = [f.lower() for f in figure_formats]

        def table(name: str, t: pd.DataFrame, caption: str | None = None):
            if t.empty:
                rep.skipped.append(f"{name}: empty table")
                return
            for k in dict.fromkeys(kinds):
                p = rep.out_dir / f"{name}.{k}"
                write_text_atomic(p, format_table(t, k, caption=caption if k == "md" else None), overwrite=True)
                rep.written.append(p)
            if "md" in kinds:
                rep.sections.append(f"## {caption or name}\n\n" + format_table(t, "md"))

        def figure(name: str, fig):
            rep.written += F.save_figure(fig, rep.out_dir / name, fig_formats)

        for experiment, part in experiments(df):
            arts = EXPERIMENT_ARTEFACTS.get(experiment, ALL_ARTEFACTS)
            names = _Names(experiment)
            if experiment != DEFAULT_EXPERIMENT:
                rep.sections.append(f"# Experiment {experiment}")
            keys = set(part["key"].astype(str))
            part.attrs["bench"] = [b for b in bench or [] if keys & {k for pt in (b.get("points") or {}).values()
                                                                   for k in pt.get("variants", {})}]
            tag_seq = part["seq_len"].nunique() > 1
            for (model, gpu, seq_len), g in _groups(part, ["model", "gpu", "seq_len"]):
                if "table5" in arts:
                    _table5s(g, model, gpu, seq_len, tag_seq, table, rep, names("table5"))
                if "ratio_sweep" in arts:
                    _ratio_sweep(g, model, gpu, seq_len, tag_seq, table, figure, rep, names("ratio_sweep"))
                if "latency_pareto" in arts:
                    _pareto(g, model, gpu, seq_len, tag_seq, table, figure, rep, names("latency_pareto"))
            if "latency" in arts:
                for (model, gpu), g in _groups(part, ["model", "gpu"]):
                    _latency(g, model, gpu, table, figure, rep, names("latency_seq"))
            if "proxies" in arts:
                _proxies(part, table, figure, rep, names("proxies"))
            if "plans" in arts:
                _plans(part, table, figure, rep, names("plans"))
            if "bench" in arts:
                _benches(part, figure, rep, names("bench"))
        for prof in profiles:
            _staircases(prof, table, figure, rep)

        index = rep.out_dir / "index.md"
        lines = ["# gac report", "", f"{len(df)} completed records.", "", "## Files", ""]
        lines += [f"- {p.name}" for p in rep.written]
        wrecked = df[df["ppl_warning"].notna()] if "ppl_warning" in df.columns else df.iloc[:0]
        if len(wrecked):  # said once at the top: their rows sit in the tables like any other
            lines += ["", "## Warnings", ""] + [
                f"- {r.model}, {r.compressor}" + (f" ratio {r.ratio:g}" if pd.notna(r.ratio) else "")
                + f" ({r.strategy}; record {r.key}): {r.ppl_warning}" for r in wrecked.itertuples()]
        if rep.skipped:
            lines += ["", "## Skipped", ""] + [f"- {s}" for s in rep.skipped]
        lines += [""] + rep.sections
        write_text_atomic(index, "\n".join(lines) + "\n", overwrite=True)
        rep.written.append(index)
        log.info("report: %d files in %s (%d skipped)", len(rep.written), rep.out_dir, len(rep.skipped))
    except (GacError, OSError) as e:  # a full disk half-way: no partial report is left behind as if complete
        _discard(rep, made)
        why = e if isinstance(e, GacError) else f"{e.strerror or e}"
        raise GacError(f"the report in {str(rep.out_dir)!r} could not be written ({why}); the files it had written "
                       f"were removed: free space there or choose another directory, and run gac report again") from None
    except BaseException:
        _discard(rep, made)
        raise
    return rep


#: the label of records no experiment config set (``experiment_name`` left at its default)
DEFAULT_EXPERIMENT = "default"
#: the artefacts each experiment of conf/experiment/ defines, its first one named for the experiment itself
#: (``table5_tiny_cpu_r0.15``, ``table5_plans_...``, ``proxy_compare_tiny_asvd_r0.2``): a report writes what its
#: experiments define. Records of another label get every artefact their results support.
EXPERIMENT_ARTEFACTS = {
    "table5": ("table5", "plans", "bench"),
    "table5_authors": ("table5", "plans", "bench"),
    "table5_both": ("table5", "plans", "bench"),
    "ratio_sweep": ("ratio_sweep",),
    "proxy_compare": ("proxies",),
    "seq_len_sweep": ("latency",),
    "latency_budget": ("latency_pareto", "table5", "bench"),
}
ALL_ARTEFACTS = ("table5", "ratio_sweep", "latency_pareto", "latency", "proxies", "plans", "bench")


def defines(experiment: str | None, artefact: str) -> bool:
    """Whether the experiment ``experiment`` (an ``experiment_name``) defines ``artefact``: what a report writes and
    what the end-of-sweep job shows (a sweep of a Table 5 experiment, or ``latency_budget``, ends with Table 5)."""
    return artefact in EXPERIMENT_ARTEFACTS.get(str(experiment), ())

_ARTEFACT_NAMES = {"latency": "latency_seq"}


class _Names:
    """The file-name prefix of each artefact of one experiment: the artefact's own name for default records, the
    experiment's name for the first artefact of a known experiment, ``<experiment>_<artefact>`` for the others (so
    two experiments never write one file)."""

    def __init__(self, experiment: str):
        arts = EXPERIMENT_ARTEFACTS.get(experiment)
        self.experiment, self.first = experiment, _ARTEFACT_NAMES.get(arts[0], arts[0]) if arts else None

    def __call__(self, artefact: str) -> str:
        if self.experiment == DEFAULT_EXPERIMENT:
            return artefact
        return self.experiment if artefact == self.first else f"{self.experiment}_{artefact}"


def experiments(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The records of each experiment label that has compressed records, with its baselines: its own where it
    ran one for a model, else the store's baselines of that model (one baseline serves every sweep). A store of
    baselines only is one group."""
    labels = df["experiment"].astype("object").where(df["experiment"].notna(), DEFAULT_EXPERIMENT) \
        if "experiment" in df.columns else pd.Series(DEFAULT_EXPERIMENT, index=df.index)
    labels = labels.astype(str)
    base = N.baseline_mask(df)
    order = list(dict.fromkeys(labels[~base]))
    if not order:
        return [(DEFAULT_EXPERIMENT, df)]
    out = []
    for exp in order:
        mine = df[(labels == exp) & ~base]
        own = df[(labels == exp) & base]
        borrowed = [df[base & (labels != exp) & (df["model"].astype(str) == str(m))]
                    for m in dict.fromkeys(mine["model"].astype(str)) if not (own["model"].astype(str) == m).any()]
        out.append((exp, pd.concat([own, *borrowed, mine])))
    return out


def _groups(df: pd.DataFrame, by: list[str]):
    keys = df[by].astype("object").where(df[by].notna(), None)
    combos = list(dict.fromkeys(tuple(r) for r in keys.itertuples(index=False)))
    for combo in combos:
        mask = pd.Series(True, index=df.index)
        for col, v in zip(by, combo):
            mask &= df[col].isna() if v is None else S.match_column(df[col], v)
        yield combo, df[mask]


def _setting_slug(setting: dict) -> str | None:
    if not setting:
        return None
    return slug(*(f"{k.rsplit('.', 1)[-1]}{S.show_value(v) if v != () else '-none'}" for k, v in setting.items()))


def _setting_note(setting: dict) -> str:
    return f" [{S.describe_setting(setting)}]" if setting else ""


def _table5s(g, model, gpu, seq_len, tag_seq, table, rep, prefix="table5"):
    strategies = ["unaligned", "gac", *(s for s in LATENCY_BUDGET_STRATEGIES if (g["strategy"] == s).any())]
    comp = g[~N.baseline_mask(g) & g["strategy"].isin(strategies)]
    ratios = S.distinct_values(comp.loc[comp["strategy"] == "gac", "ratio"])
    if not ratios:
        rep.skipped.append(f"Table 5 for {model} on {gpu}: no gac runs")
    for r in ratios:
        at = comp[S.match_column(comp["ratio"], r)]
        proxies_of = {c: S.distinct_values(x["proxy"]) for c, x in at.groupby("compressor")}
        ambiguous = {c: ps for c, ps in proxies_of.items() if len(ps) > 1}
        choices = [None] if not ambiguous else sorted({p for ps in ambiguous.values() for p in ps})
        for p in choices:
            keep = [c for c in proxies_of if c not in ambiguous or p in ambiguous[c]]
            sel = {c: p for c in ambiguous if p in ambiguous[c]} or None
            rows = at[at["compressor"].isin(keep)]
            if sel:
                rows = rows[[c not in sel or str(x) == str(sel[c]) for c, x in zip(rows["compressor"], rows["proxy"])]]
            for setting, part in S.setting_groups(pd.concat([g[N.baseline_mask(g)], rows])):
                if N.baseline_mask(part).all():  # a baseline whose settings differ from every compressed run's
                    continue
                name = slug(prefix, model, gpu, f"r{r:g}",
                            f"s{int(seq_len)}" if tag_seq and seq_len is not None else None,
                            p if ambiguous else None, _setting_slug(setting))
                try:
                    t = table5(part, model=model, gpu=gpu, seq_len=seq_len, ratio=r, compressors=keep,
                                 bench=g.attrs.get("bench"), where=setting or None, strategies=strategies)
                except GacError as e:
                    rep.skipped.append(f"{name}: {e}")
                    continue
                table(name, t, caption=t.attrs.get("caption") + (f", proxy {p}" if ambiguous else ""))


def _ratio_sweep(g, model, gpu, seq_len, tag_seq, table, figure, rep, prefix="ratio_sweep"):
    comp = g[~N.baseline_mask(g)]
    quality = [N.ppl_column(comp), "prefill_ms"]
    measured = comp[[m for m in quality if m in comp.columns]].notna().any(axis=1) \
        if any(m in comp.columns for m in quality) else pd.Series(False, index=comp.index)
    counts = comp[measured].groupby("compressor")["ratio"].nunique()
    if counts.empty or counts.max() < 2:
        rep.skipped.append(f"ratio sweep for {model} on {gpu}: no compressor was run at 2+ ratios")
        return
    names = [c for c, n in counts.items() if n >= 2]
    rows = pd.concat([g[N.baseline_mask(g)], comp[measured & comp["compressor"].isin(names)]])
    for setting, part in S.setting_groups(rows, slot=("compressor", "strategy", "ratio", "proxy"), axes=("ratio",)):
        name = slug(prefix, model, gpu, f"s{int(seq_len)}" if tag_seq and seq_len is not None else None,
                    _setting_slug(setting))
        try:
            mine = part[~N.baseline_mask(part)]  # a task row needs some compressor measured at 2+ ratios (a line)
            tasks = [m for m in N.SWEEP_TASK_METRICS if m in mine.columns
                     and mine[mine[m].notna()].groupby("compressor")["ratio"].nunique().max() >= 2]
            sw = ratio_sweep(part, model=model, gpu=gpu, seq_len=seq_len, compressor=names,
                               metrics=(N.PPL, *tasks, "prefill_ms"))
        except GacError as e:
            rep.skipped.append(f"{name}: {e}")
            continue
        per_comp = sw.loc[sw["strategy"] != BASELINE_STRATEGY].groupby("compressor")["ratio"].nunique()
        if per_comp.empty or per_comp.max() < 2:  # a group may hold only a baseline (its setting differs from theirs)
            rep.skipped.append(f"{name}: fewer than 2 ratios per compressor in this setting group (a line needs 2)")
            continue
        found = sw["metric"].astype(str)
        what = ", ".join(w for w, hit in (("PPL", found.str.startswith("ppl").any()),
                                          ("task accuracy", found.isin(N.SWEEP_TASK_METRICS).any()),
                                          ("latency", found.str.startswith("prefill").any())) if hit)
        figure(name, F.plot_ratio_sweep(sw, title=F.figure_title(f"{what} against ratio", model=model,
                                                                 device=gpu, extra=_setting_note(setting))))
        wide = ratio_sweep_table(sw)
        note = wide.attrs.get("task_note")
        table(name, wide, caption=f"Ratio sweep: {model} on {gpu}{_setting_note(setting)}"
                                  + (f" ({note})" if note else ""))


def _pareto(g, model, gpu, seq_len, tag_seq, table, figure, rep, prefix="latency_pareto"):
    """Quality against measured latency of the plans by parameters and by latency (when gac_latency ran)."""
    from gac.analysis.pareto import PARETO_STRATEGIES, latency_pareto, pareto_table

    if not (g["strategy"] == "gac_latency").any():
        return
    rows = g[N.baseline_mask(g) | g["strategy"].isin(PARETO_STRATEGIES)]
    for setting, part in S.setting_groups(rows, slot=("compressor", "strategy", "ratio", "proxy"), axes=("ratio",)):
        name = slug(prefix, model, gpu, f"s{int(seq_len)}" if tag_seq and seq_len is not None else None,
                    _setting_slug(setting))
        try:
            fr = latency_pareto(part, model=model, gpu=gpu, seq_len=seq_len, bench=g.attrs.get("bench"))
            where = fr.attrs.get("device") or gpu
            cpu = "latency measured on this CPU" if str(gpu) == "cpu" else "latency measured"
            fig = F.plot_latency_pareto(fr, title=F.figure_title(
                "Quality against prefill latency, plans by parameters and by latency", model=model, device=where,
                extra=f", batch 1, S={int(seq_len)} ({cpu}){_setting_note(setting)}"))
        except (GacError, ValueError) as e:
            rep.skipped.append(f"{name}: {e}")
            continue
        figure(name, fig)
        table(name, pareto_table(fr), caption=f"Latency budget: {model} on {gpu}, S={int(seq_len)} "
                                              f"({fr.attrs['source']}){_setting_note(setting)}")


def _latency(g, model, gpu, table, figure, rep, prefix="latency_seq"):
    cols = [c for c in g.columns if (p := L.parse_seq_metric(c)) and p[0] == "prefill_ms"]
    bench = g.attrs.get("bench") or []
    benched = {k for b in bench for p in (b.get("points") or {}).values() for k in p["variants"]}
    if not cols and not benched:
        rep.skipped.append(f"latency vs sequence length for {model} on {gpu}: no prefill_ms@<seq_len> metrics "
                           f"(one sequence length: Table 5 has the latency)")
        return
    has = g[(g[cols].notna().any(axis=1) if cols else False) | g["key"].astype(str).isin(benched)
            | (N.baseline_mask(g) & bool(benched))]
    comp = has[~N.baseline_mask(has) & has["strategy"].isin(["unaligned", "gac"])]
    for r in S.distinct_values(comp["ratio"]) or [None]:
        at = pd.concat([has[N.baseline_mask(has)], comp[S.match_column(comp["ratio"], r)] if r is not None else comp])
        for setting, part in S.setting_groups(at, axes=S.LATENCY_AXES):
            name = slug(prefix, model, gpu, f"r{r:g}" if r is not None else None, _setting_slug(setting))
            try:
                lat = latency_vs_seq_len(part, model=model, gpu=gpu, ratio=r, bench=bench)
            except GacError as e:
                rep.skipped.append(f"{name}: {e}")
                continue
            seqs = lat.groupby("batch")["seq_len"].nunique()
            if lat.empty or seqs.max() < 2:
                rep.skipped.append(f"{name}: latency measured at one sequence length only "
                                   f"({', '.join(str(s) for s in sorted(lat['seq_len'].unique()))}); a curve needs 2+ "
                                   f"(Table 5 has the number)")
                continue
            device = lat.attrs.get("device") or gpu
            lone = [int(b) for b, n in seqs.items() if n < 2]
            if lone:
                rep.skipped.append(f"{name}: batch {', '.join(map(str, lone))} left out of the figure (one sequence "
                                   f"length; its table has the number)")
            how = "bench, 95% CIs" if lat.attrs.get("device") else "per-job timings, no CIs: run gac bench"
            figure(name, F.plot_latency_vs_seq_len(lat, title=F.figure_title(
                "prefill latency across sequence lengths", model=model, ratio=r, device=device,
                extra=_setting_note(setting)) + f"\n({how})"))
            for b in sorted(lat["batch"].unique()):
                table(f"{name}_b{b}", latency_table(lat, batch=b),
                      caption=f"Prefill latency by sequence length: {model} on {device}, ratio {r}, batch {b}"
                              f"{_setting_note(setting)} ({lat.attrs.get('source')})")


def _proxies(df, table, figure, rep, prefix="proxies"):
    plans = df[df["dims"].map(lambda d: isinstance(d, dict) and len(d) > 0) & (df["strategy"] == "unaligned")]
    for (model, comp, ratio), g in _groups(plans, ["model", "compressor", "ratio"]):
        if g["proxy"].nunique() < 2:
            continue
        for setting, part in S.setting_groups(g, slot=("proxy",), axes=("proxy",)):
            if part["proxy"].nunique() < 2:
                continue
            name = slug(prefix, model, comp, f"r{ratio:g}" if ratio is not None else None, _setting_slug(setting))
            try:
                dims = proxy_dims(part, model=model, compressor=comp, ratio=ratio)
            except GacError as e:
                rep.skipped.append(f"{name}: {e}")
                continue
            figure(name, F.plot_proxy_comparison(dims, title=F.figure_title(
                f"{N.compressor_label(comp)}, {_allocation_of(part)}: unconstrained dims per proxy", model=model,
                ratio=ratio, extra=_setting_note(setting))))
            table(name, proxy_comparison(dims),
                  caption=f"Misaligned dims per proxy: {model}, {comp}, ratio {ratio:g}{_setting_note(setting)}")
            runs = df[(df["model"].astype(str) == str(model)) & (df["compressor"].astype(str) == str(comp))
                      & S.match_column(df["ratio"], ratio) & df["proxy"].isin(part["proxy"].unique())]
            try:
                quality = proxy_quality(runs, model=model, compressor=comp, ratio=ratio)
            except GacError as e:
                rep.skipped.append(f"{name}_quality: {e}")
                continue
            table(f"{name}_quality", quality, caption=quality.attrs["caption"] + _setting_note(setting))
    if not rep.written or not any(p.name.startswith(f"{prefix}_") for p in rep.written):
        rep.skipped.append("proxy comparison: no (model, compressor, ratio) has unaligned plans from 2+ proxies")


def _allocation_of(part) -> str:
    """How the records' d* were allocated, for a title: ``proportional allocation``, ``sensitivity allocation``
    (the rule that ran, from the records' compression recipe; the config's value for records without one)."""
    vals = {str(v) for v in part["allocation"] if isinstance(v, str)} if "allocation" in part.columns else set()
    if not vals and "config" in part.columns:
        vals = {str(v) for c in part["config"] for v in (config_value(c, "allocation"),)
                if v is not MISSING and v not in (None, "default")}
    return f"{', '.join(sorted(vals))} allocation" if vals else "the compressor's own allocation"


def _devices_named(part, gpu) -> str | None:
    devices = [str(d) for d in dict.fromkeys(part["device"].dropna()) if str(d)] if "device" in part.columns else []
    return ", ".join(devices) if devices else (str(gpu) if gpu is not None else None)


def _plans(df, table, figure, rep, prefix="plans"):
    plans = df[df["dims"].map(lambda d: isinstance(d, dict) and len(d) > 0)]
    if plans.empty:
        rep.skipped.append("plan figures (d* against the chosen dim, dims mod 8/16/32): no record has a plan")
        return
    for (model, gpu, ratio), g in _groups(plans, ["model", "gpu", "ratio"]):
        per_method = g.groupby(["compressor", "strategy"])["proxy"].nunique()
        if per_method.max() > 1:
            rep.skipped.append(f"plan figures for {model} on {gpu} at ratio {ratio:g}: a method was run with several "
                               f"proxies (the proxy comparison shows those plans)")
            continue
        for setting, part in S.setting_groups(g, slot=("compressor", "strategy")):
            dims = L.plan_dims(part)
            name = slug(prefix, model, gpu, f"r{ratio:g}" if ratio is not None else None, _setting_slug(setting))
            note = _setting_note(setting)
            device = _devices_named(part, gpu)
            try:
                figure(f"{name}_dstar", F.plot_dstar_vs_dim(dims, title=F.figure_title(
                    "chosen dim against the compressor's d*", model=model, ratio=ratio, device=device,
                    extra=note)))
            except ValueError as e:
                rep.skipped.append(f"{name}_dstar: {e}")
            figure(f"{name}_residues", F.plot_dim_residues(dims, title=F.figure_title(
                "dims modulo 8, 16 and 32", model=model, ratio=ratio, device=device, extra=note)))
            table(f"{name}_alignment", alignment_table(dims),
                  caption=f"Aligned dims per method: {model}, ratio {ratio:g} on {device}{note}")


def _benches(df, figure, rep, prefix="bench"):
    benches = df.attrs.get("bench") or []
    if not benches:
        rep.skipped.append("bench figure (latency ratios with 95% CIs): no side-by-side bench in the store "
                           "(gac bench, or bench.after_sweep=true)")
    for b in benches:
        r = bench_ratios(b)
        name = slug(prefix, b.get("model"), str(b.get("key"))[:8])
        if r.empty:
            rep.skipped.append(f"{name}: the bench measured no compressed record")
            continue
        ratios = S.distinct_values(r["ratio_param"])
        figure(name, F.plot_bench_ratios(r, title=F.figure_title(
            f"prefill latency vs. baseline, side-by-side bench ({b.get('rounds')} rounds)", model=b.get("model"),
            ratio=ratios[0] if len(ratios) == 1 else None,
            device=f"{b.get('device')} ({b.get('device_type')})" if b.get("device_type") else b.get("device"))))


def _staircases(prof, table, figure, rep):
    name = Path(prof).name or "profile"
    try:
        t = profile_table(prof)
        figs = F.kernel_staircase(prof)
    except (GacError, ValueError) as e:
        raise GacError(f"cannot plot kernel profile {str(prof)!r}: {e}") from None
    for op, fig in figs.items():
        figure(slug("staircase", name, op), fig)
    table(slug("staircase", name), staircase_summary(t), caption=f"Kernel staircases: {name}")
