"""Every figure is produced (PNG and PDF) from the fixture store and profile."""

import pytest
from matplotlib.figure import Figure

import gac.analysis as ga
from tests.analysis.conftest import PROFILE


def _saved(fig, path):
    assert isinstance(fig, Figure)
    png, pdf = ga.save_figure(fig, path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000
    return fig


def test_ratio_sweep_figure(df, tmp_path):
    fig = _saved(ga.plot_ratio_sweep(ga.ratio_sweep(df)), tmp_path / "sweep")
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4  # (PPL, latency) x (ASVD, LLM-Pruner)
    labels = {t.get_text() for ax in axes for t in ax.get_legend().get_texts()}
    assert {"ASVD", "ASVD (GAC)", "ASVD (round-nearest)", "Baseline"} <= labels


def test_proxy_figure(df, tmp_path):
    fig = _saved(ga.plot_proxy_comparison(ga.proxy_dims(df, ratio=0.2)), tmp_path / "proxies")
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert titles == ["activation: 80% misaligned (d mod 8)", "fisher: 90% misaligned (d mod 8)",
                      "magnitude: 100% misaligned (d mod 8)", "taylor: 70% misaligned (d mod 8)"]


def test_latency_figure(df, tmp_path):
    fig = _saved(ga.plot_latency_vs_seq_len(ga.latency_vs_seq_len(df, ratio=0.15)), tmp_path / "lat")
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["batch 1", "batch 4"]


def test_kernel_staircases(tmp_path):
    figs = ga.kernel_staircase(PROFILE)
    assert sorted(figs) == ["gemm", "sdpa"]
    for op, fig in figs.items():
        _saved(fig, tmp_path / op)
    assert [ax.get_title() for ax in figs["gemm"].axes] == ["gemm_K", "gemm_N"]
    with pytest.raises(ValueError, match="no 'flash' sweep rows"):
        ga.kernel_staircase(PROFILE, backend="flash")


def test_empty_inputs_are_errors_not_blank_figures(df):
    with pytest.raises(ValueError, match="empty ratio sweep"):
        ga.plot_ratio_sweep(ga.ratio_sweep(df).iloc[0:0])
    with pytest.raises(ValueError, match="no latency points"):
        ga.plot_latency_vs_seq_len(ga.latency_vs_seq_len(df, ratio=0.15).iloc[0:0])
