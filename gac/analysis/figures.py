"""The paper's figures from the analysis tables (Table 5, the ratio sweep, the proxies, latency by length).

Figures are built with matplotlib's object API (``matplotlib.figure.Figure``), never ``pyplot``: no global
state, no GUI backend, nothing to close; :func:`save_figure` writes PNG and PDF through the Agg/PDF canvases.
In a notebook, show one with ``display(fig)`` or save it and show the PNG.

Every figure follows the style of :mod:`gac.profiling.figures` (the one module that also draws the kernel
staircases): Okabe-Ito colours, each series with its own colour *and* marker, perplexity on a linear axis with
plain tick labels, the legend below the axes, titles naming model, ratio and device. A figure that would be
degenerate (no points, a curve with one x value) raises ValueError; ``gac report`` skips it with a note.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from gac.align.candidates import DEFAULT_UNIT
from gac.analysis.kernel_tables import profile_table
from gac.analysis.labels import (
    compressor_label,
    method_label,
    method_order,
    metric_label,
    proxy_order,
    sweep_metric_rank,
    sweep_task_labels,
)
from gac.metrics import is_ppl
from gac.profiling.figures import (
    ALIGNED_STYLE,
    BASELINE_STYLE,
    FA2_TEMPLATES,
    MISALIGNED_STYLE,
    OKABE_ITO,
    SERIES_MARKERS,
    figure_title,
    legend_outside,
    new_figure,
    plain_ticks,
    save_figure,
    series_style,
    staircase_figures,
)
from gac.registry import BASELINE, BASELINE_LABEL, BASELINE_STRATEGY

__all__ = ["FA2_TEMPLATES", "figure_title", "kernel_staircase", "method_styles", "plot_bench_ratios",
           "plot_dim_residues", "plot_dstar_vs_dim", "plot_latency_vs_seq_len", "plot_proxy_comparison",
           "plot_latency_pareto", "plot_ratio_sweep", "save_figure"]

KIND_MARKERS = {"q_proj": "o", "k_proj": "s", "v_proj": "^", "o_proj": "D", "gate_proj": "v", "up_proj": "<",
                "down_proj": ">", "mlp": "P"}
#: the usual methods keep their style across figures (Table 5's five rows first); others follow in order
_FIXED = ("ASVD", "ASVD (GAC)", "LLM-Pruner", "LLM-Pruner (GAC)", "SVD-LLM", "SVD-LLM (GAC)", "PaLU", "PaLU (GAC)")


def method_styles(methods: Sequence[str]) -> dict[str, dict]:
    """``{method label: {"color", "marker"}}``: the baseline black, every other method its own Okabe-Ito colour
    and marker (the same for Table 5's methods in every figure)."""
    out = {}
    for m in methods:
        if m == BASELINE_LABEL:
            out[m] = {"color": OKABE_ITO["black"], "marker": "*"}
        elif m in _FIXED[:4]:
            out[m] = series_style(_FIXED.index(m))
    rest = [m for m in methods if m not in out]
    for n, m in enumerate(rest):  # slots 4-6 first (never Table 5's), then the rest with a shifted marker
        k = 4 + n if n < 3 else n - 3
        st = series_style(k)
        if n >= 3:
            st["marker"] = SERIES_MARKERS[(k + 3) % len(SERIES_MARKERS)]
        out[m] = st
    return out


def _ordered_methods(frame: pd.DataFrame) -> list[str]:
    pairs = dict.fromkeys(zip(frame["compressor"].astype(str), frame["strategy"].astype(str)))
    return [method_label(c, s) for c, s in sorted(pairs, key=lambda cs: method_order(*cs))]


# ---------------------------------------------------------------------------------------------- ratio sweep
#: chance accuracy of the two-choice / four-choice task formats, drawn under their accuracy panels
TASK_CHANCE = {"piqa": 0.5, "hellaswag": 0.25}


def plot_ratio_sweep(sweep: pd.DataFrame, title: str | None = None) -> Figure:
    """One column per compressor, one row per metric (perplexity first, then task accuracies, then latency); a
    line per strategy against ratio, the baseline dashed, a task's chance accuracy dotted. Perplexity on a linear
    axis with plain numbers, or a log axis when one panel spans more than 10x (a compressor that breaks the model
    at its highest ratios would flatten every other point)."""
    if sweep.empty:
        raise ValueError("empty ratio sweep: nothing to plot")
    comps = [c for c in dict.fromkeys(sweep["compressor"]) if c != BASELINE]
    if not comps:
        raise ValueError("ratio sweep without compressed runs: nothing to plot")
    metrics = sorted(dict.fromkeys(sweep["metric"]), key=sweep_metric_rank)
    labels = sweep_task_labels(sweep)[0]  # a task accuracy says its data: PiQA-format (enwiki, norm)
    styles = method_styles(_ordered_methods(sweep))
    fig, axes = new_figure(len(metrics), len(comps))
    for j, comp in enumerate(comps):
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            sel = sweep[(sweep["metric"] == m)]
            mine = sel[sel["compressor"] == comp]
            for strat in sorted(mine["strategy"].unique(), key=lambda s: method_order(comp, s)):
                g = mine[mine["strategy"] == strat].sort_values("ratio")
                label = g["method"].iloc[0]
                ax.plot(g["ratio"], g["value"], label=label, markersize=6, **styles[label])
            base = sel[sel["strategy"] == BASELINE_STRATEGY]
            if len(base):
                ax.axhline(float(base["value"].iloc[0]), label=BASELINE_LABEL, **BASELINE_STYLE)
            chance = next((v for k, v in TASK_CHANCE.items() if str(m).startswith(k + "_acc")), None)
            if chance is not None:
                ax.axhline(chance, color=OKABE_ITO["black"], linestyle=":", linewidth=1.0, alpha=0.6,
                           label="chance (tasks)")
            ax.set_xlabel("compression ratio")
            vals = pd.concat([mine["value"], base["value"]]).astype(float)
            vals = vals[vals > 0]
            log_axis = is_ppl(m) and len(vals) and vals.max() > 10 * vals.min()
            if log_axis:
                ax.set_yscale("log")
            note = (" (lower is better" + (", log axis)" if log_axis else ")") if is_ppl(m)
                    else " (higher is better)" if chance is not None else "")
            ax.set_ylabel(labels.get(str(m), metric_label(m)) + note)
            ax.set_title(compressor_label(comp) if i == 0 else "", fontsize=10)
            ax.grid(alpha=0.3)
            plain_ticks(ax)
    legend_outside(fig, axes=[ax for row in axes for ax in row], last=(BASELINE_LABEL, "chance (tasks)"))
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------- proxies
def plot_proxy_comparison(dims: pd.DataFrame, unit: int = DEFAULT_UNIT, title: str | None = None) -> Figure:
    """Figure 2: per proxy, each target's dim against its layer; marker = module kind (circle Q, square K,
    ...), colour = ``unit``-aligned (blue) or misaligned (vermillion). One panel per proxy that has dims, in a
    grid without empty cells where the count allows (else the legend fills the spare cell)."""
    if dims.empty:
        raise ValueError("no plan dims: nothing to plot")
    proxies = proxy_order(dims["proxy"].astype(str).unique())
    n = len(proxies)
    nrows = math.ceil(n / 4)
    ncols = math.ceil(n / nrows)
    fig, axes = new_figure(nrows, ncols, sharey=True)
    kinds = list(dict.fromkeys(dims["kind"]))
    offsets = {k: (i - (len(kinds) - 1) / 2) * min(0.12, 0.8 / max(1, len(kinds))) for i, k in enumerate(kinds)}
    for k, proxy in enumerate(proxies):
        ax = axes[k // ncols][k % ncols]
        g = dims[dims["proxy"].astype(str) == proxy]
        aligned = g["dim"] % unit == 0
        for kind, gk in g.groupby("kind", sort=False):
            x = gk["layer"].astype("float64").fillna(-1) + offsets[kind]
            ok = (gk["dim"] % unit == 0).to_numpy()
            colors = [ALIGNED_STYLE["color"] if a else MISALIGNED_STYLE["color"] for a in ok]
            ax.scatter(x, gk["dim"], c=colors, marker=KIND_MARKERS.get(kind, "x"), s=26, alpha=0.9,
                       edgecolors="none")
        ax.set_title(f"{proxy}: {100 * (1 - aligned.mean()):.0f}% misaligned (d mod {unit})", fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylabel("dim")
        ax.grid(alpha=0.3)
        plain_ticks(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # so are dims
    lo, hi = float(dims["dim"].min()), float(dims["dim"].max())
    if hi - lo < 2 * unit:  # near-equal dims: a window of a few units, not matplotlib's +-0.5 around one value
        mid = (lo + hi) / 2
        axes[0][0].set_ylim(mid - 2 * unit, mid + 2 * unit)  # shared y
    spare = [axes[k // ncols][k % ncols] for k in range(n, nrows * ncols)]
    for ax in spare:
        ax.remove()
    handles = [Line2D([], [], linestyle="none", marker=KIND_MARKERS.get(k, "x"), color="0.4", label=k) for k in kinds]
    # colour is a property of every marker shape: patches, not a marker that suggests a module kind
    handles += [Patch(color=ALIGNED_STYLE["color"], label=f"d mod {unit} = 0"),
                Patch(color=MISALIGNED_STYLE["color"], label=f"d mod {unit} ≠ 0")]
    legend_outside(fig, handles, [h.get_label() for h in handles], ncol=min(8, len(handles)))
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------- latency
def plot_latency_vs_seq_len(lat: pd.DataFrame, title: str | None = None) -> Figure:
    """Figure 10: prefill latency against sequence length per method (top) and its change against the
    baseline (bottom, with the bench's 95% interval as error bars where the latency came from ``gac bench``);
    one column per batch size. Raises ValueError when no batch has 2+ sequence lengths (not a curve)."""
    if lat.empty:
        raise ValueError("no latency points: nothing to plot")
    seqs_per_batch = lat.groupby("batch")["seq_len"].nunique()
    batches = sorted(b for b, n in seqs_per_batch.items() if n >= 2)
    if not batches:
        raise ValueError(f"latency at one sequence length only ({sorted(lat['seq_len'].unique())}): a curve needs 2+")
    styles = method_styles(_ordered_methods(lat))
    has_ci = {"change_lo", "change_hi"} <= set(lat.columns) and lat["change_lo"].notna().any()
    fig, axes = new_figure(2, len(batches), w=5.6 if len(batches) == 1 else 4.4, sharex="col")
    for j, b in enumerate(batches):
        sel = lat[lat["batch"] == b]
        top, bottom = axes[0][j], axes[1][j]
        for method, g in sel.groupby("method", sort=False):
            g = g.sort_values("seq_len")
            st = styles[method]
            base_row = g["strategy"].iloc[0] == BASELINE_STRATEGY
            top.plot(g["seq_len"], g["latency_ms"], label=method, markersize=6,
                     **({**st, "linestyle": "--"} if base_row else st))
            if not base_row:
                if has_ci and g["change_lo"].notna().any():
                    err = [(g["change_pct"] - g["change_lo"]).clip(lower=0), (g["change_hi"] - g["change_pct"]).clip(lower=0)]
                    bottom.errorbar(g["seq_len"], g["change_pct"], yerr=err, capsize=3, markersize=6, label=method,
                                    **st)
                else:
                    bottom.plot(g["seq_len"], g["change_pct"], label=method, markersize=6, **st)
        bottom.axhline(0.0, color="black", linewidth=0.8)
        seqs = sorted(sel["seq_len"].unique())
        top.set_xscale("log", base=2)
        top.set_xticks(seqs, [str(s) for s in seqs])
        top.minorticks_off()
        bottom.minorticks_off()
        top.set_ylabel("prefill latency (ms)")
        top.set_title(f"batch {b}", fontsize=10)
        bottom.set_ylabel("vs. baseline (%)" + (", 95% CI" if has_ci else ""))
        bottom.set_xlabel("sequence length")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        plain_ticks(top, "y")
        plain_ticks(bottom, "y")
    legend_outside(fig, axes=[axes[0][j] for j in range(len(batches))])
    if title:
        fig.suptitle(title)
    return fig


def plot_bench_ratios(ratios: pd.DataFrame, title: str | None = None) -> Figure:
    """The side-by-side bench's latency ratios to the baseline, one marker per method with its paired-bootstrap
    95% interval as an error bar; one panel per measured point (batch, S). ``ratios``: the frame of
    :func:`gac.analysis.benches.bench_ratios`."""
    if ratios.empty:
        raise ValueError("no bench ratios: nothing to plot")
    points = list(dict.fromkeys(zip(ratios["batch"], ratios["seq_len"])))
    methods = _ordered_methods(ratios)
    styles = method_styles(methods)
    fig, axes = new_figure(1, len(points), w=max(4.2, 0.9 * len(methods) + 1.6), sharey=True)
    for ax, (b, s) in zip(axes[0], points):
        sel = ratios[(ratios["batch"] == b) & (ratios["seq_len"] == s)]
        for x, m in enumerate(methods):
            r = sel[sel["method"] == m]
            if r.empty:
                continue
            r = r.iloc[0]
            y = 100.0 * (r["ratio"] - 1.0)
            lo = 100.0 * (r["lo"] - 1.0) if pd.notna(r["lo"]) else y
            hi = 100.0 * (r["hi"] - 1.0) if pd.notna(r["hi"]) else y
            ax.errorbar([x], [y], yerr=[[max(0.0, y - lo)], [max(0.0, hi - y)]], capsize=4, markersize=8,
                        linestyle="none", label=m, **styles[m])
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(methods)), methods, rotation=20, ha="right", fontsize=8)
        ax.set_xlabel("method")
        ax.set_xlim(-0.6, len(methods) - 0.4)
        base_ms = sel["baseline_ms"].dropna()
        ax.set_title(f"batch {b}, S={s}" + (f" (baseline {base_ms.iloc[0]:.1f} ms)" if len(base_ms) else ""),
                     fontsize=9)
        ax.set_ylabel("latency vs. baseline (%), 95% CI")
        ax.grid(alpha=0.3, axis="y")
        plain_ticks(ax, "y")
    legend_outside(fig, axes=axes[0])
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------- latency budget
def plot_latency_pareto(frame: pd.DataFrame, title: str | None = None) -> Figure:
    """Quality (perplexity) against measured prefill latency, one panel per compressor: a marker per plan, one
    series per method (a latency-budget plan's series names its kind of budget), each point labelled with its
    ratio, the side-by-side bench's 95% interval as a horizontal error bar, the baseline a star; a latency-budget
    plan's budget on the measured axis (its share of its reference plan's measured latency, or its absolute ms) a
    vertical tick at the same height. ``frame``: :func:`gac.analysis.pareto.latency_pareto`."""
    comp = frame[frame["strategy"] != BASELINE_STRATEGY]
    if comp.empty or comp["latency_ms"].notna().sum() < 2:
        raise ValueError("latency Pareto with fewer than 2 measured points: nothing to plot")
    comps = [c for c in dict.fromkeys(comp["compressor"])]
    order = list(dict.fromkeys(comp.sort_values("strategy", key=lambda s: [method_order("", x) for x in s],
                                                kind="stable")["method"]))
    styles = method_styles([BASELINE_LABEL, *order])
    fig, axes = new_figure(1, len(comps), w=7.0, h=4.2)
    base = frame[frame["strategy"] == BASELINE_STRATEGY]
    quality = frame.attrs.get("quality", "ppl")
    bench = frame.attrs.get("device") is not None
    budget_label = "latency budget (share x its reference plan, measured)"
    offsets = [(4, 5), (4, -11), (4, 15), (4, -21)]  # series of one panel label their points apart
    for ax, c in zip(axes[0], comps):
        mine = comp[comp["compressor"] == c]
        for i, m in enumerate([m for m in order if m in set(mine["method"])]):
            g = mine[mine["method"] == m].dropna(subset=["latency_ms", "quality"]).sort_values("latency_ms")
            if g.empty:
                continue
            x, y = g["latency_ms"].astype(float), g["quality"].astype(float)
            lo = (x - g["lo_ms"].astype(float)).clip(lower=0).fillna(0.0)
            hi = (g["hi_ms"].astype(float) - x).clip(lower=0).fillna(0.0)
            st = dict(styles[m], linestyle="none")
            ax.errorbar(x, y, xerr=[lo, hi], capsize=3, markersize=7, label=m, elinewidth=1.0, alpha=0.9, **st)
            for xi, yi, r in zip(x, y, g["ratio"]):
                if r == r:
                    ax.annotate(f"ρ={r:g}", (xi, yi), textcoords="offset points", xytext=offsets[i % len(offsets)],
                                fontsize=7, color=styles[m]["color"])
            budget = g.dropna(subset=["budget_measured_ms"])
            if len(budget):
                ax.plot(budget["budget_measured_ms"].astype(float), budget["quality"].astype(float), linestyle="none",
                        marker="|", markersize=16, markeredgewidth=2, color=styles[m]["color"], label=budget_label)
        if len(base) and pd.notna(base["latency_ms"].iloc[0]):
            ax.plot([float(base["latency_ms"].iloc[0])], [float(base["quality"].iloc[0])], linestyle="none",
                    markersize=12, label="Baseline (uncompressed)", color=OKABE_ITO["black"], marker="*")
        where = frame.attrs.get("device") or frame.attrs.get("gpu")
        ax.set_xlabel(f"prefill latency (ms), measured on {where}" + ("; bars: bench 95% CI" if bench else ""))
        ax.set_ylabel(f"{metric_label(quality)} (lower is better)")
        ax.set_title(compressor_label(c), fontsize=10)
        ax.grid(alpha=0.3)
        plain_ticks(ax, "y")
    legend_outside(fig, axes=axes[0], last=(budget_label, "Baseline (uncompressed)"))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------- plans
def _plan_methods(dims: pd.DataFrame) -> list[str]:
    return _ordered_methods(dims)


def plot_dstar_vs_dim(dims: pd.DataFrame, unit: int = DEFAULT_UNIT, title: str | None = None) -> Figure:
    """What each strategy did to the compressor's unconstrained dims: per compressor (column), every target's
    chosen dim against its d* (top, with the line d = d*) and the shift d - d* (bottom; the grey band is one
    ``unit``: where rounding to a multiple of ``unit`` lands). One series per strategy. ``dims``:
    :func:`gac.analysis.plan_dims` rows with ``d_star`` (records written before d* was stored have none)."""
    d = dims[dims["d_star"].notna()] if "d_star" in dims.columns else dims.iloc[0:0]
    if d.empty:
        raise ValueError("no plan targets with d* (records store plan.d_star since gac 0.1): nothing to plot")
    dense = d["dense"].astype(bool) if "dense" in d.columns else pd.Series(False, index=d.index)
    n_dense = d[dense].groupby(["compressor", "strategy"]).size()
    d = d[~dense]  # a target kept dense has no factorised dim to choose (d = d* = its dense rank)
    if d.empty:
        raise ValueError("every plan target was kept dense: no chosen dims to plot")
    comps = [c for c in dict.fromkeys(d["compressor"].astype(str))]
    styles = method_styles(_plan_methods(d))
    fig, axes = new_figure(2, len(comps), h=3.0, sharex="col")
    for j, comp in enumerate(comps):
        top, bottom = axes[0][j], axes[1][j]
        mine = d[d["compressor"].astype(str) == comp]
        lo = float(min(mine["d_star"].min(), mine["dim"].min())) - unit
        hi = float(max(mine["d_star"].max(), mine["dim"].max())) + unit
        for strat in sorted(mine["strategy"].astype(str).unique(), key=lambda s: method_order(comp, s)):
            g = mine[mine["strategy"].astype(str) == strat]
            label = method_label(comp, strat)
            st = styles[label]
            kw = dict(s=22, alpha=0.85, color=st["color"], marker=st["marker"], label=label, zorder=2)
            top.scatter(g["d_star"], g["dim"], **kw)
            bottom.scatter(g["d_star"], g["dim"] - g["d_star"], **kw)
        # references after the series (legend order), drawn below them; at least one unit of room on each side
        top.plot([lo, hi], [lo, hi], color="0.55", linewidth=0.8, zorder=1, label="d = d*")
        bottom.axhspan(-unit, unit, color="0.5", alpha=0.12, linewidth=0, zorder=0, label=f"|d − d*| < {unit}")
        bottom.axhline(0.0, color="0.55", linewidth=0.8, zorder=1)
        top.set_xlim(lo, hi)
        top.set_ylim(lo, hi)
        kept = int(n_dense[n_dense.index.get_level_values(0).astype(str) == comp].max()) if len(n_dense) and \
            (n_dense.index.get_level_values(0).astype(str) == comp).any() else 0
        top.set_title(compressor_label(comp) + (f" ({kept} targets kept dense, not shown)" if kept else ""),
                      fontsize=10)
        top.set_ylabel("chosen dim d")
        bottom.set_ylabel("d − d*")
        bottom.set_xlabel("unconstrained dim d* (the compressor's)")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            plain_ticks(ax)
    legend_outside(fig, axes=[ax for row in axes for ax in row], last=("d = d*", f"|d − d*| < {unit}"))
    if title:
        fig.suptitle(title)
    return fig


def plot_dim_residues(dims: pd.DataFrame, units: Sequence[int] = (8, 16, 32), title: str | None = None) -> Figure:
    """The distribution of chosen dims modulo 8, 16 and 32 per method: one panel per unit, the number of targets
    at each residue ``d mod u`` (residue 0 = aligned, shaded), one series (colour and marker) per method; the
    panel title gives each method's aligned share. Dense targets (left unfactorised) are counted as they are."""
    if dims.empty:
        raise ValueError("no plan dims: nothing to plot")
    methods = _plan_methods(dims)
    styles = method_styles(methods)
    labelled = dims.assign(method=[method_label(c, s) for c, s in zip(dims["compressor"], dims["strategy"])])
    fig = Figure(figsize=(15, 3.9), layout="constrained")
    axes = fig.subplots(1, len(units), width_ratios=[0.6 + u / 16 for u in units])
    axes = [axes] if len(units) == 1 else list(axes)
    width = 0.8 / max(1, len(methods))
    handles, labels = [], []
    for k, m in enumerate(methods):
        g = labelled[labelled["method"] == m]
        shares = "/".join(f"{100.0 * float((g['dim'] % u == 0).mean()):.0f}" for u in units)
        kept = int(g["dense"].sum()) if "dense" in g.columns else 0
        handles.append(Line2D([], [], linestyle="none", markersize=7, **styles[m]))
        labels.append(f"{m}: aligned at {'/'.join(str(u) for u in units)} = {shares}%"
                      + (f" ({kept} of {len(g)} kept dense)" if kept else ""))
        for ax, u in zip(axes, units):
            counts = (g["dim"] % u).value_counts().reindex(range(u), fill_value=0)
            x = [r + (k - (len(methods) - 1) / 2) * width for r in range(u)]
            nz = (counts > 0).to_numpy()
            xs = [xi for xi, z in zip(x, nz) if z]
            ax.vlines(xs, 0, counts[nz], color=styles[m]["color"], linewidth=1.2)
            ax.plot(xs, counts[nz], linestyle="none", markersize=6, **styles[m])
    for ax, u in zip(axes, units):
        ax.axvspan(-0.5, 0.5, color="0.5", alpha=0.15, linewidth=0)
        ax.text(0.0, 1.0, " aligned", transform=ax.get_xaxis_transform(), ha="left", va="top", fontsize=7)
        ax.set_xlim(-0.8, u - 0.2)
        ax.set_ylim(bottom=0)
        ax.set_xticks(range(0, u, 1 if u <= 8 else (2 if u <= 16 else 4)))
        ax.set_xlabel(f"d mod {u}")
        ax.set_ylabel("targets")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"residue of the chosen dims modulo {u}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        plain_ticks(ax)
    legend_outside(fig, handles, labels, ncol=min(3, len(handles)))
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------- kernels
def kernel_staircase(profile, unit: int = DEFAULT_UNIT, backend: str = "auto", value: str = "latency_ms") -> dict[str, Figure]:
    """Figures 5-7: the staircases of a kernel profile (drawn by :func:`gac.profiling.figures.staircase_figures`,
    the one staircase module): one figure per op. ``profile``: a HardwareProfile, its directory, or a tidy frame
    (see :func:`gac.analysis.profile_table`). Returns ``{op: Figure}``."""
    device = dtype = None
    if hasattr(profile, "device_name"):
        device, dtype = profile.device_name, getattr(profile, "dtype", None)
    elif not isinstance(profile, pd.DataFrame):
        from gac.profiling import load_profile

        prof = load_profile(profile)
        device, dtype, profile = prof.device_name, prof.dtype, prof
    t = profile_table(profile)
    if value != "latency_ms":
        t = t.assign(latency_ms=t[value])
    return staircase_figures(t, unit=unit, backend=backend, device=device, dtype=dtype)
