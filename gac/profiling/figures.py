"""Kernel staircase figures (the paper's Figures 5-7) and the style every gac figure shares.

This is the one staircase module: ``gac profile figures`` / ``experiments/profile_device.py`` (:func:`save_figures`) and
``gac report`` (:func:`gac.analysis.kernel_staircase`) both draw with :func:`staircase_figures`. It sits in
``gac.profiling`` because ``gac.analysis`` may import profiling but not the other way round
(``tests/test_layering.py``); the style helpers live here for the same reason.

Style (what a reviewer checks): the Okabe-Ito colour-blind-safe palette; every series differs by colour *and*
marker; plain (non-scientific, offset-free) tick labels on linear axes; legends outside the data (below the
axes); titles that name the model or device, the ratio and the dtype where they apply. Figures use matplotlib's
object API (``matplotlib.figure.Figure``): no pyplot state, nothing to close.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, ScalarFormatter

from gac.align.candidates import DEFAULT_UNIT
from gac.io import replace_file

log = logging.getLogger(__name__)

#: Okabe & Ito (2008), the colour-blind-safe qualitative palette (also seaborn's "colorblind")
OKABE_ITO = {"orange": "#E69F00", "sky_blue": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
             "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "black": "#000000"}
#: series colours in order (yellow last: weak on white)
SERIES_COLORS = tuple(OKABE_ITO[c] for c in ("blue", "vermillion", "green", "orange", "purple", "sky_blue",
                                               "yellow"))
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
ALIGNED_STYLE = {"color": OKABE_ITO["blue"], "marker": "o"}
MISALIGNED_STYLE = {"color": OKABE_ITO["vermillion"], "marker": "X"}
BASELINE_STYLE = {"color": OKABE_ITO["black"], "linestyle": "--", "linewidth": 1.2}
#: forced SDPA backends: thin lines with small markers, colours apart from the aligned/misaligned points
BACKEND_STYLE = {"flash": {"color": OKABE_ITO["sky_blue"], "marker": "v", "linestyle": "--"},
                 "efficient": {"color": OKABE_ITO["green"], "marker": "s", "linestyle": "-."},
                 "cudnn": {"color": OKABE_ITO["purple"], "marker": "^", "linestyle": ":"},
                 "math": {"color": OKABE_ITO["orange"], "marker": "D", "linestyle": ":"}}
#: FlashAttention-2 head-dim templates (paper Table 2): a head dim d runs in the smallest template t >= d
FA2_TEMPLATES = (32, 64, 96, 128, 160, 192, 224, 256)
STAIRCASE_TITLES = {"sdpa": "SDPA latency across head dims (Figure 5)", "gemm": "GEMM latency across dims (Figure 7)",
                    "gemv": "GEMV latency across dims (Figure 6)", "gemm_tput": "GEMM throughput, stride-1 sweep"}


# ---------------------------------------------------------------------------------------------- style
def new_figure(nrows: int, ncols: int, w: float = 4.2, h: float = 3.2, **kw):
    """A constrained-layout figure with an ``nrows x ncols`` grid of axes (``axes[i][j]``)."""
    fig = Figure(figsize=(w * ncols, h * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def series_style(i: int) -> dict:
    """The ``i``-th series' colour and marker (both differ from every other series up to 7)."""
    return {"color": SERIES_COLORS[i % len(SERIES_COLORS)], "marker": SERIES_MARKERS[i % len(SERIES_MARKERS)]}


def plain_ticks(ax, axis: str = "both") -> None:
    """Plain numbers on a linear axis: no scientific notation, no offset (``1e3`` / ``+2.4e2`` corners); on a
    log axis, ticks at 1, 2 and 5 of every decade written as plain numbers (20, 50, 100, 200, ...), never
    ``6x10^1`` minor labels."""
    for which in (("x", "y") if axis == "both" else (axis,)):
        target = ax.xaxis if which == "x" else ax.yaxis
        scale = ax.get_xscale() if which == "x" else ax.get_yscale()
        if scale == "log":
            target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            target.set_minor_formatter(NullFormatter())
            continue
        if scale != "linear":
            continue
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_scientific(False)
        target.set_major_formatter(fmt)


def legend_outside(fig: Figure, handles=None, labels=None, ncol: int | None = None, axes=None, last=()):
    """One figure legend below the axes (outside the data); handles default to the unique ones of ``axes``, the
    labels in ``last`` (reference lines, bands) after the series."""
    if handles is None:
        seen: dict = {}
        for ax in axes if axes is not None else fig.axes:
            for h, lbl in zip(*ax.get_legend_handles_labels()):
                if lbl and not lbl.startswith("_"):
                    seen.setdefault(lbl, h)
        order = [lbl for lbl in seen if lbl not in last] + [lbl for lbl in seen if lbl in last]
        labels, handles = order, [seen[lbl] for lbl in order]
    if not handles:
        return None
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol or min(len(handles), 6), fontsize=8,
                      frameon=False)


