"""Latency tables measured on this device (CPU here), read back from the profile, and a plan that holds its budget."""

import pytest

import gac.profiling.latency_tables as lt
from gac.align import candidate_sets
from gac.align.latency_budget import align_latency, plan_latency
from gac.align.targets import Target
from gac.errors import GacError
from gac.profiling.timing import TimingProtocol

QUICK = TimingProtocol(warmup=1, iters=3, trials=3, flush_bytes=2**20, max_buffers=2)


def _targets():
    low = Target("q", 20.0, 1.0, 64 + 48, kind="lowrank", meta={"in_features": 64, "out_features": 48},
                 dense_params=64 * 48, shape=(48, 64))
    low2 = Target("k", 14.0, 2.0, 64 + 48, kind="lowrank", meta={"in_features": 64, "out_features": 48})
    width = Target("mlp", 40.0, 0.5, 3 * 32, d_max=64, kind="width", meta={"hidden_size": 32})
    head = Target("attn", 20.0, 0.7, 64, d_max=32, kind="head_dim", meta={"num_heads": 2})
    return [low, low2, width, head]


def test_measured_tables_cover_every_candidate_and_are_reused(monkeypatch):
    targets = _targets()
    cands = candidate_sets(targets, 8, 3)
    assert targets[0].dense_dim in cands[0]  # the dense option is a candidate of q: it is measured too
    tables, prof = lt.measure_latency_tables(targets, cands, "cpu", "float32", seq_len=16, batch=1, protocol=QUICK)
    for t, cs in zip(targets, cands):
        assert sorted(tables[t.name]) == sorted(cs) and all(ms > 0 for ms in tables[t.name].values())
    assert tables["q"][8] == tables["k"][8]  # one kernel context, one measurement per dim
    assert lt.dense_context(targets[0]) in prof.contexts()

    def refuse(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(lt, "measure_for_targets", refuse)
    monkeypatch.setattr(lt, "measure_dense", refuse)
    again, _ = lt.measure_latency_tables(targets, cands, "cpu", "float32", seq_len=16, protocol=QUICK, profile=prof)
    assert again == tables
    with pytest.raises(GacError, match="lacks latencies at 32 tokens"):
        lt.profile_latency_tables(prof, targets, cands, batch=2, seq_len=16)

    fastest = sum(min(r.values()) for r in tables.values())
    slowest = sum(max(r.values()) for r in tables.values())
    budget = (fastest + slowest) / 2
    plan = align_latency(targets, tables, budget, 10**6, unit=8, window=3)
    assert plan.stats["latency"]["held"] and plan_latency(targets, plan.dims, tables) <= budget


def test_generic_targets_have_no_kernels_to_measure():
    t = Target("g", 10.0, 1.0, 8)
    with pytest.raises(GacError, match="no kernels are known"):
        lt.profile_latency_tables(lt.HardwareProfile(lt.empty_table(), {"device_name": "cpu"}), [t], [[8, 16]])
