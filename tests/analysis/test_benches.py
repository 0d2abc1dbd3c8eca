"""Which side-by-side bench a table takes its latency from: the latest of the model's benches that measured every
row (newest ``created``, then the last ``path``); Table 5's one point and latency-by-length's every point read the
same rule."""

from gac.analysis.benches import latest_bench, pick_bench
from gac.metrics import prefill_point


def _bench(key, created, path="", model="tiny", keys=("a", "b"), seq_lens=(128,)):
    points = {prefill_point(1, s): {"batch": 1, "seq_len": s, "baseline_ms": 10.0,
                                    "variants": {k: {"ms": 9.0, "ratio": 0.9, "lo": 0.8, "hi": 1.0} for k in keys}}
              for s in seq_lens}
    return {"key": key, "created": created, "path": path, "model": model, "points": points}


def test_the_latest_bench_that_measured_every_row_wins():
    old, new = _bench("old", "2026-01-01"), _bench("new", "2026-01-02")
    summary, point = pick_bench([new, old], ["a", "b"], "tiny", 1, 128)
    assert summary["key"] == "new" and point is new["points"][prefill_point(1, 128)]
    # a later bench that left out a row, ran another model, or measured another length is not taken
    partial = _bench("partial", "2026-01-03", keys=("a",))
    other = _bench("other", "2026-01-04", model="smollm2")
    longer = _bench("longer", "2026-01-05", seq_lens=(256,))
    assert pick_bench([old, partial, other, longer], ["a", "b"], "tiny", 1, 128)[0]["key"] == "old"
    assert pick_bench([partial], ["a", "b"], "tiny", 1, 128) is None
    assert pick_bench([old], ["a"], "tiny", 4, 128) is None  # batch 4 was not measured


def test_a_tie_on_created_goes_to_the_last_path_and_a_bench_naming_no_model_counts_for_any():
    a, b = _bench("a", "2026-01-01", path="bench/a.json"), _bench("b", "2026-01-01", path="bench/b.json")
    assert latest_bench([b, a], "tiny", lambda s: True)["key"] == "b"
    anon = _bench("anon", "2026-01-09", model=None)
    assert latest_bench([a, anon], "tiny", lambda s: True)["key"] == "anon"
    assert latest_bench([], "tiny", lambda s: True) is None and latest_bench(None, "tiny", lambda s: True) is None
