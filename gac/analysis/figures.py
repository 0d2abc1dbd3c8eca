"""The paper's figures from the tables of :mod:`gac.analysis.tables`.

Figures are built with matplotlib's object API (``matplotlib.figure.Figure``), never ``pyplot``: no global
state, no GUI backend, nothing to close; :func:`save_figure` writes PNG and PDF through the Agg/PDF canvases.
In a notebook, show one with ``display(fig)`` or save it and show the PNG.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from gac.analysis.tables import METRIC_LABELS, _method_order, compressor_label, profile_table

log = logging.getLogger(__name__)

ALIGNED_COLOR, MISALIGNED_COLOR = "#2ca02c", "#d62728"
STRATEGY_STYLE = {"baseline": dict(color="black", linestyle="--"), "unaligned": dict(color="#d62728", marker="o"),
                  "gac": dict(color="#2ca02c", marker="s"), "round_nearest": dict(color="#1f77b4", marker="^"),
                  "round_up": dict(color="#9467bd", marker="v"), "round_down": dict(color="#8c564b", marker="<"),
                  "rebalance": dict(color="#ff7f0e", marker="D")}
KIND_MARKERS = {"q_proj": "o", "k_proj": "s", "v_proj": "^", "o_proj": "D", "gate_proj": "v", "up_proj": "<",
                "down_proj": ">", "mlp": "P"}
#: FlashAttention-2 head-dim templates (paper Table 2): a head dim d runs in the smallest template t >= d
FA2_TEMPLATES = (32, 64, 96, 128, 160, 192, 224, 256)
STAIRCASE_TITLES = {"sdpa": "SDPA latency across head dims (Figure 5)", "gemm": "GEMM latency with a dim sweep (Figure 7)",
                    "gemv": "GEMV latency with a dim sweep (Figure 6)"}


def save_figure(fig: Figure, stem: str | os.PathLike, formats: Sequence[str] = ("png", "pdf"),
                dpi: int = 150) -> list[Path]:
    """Write ``fig`` to ``stem.png`` and ``stem.pdf`` (or ``formats``); returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in formats:
        p = stem.with_name(f"{stem.name}.{ext}")
        fig.savefig(p, format=ext, dpi=dpi, bbox_inches="tight")
        paths.append(p)
    log.debug("wrote %s", ", ".join(str(p) for p in paths))
    return paths


def _grid(nrows: int, ncols: int, w: float = 4.2, h: float = 3.2, **kw):
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _style(strategy: str) -> dict:
    return dict(STRATEGY_STYLE.get(str(strategy), dict(marker="x")))


# ---------------------------------------------------------------------------------------------- ratio sweep
def plot_ratio_sweep(sweep: pd.DataFrame, title: str | None = None) -> Figure:
    """One column per compressor, one row per metric; a line per strategy against ratio, the baseline dashed."""
    if sweep.empty:
        raise ValueError("empty ratio sweep: nothing to plot")
    comps = [c for c in dict.fromkeys(sweep["compressor"]) if c != "none"]
    metrics = list(dict.fromkeys(sweep["metric"]))
    fig, axes = _grid(len(metrics), max(1, len(comps)))
    for j, comp in enumerate(comps):
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            sel = sweep[(sweep["metric"] == m)]
            mine = sel[sel["compressor"] == comp]
            for strat in sorted(mine["strategy"].unique(), key=lambda s: _method_order(comp, s)):
                g = mine[mine["strategy"] == strat]
                g = g.sort_values("ratio")
                ax.plot(g["ratio"], g["value"], label=g["method"].iloc[0], **_style(strat))
            base = sel[sel["strategy"] == "baseline"]
            if len(base):
                ax.axhline(float(base["value"].iloc[0]), label="Baseline", **_style("baseline"))
            ax.set_xlabel("compression ratio")
            ax.set_ylabel(METRIC_LABELS.get(m, m))
            if m.startswith("ppl"):
                ax.set_yscale("log")
            ax.set_title(compressor_label(comp) if i == 0 else "")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------- proxies