def figure_title(what: str, model=None, ratio=None, device=None, dtype=None, extra: str = "") -> str:
    """``"Table 5 latency — tiny, ratio 0.15, on cpu"``: what the figure shows, then model, ratio, device."""
    parts = []
    if model is not None:
        parts.append(str(model))
    if ratio is not None and not (isinstance(ratio, float) and math.isnan(ratio)):
        parts.append(f"ratio {float(ratio):g}")
    if device is not None:
        parts.append(f"on {device}" + (f", {dtype}" if dtype else ""))
    return what + (" — " + ", ".join(parts) if parts else "") + (extra or "")


def save_figure(fig: Figure, stem, formats=("png", "pdf"), dpi: int = 150) -> list[Path]:
    """Write ``fig`` to ``stem.png`` and ``stem.pdf`` (or ``formats``), replacing what is there; returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in formats:
        p = stem.with_name(f"{stem.name}.{ext}")
        # through a temp file renamed over the name: a link planted there is replaced, not written through
        replace_file(p, lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=dpi, bbox_inches="tight"))
        paths.append(p)
    log.debug("wrote %s", ", ".join(str(p) for p in paths))
    return paths


# ---------------------------------------------------------------------------------------------- staircases
#: a forced backend whose fastest point is this many times the slowest of the plotted backend is named in a note
#: rather than drawn (the A100's forced Math at ~27 ms would flatten a 1-5 ms staircase to a line)
OFF_SCALE = 3.0


def _op_of(row_op: str, sweep: str) -> str:
    if sweep.startswith("gemm_tput"):
        return "gemm_tput"
    return row_op or sweep


def staircase_figures(table: pd.DataFrame, unit: int = DEFAULT_UNIT, backend: str = "auto", device: str | None = None,
                      dtype: str | None = None, cliffs: bool = True) -> dict[str, Figure]:
    """Figures 5-7 from a profile table (``sweep, op, axis, dim, backend, latency_ms, tflops, ...``; target rows
    with a ``context`` are left out): one figure per op (``sdpa``, ``gemm``, ``gemv``, ``gemm_tput``), one panel
    per swept axis, latency (TFLOPS for the stride-1 throughput sweeps) against the dim. ``unit``-aligned dims are
    blue circles, misaligned vermillion crosses; cliffs (:func:`gac.profiling.cliffs.analyze`) are ringed; SDPA
    panels shade the FA2 head-dim templates and draw each forced backend where the profile has them.
    Returns ``{op: Figure}``; raises ValueError when no row of ``backend`` is left."""
    from gac.profiling.profile import is_derived_sweep

    t = table
    if "context" in t.columns:
        t = t[t["context"].fillna("").astype(str) == ""]
    t = t[~t["sweep"].astype(str).map(is_derived_sweep)]  # curves as drawn in a figure, not measurements
    forced = t[(t["backend"] != backend) & (t["backend"] != "auto")] if "backend" in t.columns else t.iloc[0:0]
    t = t[t["backend"] == backend] if "backend" in t.columns else t
    if t.empty:
        raise ValueError(f"no {backend!r} sweep rows in the profile: nothing to plot")
    ops = [_op_of(str(o) if isinstance(o, str) else "", str(s)) for o, s in zip(t["op"], t["sweep"])]
    figs = {}
    for op, g in t.groupby(pd.Series(ops, index=t.index), sort=True):
        sweeps = sorted(g["sweep"].unique())
        value = "tflops" if op == "gemm_tput" else "latency_ms"
        fig, axes = new_figure(1, len(sweeps), w=6.0 if len(sweeps) == 1 else 4.6)
        for ax, sweep in zip(axes[0], sweeps):
            rows = g[g["sweep"] == sweep]
            s = rows.groupby("dim", as_index=False)[value].median().sort_values("dim")
            s = s[s[value].notna()]
            axis = str(rows["axis"].iloc[0]) if "axis" in rows.columns else "dim"
            if op == "sdpa" or axis == "head_dim":
                _shade_templates(ax, int(s["dim"].min()), int(s["dim"].max()))
                off_scale = []
                for b, fb in forced[forced["sweep"] == sweep].groupby("backend", sort=True):
                    fb = fb[fb["supported"].fillna(False).astype(bool)] if "supported" in fb.columns else fb
                    fb = fb.groupby("dim", as_index=False)[value].median().sort_values("dim")
                    if len(fb) and fb[value].min() > OFF_SCALE * s[value].max():
                        off_scale.append((str(b), fb))  # would squash the staircase: say it in words instead
                        continue
                    st = BACKEND_STYLE.get(str(b), {"color": OKABE_ITO["yellow"], "marker": "P", "linestyle": "--"})
                    ax.plot(fb["dim"], fb[value], linewidth=0.8, markersize=3, alpha=0.75, label=f"{b} (forced)", **st)
                if off_scale:
                    ax.text(0.01, 0.98, "\n".join(
                        f"{b} (forced), off scale: {fb[value].min():.3g}-{fb[value].max():.3g} ms "
                        f"at d={int(fb['dim'].min())}..{int(fb['dim'].max())}" for b, fb in off_scale),
                        transform=ax.transAxes, ha="left", va="top", fontsize=7,
                        bbox={"facecolor": "white", "edgecolor": "0.7", "linewidth": 0.5})
            ax.plot(s["dim"], s[value], color="0.6", linewidth=0.7, zorder=1)
            ok = s["dim"] % unit == 0
            ax.scatter(s["dim"][ok], s[value][ok], s=16, zorder=2, label=f"d mod {unit} = 0", **ALIGNED_STYLE)
            ax.scatter(s["dim"][~ok], s[value][~ok], s=16, zorder=2, label=f"d mod {unit} ≠ 0", **MISALIGNED_STYLE)
            if cliffs and value == "latency_ms":
                _mark_cliffs(ax, table, sweep, s)
            ax.set_xlabel(f"{axis if axis and axis != 'dim' else 'dim'} ({sweep})")
            if "selected_backend" in rows.columns and rows["selected_backend"].fillna("").astype(str).str.len().any():
                picked = rows.groupby("dim")["selected_backend"].first().fillna("").astype(str)
                counts = picked[picked != ""].value_counts()
                ax.set_xlabel(ax.get_xlabel() + "\nPyTorch's dispatch picked: "
                              + ", ".join(f"{b} at {n} dims" for b, n in counts.items()))
            ax.set_ylabel("TFLOPS" if value == "tflops" else "latency (ms)")
            ax.grid(alpha=0.3)
            plain_ticks(ax)
        legend_outside(fig, axes=axes[0])
        fig.suptitle(figure_title(STAIRCASE_TITLES.get(str(op), f"{op} latency across dims"), device=device,
                                  dtype=dtype))
        figs[str(op)] = fig
    return figs


def _mark_cliffs(ax, table: pd.DataFrame, sweep: str, s: pd.DataFrame) -> None:
    try:
        from gac.profiling.cliffs import analyze

        found = set(analyze(table, sweep).cliffs)
    except Exception as e:  # a frame without the columns cliff detection needs: plot without rings
        log.debug("no cliff analysis for %s: %s", sweep, e)
        return
    c = s[s["dim"].isin(found)]
    if len(c):
        ax.scatter(c["dim"], c["latency_ms"], s=42, facecolors="none", edgecolors="black", linewidths=0.5,
                   alpha=0.7, label="cliff (detected)", zorder=3)


def _shade_templates(ax, lo: int, hi: int) -> None:
    prev = 0
    for i, t in enumerate(FA2_TEMPLATES):
        a, b = max(prev, lo - 0.5), min(t + 0.5, hi + 0.5)
        if b > a:
            ax.axvspan(a, b, color="0.5", alpha=0.06 if i % 2 else 0.14, linewidth=0)
            ax.text((a + b) / 2, 1.005, f"FA2 t={t}", transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=6)
        prev = t + 0.5


FIGURE_FILES = {"sdpa": "sdpa_latency.png", "gemm": "gemm_latency.png", "gemv": "gemv_latency.png",
                "gemm_tput": "gemm_tflops.png"}


def save_figures(profile, out_dir: str | Path) -> list[Path]:
    """Write the staircases a :class:`~gac.profiling.HardwareProfile` has data for into ``out_dir``
    (``sdpa_latency.png``, ``gemm_latency.png``, ``gemv_latency.png``, ``gemm_tflops.png``); returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        figs = staircase_figures(profile.table, device=profile.device_name, dtype=profile.dtype)
    except ValueError as e:
        log.warning("no staircase figures: %s", e)
        return []
    paths = []
    for op, fig in figs.items():
        path = out / FIGURE_FILES.get(op, f"{op}_latency.png")
        replace_file(path, lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
        paths.append(path)
    log.info("wrote %d figures to %s", len(paths), out)
    return paths


def summary_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """Tables as Markdown sections (pandas ``to_markdown``)."""
    parts = []
    for title, df in tables.items():
        parts.append(f"### {title}\n")
        parts.append("(none)\n" if df.empty else df.to_markdown(index=False) + "\n")
    return "\n".join(parts)
