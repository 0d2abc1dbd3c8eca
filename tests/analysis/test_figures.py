"""Every figure is produced (PNG and PDF) from the fixture store and profile, and passes what a reviewer checks
that a program can: the series are there, no axes are empty, axes are labelled, the legend sits outside the
axes, colours come from the colour-blind-safe palette, every series has its own colour and marker."""

import matplotlib.colors as mcolors
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import gac.analysis as ga
from gac.profiling.figures import OKABE_ITO
from tests.analysis.conftest import PROFILE, with_task_files

ALLOWED = {mcolors.to_hex(c) for c in OKABE_ITO.values()}


def _saved(fig, path):
    assert isinstance(fig, Figure)
    png, pdf = ga.save_figure(fig, path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000
    return fig


def _points(ax) -> int:
    n = sum(len(line.get_xdata()) for line in ax.get_lines())
    return n + sum(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets"))


def _check(fig, series=None, title=None, unique=True):
    """The reviewer's checklist; returns the legend labels."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert axes
    for ax in axes:
        assert _points(ax) > 0, f"empty axes {ax.get_title()!r}"
        if ax.get_subplotspec().is_last_row() or not ax.get_shared_x_axes().get_siblings(ax)[1:]:
            assert ax.get_xlabel(), "an axis without an x label"
        assert ax.get_ylabel(), "an axis without a y label"
        assert ax.get_legend() is None, "a legend inside the axes"
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers: no "1e3" / "+2.4e2" corner text
            assert not axis.get_offset_text().get_text()
    assert len(fig.legends) == 1, "one figure legend"
    legend = fig.legends[0]
    box = legend.get_window_extent(r)
    for ax in axes:
        assert not box.overlaps(ax.get_window_extent(r)), "the legend overlaps the data"
    labels = [t.get_text() for t in legend.get_texts()]
    if series is not None:
        assert set(series) <= set(labels), labels
    # colours of data series: Okabe-Ito (or black/grey for references); colour + marker unique per series
    styles = []
    for h, lbl in zip(legend.legend_handles, labels):
        color = getattr(h, "get_color", lambda: None)()
        if color is None and hasattr(h, "get_facecolor"):
            fc = h.get_facecolor()
            color = fc[0] if len(fc) else None
        marker = h.get_marker() if hasattr(h, "get_marker") else None
        if color is None or marker in (None, "None", "none", ""):
            continue
        hexc = mcolors.to_hex(color)
        r_, g_, b_ = mcolors.to_rgb(color)
        assert hexc in ALLOWED or (abs(r_ - g_) < 1e-6 and abs(g_ - b_) < 1e-6), f"{lbl}: colour {hexc}"
        styles.append((hexc, str(marker)))
    if unique:
        assert len({c for c, _ in styles}) == len(styles) and len({m for _, m in styles}) == len(styles), styles
    if title is not None:
        assert title in fig._suptitle.get_text()
    return labels


def test_ratio_sweep_figure(df, tmp_path):
    fig = ga.plot_ratio_sweep(ga.ratio_sweep(df), title=ga.figure_title("sweep", model="tiny", device="a100"))
    _saved(fig, tmp_path / "sweep")
    labels = _check(fig, {"ASVD", "ASVD (GAC)", "ASVD (round-nearest)", "Baseline", "LLM-Pruner"},
                    title="sweep — tiny, on a100")
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 4  # (PPL, latency) x (ASVD, LLM-Pruner)
    ppl = [ax for ax in fig.axes if ax.get_ylabel().startswith("PPL")]
    assert ppl and all(ax.get_yscale() == "linear" for ax in ppl)  # perplexity on a linear axis
    assert labels.count("Baseline") == 1


def test_ratio_sweep_figure_goes_log_when_a_compressor_breaks_the_model(df):
    sw = ga.ratio_sweep(df)
    ppl = sw["metric"].astype(str).str.startswith("ppl")
    comp = ppl & (sw["strategy"] != "baseline")
    top = sw[comp].groupby("compressor")["ratio"].transform("max")
    sw.loc[top.index[sw.loc[top.index, "ratio"] == top], "value"] *= 50  # every compressor 50x at its top ratio
    fig = ga.plot_ratio_sweep(sw)
    scales = {ax.get_yscale() for ax in fig.axes if ax.get_visible() and ax.get_ylabel().startswith("PPL")}
    assert scales == {"log"}
    assert ga.plot_ratio_sweep(ga.ratio_sweep(df)).axes[0].get_yscale() == "linear"  # the same sweep unbroken
    assert all("log axis" in ax.get_ylabel() for ax in fig.axes if ax.get_yscale() == "log")


def test_proxy_figure(df, tmp_path):
    fig = _saved(ga.plot_proxy_comparison(ga.proxy_dims(df, ratio=0.2)), tmp_path / "proxies")
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert titles == ["magnitude: 100% misaligned (d mod 8)", "activation: 80% misaligned (d mod 8)",
                      "fisher: 90% misaligned (d mod 8)", "taylor: 70% misaligned (d mod 8)"]  # Table 1's order
    # two keys: marker = module kind (grey), colour = aligned or not
    _check(fig, {"q_proj", "k_proj", "d mod 8 = 0", "d mod 8 ≠ 0"}, unique=False)
    # five proxies: a 2 x 3 grid whose spare cell is removed, not left empty
    dims = ga.proxy_dims(df, ratio=0.2)
    extra = dims[dims["proxy"] == "taylor"].assign(proxy="random")
    fig5 = ga.plot_proxy_comparison(pd.concat([dims, extra]))
    assert len(fig5.axes) == 5
    _check(fig5, unique=False)


def test_latency_figure(df, tmp_path):
    fig = _saved(ga.plot_latency_vs_seq_len(ga.latency_vs_seq_len(df, ratio=0.15)), tmp_path / "lat")
    # batch 4 was measured at one sequence length: not a curve, left out (gac report notes it)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["batch 1"]
    _check(fig, {"Baseline", "ASVD", "ASVD (GAC)", "LLM-Pruner"})
    one = ga.latency_vs_seq_len(df, ratio=0.15)
    with pytest.raises(ValueError, match="one sequence length"):
        ga.plot_latency_vs_seq_len(one[one["seq_len"] == 1024])


def test_latency_figure_error_bars_from_a_bench(df):
    lat = ga.latency_vs_seq_len(df, ratio=0.15)
    lat = lat.assign(change_lo=lat["change_pct"] - 5.0, change_hi=lat["change_pct"] + 3.0)
    fig = ga.plot_latency_vs_seq_len(lat)
    bottom = [ax for ax in fig.axes if ax.get_ylabel().startswith("vs. baseline")][0]
    assert "95% CI" in bottom.get_ylabel()
    bars = [c for c in bottom.collections if type(c).__name__ == "LineCollection"]
    assert bars and sum(len(c.get_segments()) for c in bars) >= 7  # one bar per compressed point
    _check(fig)


def _bench_summary():
    def var(comp, strat, ms, ratio, lo, hi):
        return {"ms": ms, "ratio": ratio, "lo": lo, "hi": hi, "compressor": comp, "strategy": strat,
                "ratio_param": 0.15, "label": None}
    return {"key": "b" * 16, "created": "2025-01-03T00:00:00Z", "model": "tiny", "device": "NVIDIA A100",
            "device_type": "cuda", "rounds": 30, "baseline_record": None, "path": "",
            "points": {"prefill_ms@1024": {"batch": 1, "seq_len": 1024, "baseline_ms": 100.0, "variants": {
                "a1": var("asvd", "unaligned", 101.0, 1.01, 0.99, 1.03),
                "a2": var("asvd", "gac", 66.0, 0.66, 0.64, 0.69)}}}}


def test_bench_ratio_figure(tmp_path):
    r = ga.bench_ratios(_bench_summary())
    assert list(r["method"]) == ["ASVD", "ASVD (GAC)"] and r.attrs["device"] == "NVIDIA A100"
    fig = _saved(ga.plot_bench_ratios(r, title=ga.figure_title("bench", model="tiny", ratio=0.15,
                                                                 device="NVIDIA A100")), tmp_path / "bench")
    _check(fig, {"ASVD", "ASVD (GAC)"}, title="bench — tiny, ratio 0.15, on NVIDIA A100")
    ax = fig.axes[0]
    segs = [s for c in ax.collections if type(c).__name__ == "LineCollection" for s in c.get_segments()]
    spans = sorted(round(float(s[1][1] - s[0][1]), 6) for s in segs)
    assert spans == [4.0, 5.0]  # the 95% intervals: (0.99, 1.03) and (0.64, 0.69), in %
    with pytest.raises(ValueError, match="no bench ratios"):
        ga.plot_bench_ratios(r.iloc[0:0])


def test_dstar_figure(df, tmp_path):
    dims = ga.plan_dims(ga.latest_per_key(df[df["ratio"].sub(0.15).abs() < 1e-9]))
    assert dims["d_star"].notna().sum() == 3 * 10 + 2 * 4
    fig = _saved(ga.plot_dstar_vs_dim(dims, title="d*"), tmp_path / "dstar")
    _check(fig, {"ASVD", "ASVD (GAC)", "ASVD (round-nearest)", "LLM-Pruner", "LLM-Pruner (GAC)", "d = d*"})
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["ASVD", "LLM-Pruner"]
    shift = [ax for ax in fig.axes if ax.get_ylabel() == "d − d*"][0]
    # unaligned floors d*: every shift in (-1, 0]; the plotted points hold all 10 ASVD targets per strategy
    offsets = [c.get_offsets() for c in shift.collections if len(c.get_offsets()) == 10]
    assert len(offsets) == 3 and any(((o[:, 1] <= 0) & (o[:, 1] > -1)).all() for o in offsets)
    with pytest.raises(ValueError, match="no plan targets with d"):
        ga.plot_dstar_vs_dim(ga.plan_dims(df[df["ratio"].sub(0.3).abs() < 1e-9]))


def test_residue_figure(df, tmp_path):
    dims = ga.plan_dims(ga.latest_per_key(df[(df["ratio"].sub(0.15).abs() < 1e-9) & (df["compressor"] == "asvd")]))
    fig = _saved(ga.plot_dim_residues(dims), tmp_path / "residues")
    labels = _check(fig)
    # GAC dims 112,48,128,48,96,64,120,40,144,56: 100% at 8, 70% at 16, 30% at 32; unaligned 10% at each
    assert "ASVD (GAC): aligned at 8/16/32 = 100/70/30%" in labels
    assert "ASVD: aligned at 8/16/32 = 10/10/10%" in labels
    assert [ax.get_xlabel() for ax in fig.axes] == ["d mod 8", "d mod 16", "d mod 32"]
    table = ga.alignment_table(dims)
    assert table.loc["ASVD (GAC)", "aligned 16 (%)"] == pytest.approx(70.0)
    assert table.loc["ASVD", "mean |d - d*|"] == pytest.approx(0.47)  # the fixture's d* minus its floor


def test_kernel_staircases(tmp_path):
    figs = ga.kernel_staircase(PROFILE)
    assert sorted(figs) == ["gemm", "sdpa"]
    for op, fig in figs.items():
        _saved(fig, tmp_path / op)
        _check(fig, {"d mod 8 = 0", "d mod 8 ≠ 0"}, title="NVIDIA A100-SXM4-80GB, float16")
    assert [ax.get_xlabel() for ax in figs["gemm"].axes] == ["K (gemm_K)", "N (gemm_N)"]
    with pytest.raises(ValueError, match="no 'flash' sweep rows"):
        ga.kernel_staircase(PROFILE, backend="flash")


def test_one_staircase_module():
    """gac.profiling.figures draws the staircases for both `gac profile figures` and `gac report`."""
    import inspect

    import gac.analysis.figures as af
    import gac.profiling.figures as pf

    assert "staircase_figures" in inspect.getsource(af.kernel_staircase)
    assert not hasattr(af, "_shade_templates") and hasattr(pf, "_shade_templates")
    src = inspect.getsource(af)
    assert "def _shade_templates" not in src and "def _mark_cliffs" not in src and "FA2_TEMPLATES)" not in src


def test_empty_inputs_are_errors_not_blank_figures(df):
    with pytest.raises(ValueError, match="empty ratio sweep"):
        ga.plot_ratio_sweep(ga.ratio_sweep(df).iloc[0:0])
    with pytest.raises(ValueError, match="no latency points"):
        ga.plot_latency_vs_seq_len(ga.latency_vs_seq_len(df, ratio=0.15).iloc[0:0])
    with pytest.raises(ValueError, match="no plan dims"):
        ga.plot_dim_residues(ga.plan_dims(df).iloc[0:0])


def test_ratio_sweep_figure_with_task_rows(df):
    """Task accuracies sit between perplexity and latency (PiQA before HellaSwag), each with its chance level
    dotted; perplexity is labelled by its dataset, never by a metric key."""
    sw = ga.ratio_sweep(df, metrics=("ppl", "hellaswag_acc_norm", "piqa_acc_norm", "prefill_ms"))
    assert {"piqa_acc_norm", "hellaswag_acc_norm"} <= set(sw["metric"])
    fig = ga.plot_ratio_sweep(sw)
    first_col = [ax for ax in fig.axes if ax.get_visible()][::2]  # (rows) x (ASVD, LLM-Pruner), row-major
    assert [ax.get_ylabel().split(" (")[0] for ax in first_col] == ["PPL", "PiQA", "HSwag", "Prefill"]
    assert first_col[0].get_ylabel().startswith("PPL (wikitext2)")
    assert all("higher is better" in ax.get_ylabel() for ax in first_col[1:3])
    chance = [[ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":"] for ax in first_col]
    assert chance == [[], [0.5], [0.25], []]
    assert ga.metric_label("ppl_enwiki") == "PPL (enwiki)" and ga.metric_label("piqa_acc_norm") == "PiQA (norm)"


def test_figure2_ticks_whole_numbers_and_a_readable_window_for_near_equal_dims():
    import pandas as pd

    from gac.analysis.figures import plot_proxy_comparison

    rows = [{"proxy": p, "layer": layer, "kind": "mlp", "dim": 550 + layer, "target": f"l{layer}"}
            for p in ("magnitude", "activation") for layer in range(2)]
    fig = plot_proxy_comparison(pd.DataFrame(rows))
    fig.canvas.draw()
    ax = fig.axes[0]
    assert all(float(t).is_integer() for t in ax.get_xticks()) and all(float(t).is_integer() for t in ax.get_yticks())
    lo, hi = ax.get_ylim()
    assert hi - lo >= 32  # +-2 units of 8 around 550-551, not 550.0-551.0 in 0.2 steps
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[0] == "mlp" and "d mod 8 = 0" in labels


def test_ratio_sweep_figure_names_a_lookalike_task_set(store_copy):
    """On gac's enwiki items (issue 30) the task panels say PiQA-format (enwiki, norm), never PiQA."""
    df = with_task_files(store_copy, "enwiki")
    fig = ga.plot_ratio_sweep(ga.ratio_sweep(df, metrics=("ppl", "hellaswag_acc_norm", "piqa_acc_norm")))
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_visible()][::2]
    assert labels[1:] == ["PiQA-format (enwiki, norm) (higher is better)",
                          "HSwag-format (enwiki, norm) (higher is better)"]