def plot_proxy_comparison(dims: pd.DataFrame, unit: int = 8, title: str | None = None) -> Figure:
    """Figure 2: per proxy, each target's dim against its layer; marker = module kind (circle Q, square K,
    triangle V, ...), colour = ``unit``-aligned (green) or misaligned (red)."""
    if dims.empty:
        raise ValueError("no plan dims: nothing to plot")
    proxies = sorted(dims["proxy"].astype(str).unique())
    ncols = min(4, len(proxies))
    nrows = math.ceil(len(proxies) / ncols)
    fig, axes = _grid(nrows, ncols, sharey=True)
    kinds = list(dict.fromkeys(dims["kind"]))
    offsets = {k: (i - (len(kinds) - 1) / 2) * min(0.12, 0.8 / max(1, len(kinds))) for i, k in enumerate(kinds)}
    for n, proxy in enumerate(proxies):
        ax = axes[n // ncols][n % ncols]
        g = dims[dims["proxy"].astype(str) == proxy]
        aligned = g["dim"] % unit == 0
        for kind, gk in g.groupby("kind", sort=False):
            x = gk["layer"].astype("float64").fillna(-1) + offsets[kind]
            ok = (gk["dim"] % unit == 0).to_numpy()
            colors = [ALIGNED_COLOR if a else MISALIGNED_COLOR for a in ok]
            ax.scatter(x, gk["dim"], c=colors, marker=KIND_MARKERS.get(kind, "x"), s=22, alpha=0.8,
                       edgecolors="none", label=kind)
        ax.set_title(f"{proxy}: {100 * (1 - aligned.mean()):.0f}% misaligned (d mod {unit})", fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylabel("dim")
        ax.grid(alpha=0.3)
    for n in range(len(proxies), nrows * ncols):
        axes[n // ncols][n % ncols].set_visible(False)
    handles = [axes[0][0].scatter([], [], marker=KIND_MARKERS.get(k, "x"), c="grey", label=k) for k in kinds]
    handles += [axes[0][0].scatter([], [], marker="o", c=ALIGNED_COLOR, label=f"{unit}-aligned"),
                axes[0][0].scatter([], [], marker="o", c=MISALIGNED_COLOR, label="misaligned")]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(8, len(handles)), fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------- latency
def plot_latency_vs_seq_len(lat: pd.DataFrame, title: str | None = None) -> Figure:
    """Figure 10: prefill latency against sequence length per method (top) and its change against the
    baseline (bottom); one column per batch size."""
    if lat.empty:
        raise ValueError("no latency points: nothing to plot")
    batches = sorted(lat["batch"].unique())
    fig, axes = _grid(2, len(batches), sharex="col")
    for j, b in enumerate(batches):
        sel = lat[lat["batch"] == b]
        top, bottom = axes[0][j], axes[1][j]
        for method, g in sel.groupby("method", sort=False):
            g = g.sort_values("seq_len")
            style = _style(g["strategy"].iloc[0])
            style.setdefault("marker", "x")  # a lone baseline point needs a marker
            if g["strategy"].iloc[0] != "baseline" and g["compressor"].iloc[0] != "asvd":
                style["linestyle"] = ":"
            top.plot(g["seq_len"], g["latency_ms"], label=method, **style)
            if g["strategy"].iloc[0] != "baseline":
                bottom.plot(g["seq_len"], g["change_pct"], label=method, **style)
        bottom.axhline(0.0, color="black", linewidth=0.8)
        seqs = sorted(sel["seq_len"].unique())
        top.set_xscale("log", base=2)
        top.set_xticks(seqs, [str(s) for s in seqs])
        top.minorticks_off()
        bottom.minorticks_off()
        top.set_ylabel("prefill latency (ms)")
        top.set_title(f"batch {b}")
        bottom.set_ylabel("vs. baseline (%)")
        bottom.set_xlabel("sequence length")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------- kernels
def kernel_staircase(profile, unit: int = 8, backend: str = "auto", value: str = "latency_ms") -> dict[str, Figure]:
    """Figures 5-7: the staircases of a kernel profile, one figure per op (``sdpa``: latency against head dim
    with the FA2 template regions shaded, Figure 5; ``gemm``: one panel per swept axis M/N/K, Figure 7;
    ``gemv``: Figure 6). Aligned dims (``d % unit == 0``) green, misaligned red.

    ``profile``: a HardwareProfile, its directory, or a tidy frame (see :func:`gac.analysis.profile_table`).
    Target rows (non-empty ``context``) are left out. Returns ``{op: Figure}``.
    """
    t = profile_table(profile)
    t = t[(t["context"] == "") & (t["backend"] == backend)]
    if t.empty:
        raise ValueError(f"no {backend!r} sweep rows in the profile: nothing to plot")
    figs = {}
    for op, g in t.groupby(t["op"].where(t["op"] != "", t["sweep"]), sort=True):
        sweeps = sorted(g["sweep"].unique())
        fig, axes = _grid(1, len(sweeps))
        for ax, sweep in zip(axes[0], sweeps):
            s = g[g["sweep"] == sweep].groupby("dim", as_index=False)[value].median().sort_values("dim")
            ax.plot(s["dim"], s[value], color="grey", linewidth=0.7, zorder=1)
            ok = s["dim"] % unit == 0
            ax.scatter(s["dim"][ok], s[value][ok], c=ALIGNED_COLOR, s=10, zorder=2, label=f"d mod {unit} = 0")
            ax.scatter(s["dim"][~ok], s[value][~ok], c=MISALIGNED_COLOR, s=10, zorder=2, label="misaligned")
            axis = g[g["sweep"] == sweep]["axis"].iloc[0]
            if op == "sdpa" or axis == "head_dim":
                _shade_templates(ax, int(s["dim"].min()), int(s["dim"].max()))
            ax.set_xlabel(axis if axis and axis != "dim" else "dim")
            ax.set_ylabel("latency (ms)" if value == "latency_ms" else value)
            ax.set_title(sweep, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(STAIRCASE_TITLES.get(str(op), f"{op} latency across dims"))
        figs[str(op)] = fig
    return figs


def _shade_templates(ax, lo: int, hi: int) -> None:
    prev = 0
    for i, t in enumerate(FA2_TEMPLATES):
        a, b = max(prev, lo - 0.5), min(t + 0.5, hi + 0.5)
        if b > a:
            ax.axvspan(a, b, color="grey", alpha=0.08 if i % 2 else 0.18, linewidth=0)
            ax.text((a + b) / 2, 0.98, f"t={t}", transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=6)
        prev = t + 0.5

