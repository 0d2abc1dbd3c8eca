"""The dense candidate: a low-rank target may stay unfactorised at its dense cost out * in (not linear in d)."""

import json
import math
import random

import pytest

from gac.align import STRATEGIES, align, candidate_set, candidate_sets, solve_mckp
from gac.align.allocation_io import allocation_to_json, parse_allocation
from gac.align.plan import Plan
from gac.align.reference import brute_force, milp_reference
from gac.align.synthetic import lowrank_problem
from gac.align.targets import Target
from gac.cli import main
from gac.errors import GacError


def T(name="w", d_star=100.0, out=256, inp=512, score=1.0, **kw):
    return Target(name, d_star, score, out + inp, kind="lowrank", dense_params=out * inp, shape=(out, inp), **kw)


def test_dense_target_accounting():
    t = T(d_star=100.0)
    assert t.dense_dim == 256 and t.has_dense
    assert t.d_max == (256 * 512 - 1) // 768 == 170  # the largest rank strictly cheaper than dense
    assert t.params(100) == 76800 and t.params(256) == 256 * 512  # not 768 * 256: the dense cost
    d = T(d_star=256.0)
    assert d.dense_star and d.params_star == 256 * 512
    # without an explicit shape the dense rank comes from out + in and out * in
    t2 = Target("w", 50.0, 1.0, 768, kind="lowrank", dense_params=256 * 512)
    assert t2.dense_dim == 256 and t2.d_max == 170


@pytest.mark.parametrize("kw,msg", [
    (dict(dense_params=1000), "not out x in"),
    (dict(d_max=256), "must be below the dense weight's rank"),
    (dict(d_star=200.0, d_max=170), "exceeds d_max"),
])
def test_dense_target_validation(kw, msg):
    base = dict(name="w", d_star=100.0, score=1.0, params_per_dim=768, kind="lowrank", dense_params=256 * 512,
                shape=(256, 512))
    base.update(kw)
    with pytest.raises(GacError, match=msg):
        Target(**base)


def test_dense_needs_a_low_rank_target_and_a_product_of_the_right_sum():
    with pytest.raises(GacError, match="only defined for low-rank targets"):
        Target("w", 10.0, 1.0, 30, kind="width", dense_params=3000)
    with pytest.raises(GacError, match="out \\+ in = params_per_dim"):
        Target("w", 10.0, 1.0, 768, kind="lowrank", dense_params=256 * 512 + 1)
    with pytest.raises(GacError, match="params_per_dim 700 is not out \\+ in"):
        Target("w", 10.0, 1.0, 700, kind="lowrank", dense_params=256 * 512, shape=(256, 512))


def test_candidate_sets_place_dense_one_unit_above_d_max():
    # factorised d* far from the top: the bracketing ranks only (window 1), dense joins only with a wide window
    assert candidate_set(T(d_star=100.0)) == (96, 104)
    assert 256 not in candidate_set(T(d_star=100.0), window=8)
    assert candidate_set(T(d_star=150.0), window=4)[-1] == 256  # d_max + 8 = 178 lies within 32 of 150
    # near the top: d_max = 170 is unaligned, so it is no candidate beside the dense option (the full-rank choice)
    assert candidate_set(T(d_star=166.0)) == (160, 168)
    assert candidate_set(T(d_star=166.0), window=2) == (152, 160, 168, 256)
    assert candidate_set(T(d_star=169.5)) == (168,)
    # an aligned d_max stays a candidate
    assert candidate_set(T(d_star=166.0, d_max=168)) == (160, 168)
    # a dense d* stays dense with window 1; wider windows add the top ranks
    assert candidate_set(T(d_star=256.0)) == (256,)
    assert candidate_set(T(d_star=256.0), window=3) == (160, 168, 256)
    # the hardware filter never sees the dense option, and may remove every rank when dense remains
    seen = []
    filt = lambda t, dims: seen.extend(dims) or []  # noqa: E731
    assert candidate_set(T(d_star=160.0), window=3, candidate_filter=filt) == (256,)
    assert 256 not in seen
    # explicit candidates get the dense option; a rank costing as much as dense is replaced by it
    assert candidate_set(T(d_star=100.0, candidates=(96, 104))) == (96, 104, 256)
    sq = Target("sq", 60.0, 1.0, 256, kind="lowrank", dense_params=128 * 128, d_max=64, shape=(128, 128))
    assert candidate_set(sq, window=1) == (56, 128)  # rank 64 costs 64 * 256 = 128 * 128: dense instead


