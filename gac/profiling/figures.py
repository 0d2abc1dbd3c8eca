"""Figures like the paper's Figures 5-8, drawn from a profile (matplotlib's object API: no global state)."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from gac.profiling.cliffs import analyze
from gac.profiling.profile import HardwareProfile

log = logging.getLogger(__name__)

_BACKEND_COLORS = {"flash": "tab:green", "efficient": "tab:blue", "cudnn": "tab:purple", "math": "tab:red"}


def _title(profile: HardwareProfile, what: str) -> str:
    return f"{what} — {profile.device_name}, {profile.dtype}"


def _mark_cliffs(ax, profile: HardwareProfile, sweep: str, y: str = "latency_ms") -> None:
    a = analyze(profile.table, sweep)
    t = profile.sweep(sweep)
    c = t[t["dim"].isin(a.cliffs)]
    if len(c):
        ax.scatter(c["dim"], c[y], s=18, facecolors="none", edgecolors="black", label="cliff", zorder=3)


def sdpa_figure(profile: HardwareProfile) -> Figure | None:
    """Figure 5: SDPA latency vs head_dim, coloured by the backend PyTorch picked, plus each forced backend."""
    t = profile.sweep("sdpa_head_dim", backend=None)
    if not len(t):
        return None
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    for b, g in t[t["backend"] != "auto"].groupby("backend"):
        g = g[g["supported"].fillna(False).astype(bool)]
        ax.plot(
            g["dim"], g["latency_ms"], lw=0.8, alpha=0.5, color=_BACKEND_COLORS.get(b), label=f"{b} (forced)"
        )
    auto = t[t["backend"] == "auto"]
    for b, g in auto.groupby("selected_backend"):
        ax.scatter(
            g["dim"],
            g["latency_ms"],
            s=10,
            color=_BACKEND_COLORS.get(b, "gray"),
            label=f"auto → {b}",
            zorder=2,
        )
    _mark_cliffs(ax, profile, "sdpa_head_dim")
    ax.set_xlabel("head dimension d")
    ax.set_ylabel("latency (ms)")
    ax.set_title(_title(profile, "SDPA latency"))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def _sweep_axes(profile: HardwareProfile, sweeps: list[str], y: str, ylabel: str, what: str) -> Figure | None:
    present = [s for s in sweeps if s in profile.sweeps()]
    if not present:
        return None
    fig = Figure(figsize=(4.2 * len(present), 3.8))
    for i, s in enumerate(present):
        ax = fig.add_subplot(1, len(present), i + 1)
        t = profile.sweep(s)
        aligned = t["dim"] % 8 == 0
        ax.plot(t["dim"], t[y], lw=0.6, color="gray")
        ax.scatter(t.loc[~aligned, "dim"], t.loc[~aligned, y], s=6, color="tab:red", label="d%8≠0")
        ax.scatter(t.loc[aligned, "dim"], t.loc[aligned, y], s=10, color="tab:green", label="d%8=0")
        if y == "latency_ms":
            _mark_cliffs(ax, profile, s)
        ax.set_xlabel(f"{t['axis'].iloc[0]} ({s})")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(profile, what))
    fig.tight_layout()
    return fig


def save_figures(profile: HardwareProfile, out_dir: str | Path) -> list[Path]:
    """Write the figures the profile has data for into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = {
        "sdpa_latency.png": sdpa_figure(profile),
        "gemv_latency.png": _sweep_axes(
            profile, ["gemv_K", "gemv_N"], "latency_ms", "latency (ms)", "GEMV (M=1)"
        ),
        "gemm_latency.png": _sweep_axes(
            profile, ["gemm_M", "gemm_N", "gemm_K"], "latency_ms", "latency (ms)", "GEMM dimension sweep"
        ),
        "gemm_tflops.png": _sweep_axes(
            profile, ["gemm_tput_K", "gemm_tput_N"], "tflops", "TFLOPS", "GEMM throughput (stride-1 sweep)"
        ),
    }
    paths = []
    for name, fig in figs.items():
        if fig is None:
            continue
        path = out / name
        fig.savefig(path, dpi=120)
        paths.append(path)
    log.info("wrote %d figures to %s", len(paths), out)
    return paths


def summary_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """Tables as Markdown (no extra dependency: pandas' to_markdown needs tabulate)."""
    parts = []
    for title, df in tables.items():
        parts.append(f"### {title}\n")
        if df.empty:
            parts.append("(none)\n")
            continue
        cols = list(df.columns)
        parts.append("| " + " | ".join(cols) + " |")
        parts.append("|" + "|".join("---" for _ in cols) + "|")
        for _, r in df.iterrows():
            parts.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
        parts.append("")
    return "\n".join(parts)
