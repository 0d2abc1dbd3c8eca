"""Predicted latency tables: the predictor's kernel models at each candidate, and a plan that steers off the cliffs."""

import pytest

from gac.align import candidate_sets
from gac.align.latency_budget import align_latency, plan_latency
from gac.align.targets import Target
from gac.errors import GacError
from gac.predict import Predictor, gemm_ms, sdpa_ms
from gac.predict.latency_tables import predicted_latency_tables


@pytest.fixture(scope="module")
def h100():
    return Predictor("h100")


def test_tables_are_the_kernel_models_at_each_candidate(h100):
    q = Target("q", 100.0, 1.0, 8192, kind="lowrank", meta={"in_features": 4096, "out_features": 4096},
               dense_params=4096 * 4096, shape=(4096, 4096), candidates=(96, 100, 104))
    mlp = Target("mlp", 1000.0, 1.0, 3 * 4096, d_max=14336, kind="width", meta={"hidden_size": 4096},
                 candidates=(1000, 1008))
    head = Target("attn", 100.0, 1.0, 4096, d_max=128, kind="head_dim", meta={"num_heads": 32}, candidates=(100, 104))
    targets = [q, mlp, head]
    cands = candidate_sets(targets)
    tables = predicted_latency_tables(targets, cands, h100, batch=4, seq_len=1024)
    c, T = h100.cal, 4096
    assert tables["q"][104] == pytest.approx(gemm_ms(c, T, 104, 4096) + gemm_ms(c, T, 4096, 104))
    assert tables["q"][4096] == pytest.approx(gemm_ms(c, T, 4096, 4096))  # the dense option
    # gate and up, their product (two fp16 [T, d] read, one written: bandwidth-bound), down: what is measured
    assert tables["mlp"][1008] == pytest.approx(2 * gemm_ms(c, T, 1008, 4096) + gemm_ms(c, T, 4096, 1008)
                                                + 3 * 2 * T * 1008 / c.bw_stream)
    assert tables["attn"][104] == pytest.approx(sdpa_ms(c, 4, 32, 1024, 104, True))
    assert tables["q"][100] > tables["q"][104]  # the misaligned rank is slower than the larger aligned one


def test_a_latency_plan_avoids_the_misaligned_ranks(h100):
    # the d* sit between aligned ranks; at a budget of the unaligned ranks' latency the latency plan picks aligned ones
    targets = [Target(f"l{i}.q", 100.0 + i, 1.0 + i / 10, 8192, d_max=2048, kind="lowrank",
                      meta={"in_features": 4096, "out_features": 4096}, candidates=(96, 100, 101, 102, 103, 104, 112))
               for i in range(4)]
    cands = candidate_sets(targets)
    tables = predicted_latency_tables(targets, cands, h100, batch=4, seq_len=2048)
    unaligned = {t.name: 100 + i for i, t in enumerate(targets)}
    budget = plan_latency(targets, unaligned, tables)
    plan = align_latency(targets, tables, budget, 10**9)
    assert plan.stats["latency"]["held"] and all(d % 8 == 0 for d in plan.dims.values())
    assert plan.params >= sum(t.params(100 + i) for i, t in enumerate(targets))


def test_generic_targets_cannot_be_predicted(h100):
    with pytest.raises(GacError, match="no kernels are known"):
        predicted_latency_tables([Target("g", 10.0, 1.0, 8)], [[8]], h100)