def _plans(targets, budget, window=1):
    return {s: align(targets, budget, s, window=window) for s in STRATEGIES}


def test_strategies_with_dense_targets():
    ts = [T("a", 256.0, score=3.0), T("b", 100.3, score=1.0), T("c", 163.7, score=2.0)]
    budget = int(sum(t.params_star for t in ts))
    plans = _plans(ts, budget)
    for s, p in plans.items():
        assert p.dims["a"] == 256 and "a" in p.dense, s  # a dense d* stays dense under every rule (window 1)
        assert p.params == sum(t.params(p.dims[t.name]) for t in ts)
        assert p.aligned_by_unit[8] == p.aligned_fraction
    un = plans["unaligned"]
    assert un.dims["b"] in (100, 101) and un.dims["c"] in (163, 164)
    assert un.aligned_fraction == pytest.approx(1 / 3)  # only the dense one counts as aligned
    assert plans["gac"].aligned_fraction == 1.0 and plans["gac"].budget_met
    # round_up never rounds a factorised d* to dense
    assert plans["round_up"].dims["c"] == 168 and "c" not in plans["round_up"].dense
    # a wider window lets gac make c dense when that is the best use of the budget
    wide = align(ts + [T("d", 40.0, score=0.0)], budget + 256 * 512, "gac", window=3)
    assert "c" in wide.dense and wide.budget_met


def test_unaligned_never_reduces_dense_targets():
    ts = [T("a", 256.0, score=0.0), T("b", 100.0, score=5.0)]
    budget = 256 * 512 + 768 * 50  # b must drop to 50: a (least important, dense) is never touched
    p = align(ts, budget, "unaligned")
    assert p.dims == {"a": 256, "b": 50} and p.params == budget
    with pytest.raises(GacError, match="the dense ones dense"):
        align(ts, 256 * 512, "unaligned")


def test_plan_round_trips_its_dense_list():
    ts = [T("a", 256.0), T("b", 100.0)]
    p = align(ts, int(sum(t.params_star for t in ts)), "gac")
    q = Plan.from_json(json.loads(json.dumps(p.to_json())))
    assert q.dense == ["a"] == p.dense and q.dims == p.dims
    old = p.to_json()
    old.pop("dense")
    assert Plan.from_json(old).dense == []  # plans written before dense options read back


# -------------------------------------------------------------------------------------------- exactness


def _random_dense_problem(rng):
    n = rng.randint(1, 5)
    targets = []
    for i in range(n):
        out, inp = rng.choice([(16, 48), (24, 40), (32, 32), (40, 56), (12, 64)])
        cap = (out * inp - 1) // (out + inp)
        d_star = float(min(out, inp)) if rng.random() < 0.3 else rng.uniform(1, cap)
        cands = tuple(sorted(rng.sample(range(1, cap + 1), rng.randint(1, min(4, cap)))))
        targets.append(Target(f"t{i}", d_star, rng.choice([0.0, rng.random(), 10 * rng.random()]), out + inp,
                              d_max=cap, candidates=cands, kind="lowrank", dense_params=out * inp, shape=(out, inp)))
    cands = candidate_sets(targets)
    costs = [[t.params(d) for d in cs] for t, cs in zip(targets, cands)]
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(targets, cands)]
    lo, hi = sum(min(c) for c in costs), sum(max(c) for c in costs)
    return targets, cands, costs, values, rng.randint(lo, hi + 3)


def test_solver_equals_brute_force_with_dense_options():
    rng = random.Random(2026)
    n_dense_chosen = 0
    for _ in range(1500):
        targets, cands, costs, values, budget = _random_dense_problem(rng)
        bv, bc = brute_force(costs, values, budget)
        r = solve_mckp(costs, values, budget)
        assert r.cost <= budget
        assert r.value == pytest.approx(bv, rel=1e-12, abs=1e-9)
        if abs(r.value - bv) < 1e-12:
            assert r.cost <= bc
        # gac through align() is the same optimum, and its plan accounts the dense costs
        plan = align(targets, budget, "gac")
        assert plan.params == r.cost and plan.objective == pytest.approx(bv, rel=1e-12, abs=1e-9)
        n_dense_chosen += len(plan.dense)
    assert n_dense_chosen > 300  # the dense option is really exercised


