"""Latency-budget records in the analysis: Table 5 names each budget and whether it held, the Pareto frame and
figure of quality against measured latency, and `gac report` writing them."""

import math

import pytest

from gac.analysis import figures as F
from gac.analysis.load import records_to_frame
from gac.analysis.pareto import latency_pareto, pareto_table
from gac.analysis.tables import table5


def _rec(key, strategy, ratio, ppl, ms, compressor="asvd", block=None):
    align = {"strategy": strategy}
    if strategy == "gac_latency":
        align.update(latency_budget=1.0, latency_reference="gac", budget_kind="latency")
    rec = {"schema": 1, "key": key, "status": "completed", "created": f"2026-01-01T00:00:0{len(key) % 10}",
           "job": {"model": "tiny", "compressor": compressor, "proxy": None if compressor == "none" else "activation",
                   "strategy": "baseline" if compressor == "none" else strategy,
                   "ratio": None if compressor == "none" else ratio, "unit": 8, "gpu": "cpu", "seq_len": 64,
                   "experiment": "latency_budget", "sweep": None},
           "metrics": {"ppl_tiny": ppl, "prefill_ms": ms}, "aligned_fraction": 1.0, "params": 1000, "budget": 1000,
           "config": {"align": align}}
    if block is not None:
        rec["latency_budget"] = block
    return rec


def _frame():
    held = {"budget_kind": "latency", "source": "measured", "budget_ms": 10.0, "budget_share": 1.0,
            "reference": "gac", "table_ms": 9.9, "latency_held": True, "interval_ms": None}
    over = dict(held, budget_ms=8.0, table_ms=8.0, latency_held=True)
    return records_to_frame([
        _rec("b0", "baseline", None, 20.0, 12.0, compressor="none"),
        _rec("u1", "unaligned", 0.1, 30.0, 11.5), _rec("u3", "unaligned", 0.3, 45.0, 10.5),
        _rec("g1", "gac", 0.1, 29.0, 11.0), _rec("g3", "gac", 0.3, 44.0, 10.0),
        _rec("l1", "gac_latency", 0.1, 28.0, 10.8, block=dict(held, budget_ms=11.0)),
        _rec("l3", "gac_latency", 0.3, 41.0, 9.8, block=over),
    ])


def test_table5_names_each_latency_budget_and_whether_it_held():
    t = table5(_frame(), ratio=0.3, strategies=("unaligned", "gac", "gac_latency"))
    labels = list(t.index)
    assert labels[:3] == ["Baseline", "ASVD", "ASVD (GAC)"]
    assert labels[3].startswith("ASVD (GAC, latency) [latency <= 1 x gac (8 ms): held")
    # the default Table 5 is unchanged
    assert list(table5(_frame(), ratio=0.3).index) == ["Baseline", "ASVD", "ASVD (GAC)"]


def test_the_pareto_frame_holds_every_plan_with_its_budget_and_measured_latency():
    fr = latency_pareto(_frame())
    assert set(fr["strategy"]) == {"baseline", "unaligned", "gac", "gac_latency"} and len(fr) == 7
    lat = fr[fr["strategy"] == "gac_latency"]
    assert list(lat["budget_ms"]) == [8.0, 11.0] and all(b.endswith("held") for b in lat["budget"])
    assert fr.attrs["quality"] == "ppl_tiny" and "timed alone" in fr.attrs["source"]
    assert math.isnan(fr.loc[fr["strategy"] == "gac", "budget_ms"].iloc[0])
    t = pareto_table(fr)
    assert "measured (ms)" in t.columns and "budget (ms)" in t.columns


def test_the_pareto_figure_labels_its_axes_with_units(tmp_path):
    fr = latency_pareto(_frame())
    fig = F.plot_latency_pareto(fr, title="t")
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("prefill latency (ms), measured")
    assert "PPL" in ax.get_ylabel() and "lower is better" in ax.get_ylabel()
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"ASVD", "ASVD (GAC)", "ASVD (GAC, latency at GAC's)", "Baseline (uncompressed)",
            "latency budget (by the plan's table)"} <= labels
    assert F.save_figure(fig, tmp_path / "p", ["png"])[0].stat().st_size > 0


def test_gac_report_writes_the_pareto_figure_and_table(tmp_path):
    from gac.analysis.report_dir import write_report

    df = _frame()
    rep = write_report(df, tmp_path / "out", figure_formats=["png"])
    names = {p.name for p in rep.written}
    assert {"latency_budget_tiny_cpu.png", "latency_budget_tiny_cpu.md"} <= names, names  # named for its experiment
    assert any(n.startswith("latency_budget_table5_tiny_cpu_r0.3") for n in names)
    text = (tmp_path / "out" / "index.md").read_text()
    assert "GAC, latency" in text and "held" in text


@pytest.mark.parametrize("kind, words", [("min_latency", "min latency at >= the ratio's parameters: held")])
def test_min_latency_rows_say_their_parameter_bound(kind, words):
    from gac.analysis.labels import budget_note

    row = {"budget_kind": kind, "latency_held": None, "params": 1200, "budget": 1000}
    assert budget_note(row) == words
    assert budget_note({"budget_kind": math.nan}) == ""
