"""``gac bench --predict GPU``: the predicted column beside what the device measured, in the bench record and Table 5."""

import pytest

from gac.analysis import load_results, table5
from gac.jobs.bench.store_bench import bench_store, describe
from tests.bench_store import FAST


def test_bench_predict_adds_a_labelled_column(tiny_store, store_copy):
    doc = bench_store(store_copy, experiment="benchtest", where=["compressor=llm_pruner"], points=[(1, 64)],
                      profile=False, predict="a100", **FAST)
    pr = doc["predicted"]
    assert pr["label"] == "predicted, A100, from published kernel data" and pr["gpu"] == "a100"
    point = pr["points"]["prefill_ms@64"]
    assert set(point["variants"]) == {v["label"] for v in doc["variants"]}
    assert all(v["ms"] > 0 for v in point["variants"].values())
    text = describe(doc)
    assert "predicted, A100, from published kernel data (a model of that GPU, not a measurement)" in text
    # the predicted points carry the bench's own point names, so the measured value sits beside each prediction
    assert set(pr["points"]) == {p["name"] for p in doc["points"]}
    df = load_results(store_copy)
    t = table5(df, model="tiny", ratio=0.15, compressors=["llm_pruner"], seq_len=64)
    col = "Prefill (ms), predicted, A100, from published kernel data"
    assert col in t.columns
    assert t.loc["Baseline", col] == pytest.approx(point["baseline_ms"])