@pytest.mark.parametrize("shape,seed", [("llama3_8b", 0), ("llama3_8b", 1), ("llama3_70b", 0)])
def test_solver_equals_milp_on_real_shapes_with_dense_options(shape, seed):
    p = lowrank_problem(shape, 0.15, seed=seed, windows=(4, 8), dense=True)
    assert sum(t.dense_star for t in p.targets) > 10  # some weights are kept dense by the allocation
    cands = candidate_sets(p.targets)
    costs = [[t.params(d) for d in cs] for t, cs in zip(p.targets, cands)]
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(p.targets, cands)]
    r = solve_mckp(costs, values, p.budget)
    mv, mc, _ = milp_reference(costs, values, p.budget)
    scale = math.fsum(abs(v) for vs in values for v in vs)
    assert r.cost <= p.budget and mc <= p.budget
    assert abs(mv - r.value) <= 1e-12 * scale
    plan = align(p.targets, p.budget, "gac")
    assert plan.budget_met and plan.aligned_fraction == 1.0 and len(plan.dense) > 0


# -------------------------------------------------------------------------------------------- gac align JSON


def _alloc(**kw):
    t = {"name": "q", "d_star": 100.0, "score": 1.0, "params_per_dim": 768, "kind": "lowrank",
         "dense_params": 256 * 512}
    t.update(kw)
    return {"budget": 10**6, "targets": [t, {"name": "k", "d_star": 256.0, "score": 1.0, "params_per_dim": 768,
                                             "kind": "lowrank", "dense_params": 256 * 512, "shape": [256, 512]}]}


def test_allocation_json_accepts_dense_and_round_trips(tmp_path, capsys):
    a = parse_allocation(_alloc())
    assert a.targets[1].dense_star and a.targets[0].d_max == 170
    again = parse_allocation(json.loads(json.dumps(allocation_to_json(a))))
    assert [t.dense_params for t in again.targets] == [256 * 512] * 2 and again.targets[1].shape == (256, 512)
    p = tmp_path / "alloc.json"
    p.write_text(json.dumps(_alloc()))
    assert main(["align", str(p)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dense"] == ["k"] and plan["dims"]["k"] == 256
    assert plan["params"] == 256 * 512 + 768 * plan["dims"]["q"] and plan["aligned_fraction"] == 1.0


@pytest.mark.parametrize("kw,msg", [
    (dict(dense_params=256 * 512 + 8), "is not out x in for any weight"),
    (dict(shape=[128, 640]), "dense_params 131072 is not out x in = 128 x 640 = 81920"),
    (dict(kind="generic"), "only defined for low-rank targets"),
    (dict(shape=[256]), "'shape' must be [out, in]"),
])
def test_allocation_json_rejects_a_wrong_dense_cost(tmp_path, capsys, kw, msg):
    p = tmp_path / "alloc.json"
    p.write_text(json.dumps(_alloc(**kw)))
    out = tmp_path / "plan.json"
    assert main(["align", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_all_strategies_hold_or_report_budget_with_dense_on_llama_shapes():
    p = lowrank_problem("llama3_8b", 0.3, seed=4, dense=True)
    for s, plan in _plans(p.targets, p.budget, window=8).items():
        assert plan.params == sum(t.params(plan.dims[t.name]) for t in p.targets)
        if s in ("unaligned", "rebalance", "gac"):
            assert plan.budget_met, s
        dense = {t.name for t in p.targets if t.dense_star}
        if s in ("unaligned", "round_nearest", "round_up", "round_down"):
            assert set(plan.dense) == dense, s  # rounding rules keep the allocation's dense set
        for t in p.targets:
            d = plan.dims[t.name]
            assert t.is_dense(d) or 1 <= d <= t.d_max


def test_exhaustive_tiny_case_gac_prefers_dense_when_it_pays():
    # one weight whose d* sits one unit below the top: with window 2 gac may keep it dense if the budget allows
    t = T("w", 165.0, score=1.0)
    cands = candidate_set(t, window=2)
    assert cands == (152, 160, 168, 256)
    for budget in (160 * 768, 168 * 768, 170 * 768, 256 * 512, 256 * 512 + 100):
        plan = align([t], budget, "gac", window=2)
        best = max((c for c in cands if t.params(c) <= budget), key=lambda c: t.params(c))
        assert plan.dims["w"] == best
