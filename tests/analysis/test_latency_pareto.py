"""Latency-budget records in the analysis: Table 5 names each budget and whether it held, the Pareto frame and
figure of quality against measured latency, and `gac report` writing them."""

import math
import re

import pytest

from gac.analysis import figures as F
from gac.analysis.load import records_to_frame
from gac.analysis.method_table import table5
from gac.analysis.pareto import latency_pareto, pareto_table


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
            "latency budget (share x its reference plan, measured)"} <= labels
    # the budget tick sits at its share of the reference plan's measured latency, not at the table's ms
    assert list(fr.loc[fr["strategy"] == "gac_latency", "budget_measured_ms"]) == [10.0, 11.0]
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


def _bench(frame, factor):
    """A side-by-side bench summary of every record of ``frame`` at (1, 64): 15 rounds, each record's its own
    prefill_ms times ``factor[key]`` times 1% noise of its own."""
    import numpy as np

    rng = np.random.default_rng(0)
    variants = {}
    for _, rec in frame.iterrows():
        if rec["strategy"] == "baseline":
            continue
        samples = list(rec["prefill_ms"] * factor.get(rec["key"], 1.0) * (1 + 0.01 * rng.standard_normal(15)))
        ms = float(np.median(samples))
        variants[rec["key"]] = {"ms": ms, "ratio": ms / 12.0, "lo": ms / 12.0 * 0.98, "hi": ms / 12.0 * 1.02,
                                "compressor": rec["compressor"], "strategy": rec["strategy"],
                                "ratio_param": rec["ratio"], "label": rec["key"], "samples": samples}
    return [{"key": "bench1", "created": "2026-01-02", "model": "tiny", "device": "cpu", "device_type": "cpu",
             "rounds": 15, "points": {"prefill_ms@64": {"batch": 1, "seq_len": 64, "baseline_ms": 12.0,
                                                        "variants": variants}}}]


def test_the_bench_checks_each_latency_budget_against_the_plans_measured_reference():
    df = _frame()
    # l3 (budget: 1 x gac) measured at 0.9 x the gac plan of its ratio; l1 at 1.2 x its gac plan
    bench = _bench(df, {"l3": 0.9 * 10.0 / 9.8, "l1": 1.2 * 11.0 / 10.8})
    fr = latency_pareto(df, bench=bench).set_index("key")
    assert re.fullmatch(r"0\.(89|90|91)\d \[0\.\d+, 0\.9\d+\] x gac, budget 1 x: confirmed", fr.loc["l3", "bench_check"])
    assert re.fullmatch(r"1\.(19|20|21)\d \[1\.\d+, 1\.\d+\] x gac, budget 1 x: over", fr.loc["l1", "bench_check"])
    assert fr.loc["g3", "bench_check"] == "" and fr.loc["b0", "bench_check"] == ""  # plans by parameters: no check
    t = pareto_table(latency_pareto(df, bench=bench))
    assert "measured against the budget (bench)" in t.columns
    # the reference plan missing from the bench: said, not guessed
    gone = [dict(bench[0], points={"prefill_ms@64": dict(bench[0]["points"]["prefill_ms@64"], variants={
        k: v for k, v in bench[0]["points"]["prefill_ms@64"]["variants"].items() if k != "g3"})})]
    df2 = df[df["key"] != "g3"]
    assert latency_pareto(df2, bench=gone).set_index("key").loc["l3", "bench_check"] == \
        "not checked: the gac plan at ratio 0.3 was not in the bench"
