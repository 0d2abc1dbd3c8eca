"""ASVD's sensitivity search on a GPU cluster: the finished rows are saved as they complete and a requeued search
resumes from them (giving the uninterrupted table), and a failed layer-cache check re-estimates the slower
full-forward search against the time limit. The path the probes took is in the prepared state's notes."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from gac import faults
from gac.compression import sensitivity as S
from gac.compression.discovery import discover
from gac.compression.preparation import prepare
from gac.errors import GacError
from tests.compression.conftest import small_model

GRID = (0.5, 0.9)


@pytest.fixture(autouse=True)
def _fixed_threads(monkeypatch):
    # bit-identical tables need the same kernels: the adaptive thread choice may change a GEMM's reduction order
    # (one thread: these small probes are fastest so on a shared machine)
    monkeypatch.setattr(S, "ADAPTIVE_THREADS", False)
    monkeypatch.setattr(faults, "_passes", {})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ids(n=3, seq=16, vocab=512, seed=0):
    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))


def _interrupted(monkeypatch, run, after: int):
    """``run()`` with the search killed (an injected error) once ``after`` rows are saved."""
    monkeypatch.setenv(faults.ENV, f"sensitivity_row:raise@{after}")
    with pytest.raises(faults.InjectedFault):
        run()
    monkeypatch.delenv(faults.ENV)


def _search(model, ids, layers=None, grid=GRID):
    opts = {"sensitivity_grid": grid} | ({"layers": layers} if layers else {})
    p = prepare(model, None, "asvd", calib_ids=ids, allocation="proportional", compressor_options=opts)
    layout = discover(model)

    def table(**kw):
        return S.sensitivity_table(model, p.compressor, p.units, p.factors, ids, grid, layout=layout, **kw)

    return p, table


def test_an_interrupted_search_on_tiny_resumes_to_the_uninterrupted_table(base, monkeypatch, tmp_path):
    model, _, calib, _, _ = base
    p, table = _search(model, calib, layers="3:4", grid=(0.6, 1.0))  # the last layer's 7 weights, 7 probes
    ref = table()
    rows = tmp_path / "rows.json"
    _interrupted(monkeypatch, lambda: table(resume=rows), after=4)
    saved = json.loads(rows.read_text())
    assert len(saved["rows"]) == 4 and saved["units"] == [u.name for u in p.units]
    seen = []
    real = S.reference_rank

    def counting(*a):
        seen.append(a)
        return real(*a)

    monkeypatch.setattr(S, "reference_rank", counting)
    resumed = table(resume=rows)
    assert resumed["probe"]["resumed_rows"] == 4
    assert resumed["table"] == ref["table"] and resumed["base_ppl"] == ref["base_ppl"]  # bit for bit
    assert len(seen) == len(p.units) - 4  # only the rows left were probed (ratio 1 is the dense base)
    assert len(json.loads(rows.read_text())["rows"]) == len(p.units)


def test_prepare_resumes_and_notes_it(monkeypatch, tmp_path):
    model = small_model(num_hidden_layers=2)
    ids = _ids()
    opts = {"sensitivity_grid": GRID}
    ref = prepare(model, None, "asvd", calib_ids=ids, compressor_options=opts)
    rows = tmp_path / "rows.json"
    _interrupted(monkeypatch, lambda: prepare(model, None, "asvd", calib_ids=ids, compressor_options=opts,
                                              sensitivity_resume=rows), after=3)
    p = prepare(model, None, "asvd", calib_ids=ids, compressor_options=opts, sensitivity_resume=rows)
    assert p.sensitivity["table"] == ref.sensitivity["table"]
    assert any(n == f"sensitivity: resumed with 3 of {len(p.units)} rows saved by an interrupted search"
               for n in p.notes)
    # the path the probes took is noted either way
    assert any(n.startswith("sensitivity: the probes ran from the layer cache") for n in ref.notes)
    assert not any("resumed" in n for n in ref.notes)


def test_saved_rows_of_another_search_are_ignored(monkeypatch, tmp_path, caplog):
    model = small_model(num_hidden_layers=1)
    ids = _ids()
    p, table = _search(model, ids)
    ref = table()
    rows = tmp_path / "rows.json"
    _interrupted(monkeypatch, lambda: table(resume=rows), after=2)
    good = json.loads(rows.read_text())

    def resumed_with(doc):
        rows.write_text(json.dumps(doc))
        with caplog.at_level(logging.WARNING, logger="gac.compression.sensitivity"):
            return table(resume=rows)

    for bad in ({**good, "grid": [0.4, 0.9]}, {**good, "base_ppl": good["base_ppl"] * 1.01}):
        got = resumed_with(bad)
        assert got["probe"]["resumed_rows"] == 0 and got["table"] == ref["table"]
    msgs = [r.getMessage() for r in caplog.records]
    assert any("made for other weights, grid or probe tokens" in m for m in msgs)
    assert any("its dense perplexity" in m for m in msgs)
    # a saved row with a bad value is dropped (and probed again), the others kept
    name = next(iter(good["rows"]))
    got = resumed_with({**good, "rows": {**good["rows"], name: [-1.0] * len(GRID)}})
    assert got["table"] == ref["table"] and got["probe"]["resumed_rows"] == len(good["rows"]) - 1
    rows.write_text("{not json")
    assert table(resume=rows)["probe"]["resumed_rows"] == 0


def test_a_search_that_cannot_save_goes_on(monkeypatch, tmp_path, caplog):
    model = small_model(num_hidden_layers=1)
    ids = _ids()
    _, table = _search(model, ids)
    ref = table()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="gac.compression.sensitivity"):
        got = table(resume=blocked / "rows.json")  # its directory is a file
    assert got["table"] == ref["table"]
    assert sum("cannot save the finished rows" in r.getMessage() for r in caplog.records) == 1


def _fail_check(monkeypatch, full_s):
    real = S._check_cache

    def failing(*a, **k):
        out = real(*a, **k)
        out.update(ok=False, rel_diff=10 * out["tolerance"], full_s=full_s)
        return out

    monkeypatch.setattr(S, "_check_cache", failing)


def test_a_failed_cache_check_re_estimates_the_cost_against_the_limit(monkeypatch):
    model = small_model(num_hidden_layers=2)
    ids = _ids()
    opts = {"sensitivity_grid": GRID}
    # the check's two full forwards "took" 100 s: the full-forward search of 3 samples is far above an hour
    _fail_check(monkeypatch, 100.0)
    with pytest.raises(GacError, match=r"layer-cache check failed, so every probe would run a full forward: "
                                       r"sensitivity search: \d+ probes .* above the limit of 60 min"):
        prepare(model, None, "asvd", calib_ids=ids, compressor_options=opts, sensitivity_limit_s=3600)
    # without a limit it runs, and the estimate is recorded with the path
    p = prepare(model, None, "asvd", calib_ids=ids, compressor_options=opts, sensitivity_limit_s=None)
    probe = p.sensitivity["probe"]
    n_probes = S.count_probes(p.units, GRID)
    assert probe["path"] == "full_forward"
    assert probe["fallback_estimate_s"] == pytest.approx((n_probes + 1) * 100.0 / 2 * 3)
    assert any(n.startswith("sensitivity: every probe ran a full forward") for n in p.notes)


def test_the_fallback_estimate_counts_only_the_rows_left(monkeypatch, tmp_path):
    model = small_model(num_hidden_layers=1)
    ids = _ids()
    _, table = _search(model, ids)
    rows = tmp_path / "rows.json"
    _interrupted(monkeypatch, lambda: table(resume=rows), after=4)
    _fail_check(monkeypatch, 1.0)
    got = table(resume=rows, limit_s=None)
    assert got["probe"]["resumed_rows"] == 4
    left = 7 - 4  # one layer's seven projections
    assert got["probe"]["fallback_estimate_s"] == pytest.approx((left * len(GRID) + 1) * 1.0 / 2 * 3)


def test_fallback_estimate_arithmetic():
    est = S.fallback_estimate({"seconds": 10.0, "calibration_samples": 32}, {"full_s": 4.0, "check_samples": 2},
                              probes=100, samples=8, seq_len=2048)
    assert est["seconds"] == pytest.approx(101 * 16.0) and est["forward_s"] == 16.0 and est["model_share"] == 1.0
    assert est["calibration_samples"] == 32 and est["before_check_s"] == 10.0 and est["tokens_per_probe"] == 8 * 2048
    line = S.check_cost(est, [object()] * 50, (0.5, 0.9), None)
    assert "100 probes" in line and "100% of the layers" in line


def test_a_fault_pass_count(monkeypatch):
    monkeypatch.setenv(faults.ENV, "somewhere:raise@3")
    faults.fault_point("somewhere")
    faults.fault_point("somewhere")
    with pytest.raises(faults.InjectedFault):
        faults.fault_point("somewhere")
    faults.fault_point("somewhere")  # only the third pass
    monkeypatch.setenv(faults.ENV, "elsewhere:raise@x")
    with pytest.raises(ValueError, match="whole number"):
        faults.fault_point("elsewhere")
