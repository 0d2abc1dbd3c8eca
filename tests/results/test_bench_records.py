"""A stored bench record is read through the same kind of checks as a job record (ResultsStore.read_bench, which
`gac bench` uses for "already measured" and `gac report` through iter_bench): a planted or edited one is refused in
one line naming the file and the fix, never shown."""

import copy
import json

import pytest

from gac.results import ResultsStore
from gac.results.store import CorruptRecord
from gac.results.validate import bench_problem

KEY = "0123456789abcdef"
PT = "prefill_ms@64"


def _entry(ms: float, ratio: float) -> dict:
    return {"batch": 1, "seq_len": 64, "median_ms": ms, "samples_ms": [ms], "ratio_to_baseline": ratio,
            "ratio_ci95": [ratio * 0.9, ratio * 1.1], "flops_ratio": 0.8, "alignment_efficiency": 0.8 / ratio,
            "ratio_to_unaligned": None, "ratio_to_unaligned_ci95": None, "top_kernels": None, "sdpa_backend": None}


def _doc() -> dict:
    """A bench record of the shape gac.jobs.bench.store_bench writes (two variants, one point)."""
    variants = []
    for label, ms, ratio in (("Baseline", 10.0, 1.0), ("ASVD", 8.0, 0.8)):
        e = _entry(ms, ratio)
        variants.append({"label": label, "record_key": "a" * 16, "baseline": label == "Baseline", "sibling": None,
                         "median_ms": ms, "ratio_to_baseline": ratio, "ratio_ci95": e["ratio_ci95"],
                         "ratio_to_unaligned": None, "ratio_to_unaligned_ci95": None, "flops_ratio": 0.8,
                         "alignment_efficiency": e["alignment_efficiency"], "points": {PT: e}, "decode": None})
    return {"schema": 1, "kind": "bench", "key": KEY, "points": [{"batch": 1, "seq_len": 64, "name": PT}],
            "variants": variants, "device": {"type": "cpu", "name": "a CPU"}, "dtype": "float32",
            "protocol": {"rounds": 3, "warmup": 0, "iters": 2, "seed": 0, "timer": "wall", "memory_mode": "resident"},
            "bootstrap": {"resamples": 2000}, "created": "2026-01-01T00:00:00Z"}


def _store(tmp_path, text: str, name: str = f"{KEY}.json") -> ResultsStore:
    (tmp_path / "bench").mkdir(exist_ok=True)
    (tmp_path / "bench" / name).write_text(text)
    return ResultsStore(tmp_path)


def test_a_bench_record_as_written_is_read(tmp_path):
    doc = _doc()
    assert bench_problem(doc, KEY) is None
    store = _store(tmp_path, json.dumps(doc))
    got = store.read_bench(KEY)
    assert got["variants"][1]["median_ms"] == 8.0 and got["_path"] == str(store.bench_path(KEY))
    assert [d["key"] for d in store.iter_bench()] == [KEY]


def _edit(edit) -> dict:
    doc = copy.deepcopy(_doc())
    edit(doc)
    return doc


@pytest.mark.parametrize("edit,says", [
    (lambda d: d["variants"][1]["points"][PT].update(median_ms=-3.0),
     f"has a median latency -3.0 at {PT!r}, not a number of ms > 0"),
    (lambda d: d["variants"][1].update(median_ms=-3.0), "has a median latency -3.0 of variant 'ASVD'"),
    (lambda d: d["variants"][1]["points"][PT].update(median_ms=0), "has a median latency 0 at"),
    (lambda d: d["variants"][1]["points"][PT].update(ratio_to_baseline=-0.2), "has ratio_to_baseline -0.2 at"),
    (lambda d: d["variants"][1].update(alignment_efficiency=0), "has alignment_efficiency 0 of variant 'ASVD'"),
    (lambda d: d["variants"][1]["points"][PT].update(ratio_to_unaligned_ci95=[1]), "has ratio_to_unaligned_ci95 [1]"),
    (lambda d: d["variants"][1].update(decode={"ms_per_token": -1}), "has a decode entry of variant 'ASVD'"),
    (lambda d: d["variants"][1].update(points={}), "has variant 'ASVD' without the point(s) ['prefill_ms@64']"),
    (lambda d: d["variants"][1].pop("label"), "has a variant without a label"),
    (lambda d: d.pop("device"), "has no 'device' object"),
    (lambda d: d.update(protocol=None), "has no 'protocol', 'bootstrap' or 'dtype'"),
    (lambda d: d.update(key="fedcba9876543210"), "its file name says '0123456789abcdef' (a bench record copied"),
])
def test_an_edited_bench_record_is_refused_in_one_line(tmp_path, edit, says):
    store = _store(tmp_path, json.dumps(_edit(edit)))
    with pytest.raises(CorruptRecord, match="re-run `gac bench`") as e:
        store.read_bench(KEY)
    msg = str(e.value)
    assert says in msg and "\n" not in msg and f"mv {store.bench_path(KEY)}" in msg
    with pytest.raises(CorruptRecord):
        list(store.iter_bench())


@pytest.mark.parametrize("literal,says", [("1e400", "has a median latency inf at"),
                                          ("NaN", "is not valid JSON: NaN is not valid JSON"),
                                          ("Infinity", "is not valid JSON: Infinity is not valid JSON")])
def test_non_finite_medians_are_refused(tmp_path, literal, says):
    text = json.dumps(_doc()).replace('"median_ms": 8.0', f'"median_ms": {literal}')
    assert literal in text
    with pytest.raises(CorruptRecord, match=says):
        _store(tmp_path, text).read_bench(KEY)


def test_links_out_of_the_store_and_dangling_links_are_refused(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(_doc()))
    (tmp_path / "s" / "bench").mkdir(parents=True)
    store = ResultsStore(tmp_path / "s")
    store.bench_path(KEY).symlink_to(outside)
    with pytest.raises(CorruptRecord, match="outside the store"):
        store.read_bench(KEY)
    store.bench_path(KEY).unlink()
    store.bench_path(KEY).symlink_to(tmp_path / "nothing")
    with pytest.raises(CorruptRecord, match="dangling symbolic link"):
        store.read_bench(KEY)


def test_bench_paths_and_the_bench_lock(tmp_path):
    doc = _doc()
    store = _store(tmp_path, json.dumps(doc))
    (tmp_path / "bench" / f"{KEY}.rerun-20260101T000000.000000Z.json").write_text(json.dumps(doc))
    (tmp_path / "bench" / f"{KEY[:-1]}0.json").write_text(json.dumps(doc))
    assert [p.name for p in store.bench_paths(KEY)] == [f"{KEY}.json", f"{KEY}.rerun-20260101T000000.000000Z.json"]
    lock = store.bench_lock(KEY)
    assert lock.path == tmp_path / "locks" / f"bench-{KEY}.lock"
    assert lock.try_acquire()
    try:
        assert not store.bench_lock(KEY).try_acquire()  # one writer per bench
    finally:
        lock.release()
