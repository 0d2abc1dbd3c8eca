"""Each strategy's semantics, and the budget guarantee."""

import math
import random

import pytest

from gac.align import BUDGET_FREE, STRATEGIES, align, candidate_sets
from gac.align.strategies import OWN_CANDIDATES
from gac.align.synthetic import lowrank_problem
from gac.align.targets import Target, budget_for_ratio
from gac.errors import GacError, InfeasibleBudgetError


@pytest.fixture(scope="module")
def llama8b():
    return lowrank_problem("llama3_8b", 0.15, seed=0)


def _random_targets(rng, n=12, unit=8):
    ts = []
    for i in range(n):
        d_max = rng.choice([256, 512, 1024])
        ts.append(Target(f"t{i}", rng.uniform(unit, d_max - 1), rng.uniform(0, 3), rng.choice([64, 96, 160]), d_max))
    budget = int(sum(t.params_per_dim * t.d_star for t in ts))
    return ts, budget


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_reports_consistent_accounting(llama8b, strategy):
    p = llama8b
    plan = align(p.targets, p.budget, strategy)
    assert set(plan.dims) == {t.name for t in p.targets}
    assert plan.params == sum(t.params(plan.dims[t.name]) for t in p.targets)
    assert plan.budget == p.budget
    assert plan.budget_met == (plan.params <= p.budget)
    if strategy not in BUDGET_FREE:
        assert plan.budget_met
    for t in p.targets:
        assert 1 <= plan.dims[t.name] <= t.d_max
    assert plan.aligned_by_unit[8] == plan.aligned_fraction


def test_gac_is_best_among_budget_respecting_strategies():
    rng = random.Random(0)
    for _ in range(30):
        ts, budget = _random_targets(rng)
        plans = {s: align(ts, budget, s) for s in STRATEGIES}
        gac = plans["gac"]
        assert gac.budget_met and gac.aligned_fraction == 1.0
        for s, p in plans.items():
            if p.budget_met and s != "unaligned" and s not in OWN_CANDIDATES:  # same candidate sets: gac is optimal
                assert gac.objective >= p.objective - 1e-6 * abs(p.objective) - 1e-6, s
            if s in OWN_CANDIDATES and p.budget_met:  # their own (wider) windows: gac on a window that holds theirs
                wide = align(ts, budget, "gac", window=5)
                assert wide.objective >= p.objective - 1e-6 * abs(p.objective) - 1e-6, s


def test_unaligned_rounds_within_one_and_fills_by_score(llama8b):
    p = llama8b
    plan = align(p.targets, p.budget, "unaligned")
    for t in p.targets:
        assert math.floor(t.d_star) <= plan.dims[t.name] <= math.ceil(t.d_star)
    # the leftover could not pay for another +1 on any target still below ceil(d*)
    left = p.budget - plan.params
    below = [t for t in p.targets if plan.dims[t.name] < math.ceil(t.d_star)]
    assert all(t.params_per_dim > left for t in below)
    # unconstrained dims from continuous d* are mostly misaligned
    assert plan.aligned_fraction < 0.5


def test_round_rules():
    t = Target("w", 107.3, 1.0, 10, 4096, candidates=(96, 104, 112, 128))
    assert align([t], 10**9, "round_nearest").dims["w"] == 104
    assert align([t], 10**9, "round_up").dims["w"] == 112
    assert align([t], 10**9, "round_down").dims["w"] == 104
    t2 = Target("w", 108.0, 1.0, 10, 4096, candidates=(96, 104, 112, 128))
    assert align([t2], 10**9, "round_nearest").dims["w"] == 112  # ties round up


def test_round_up_documents_overshoot():
    t = [Target("a", 107.3, 1.0, 10, 4096), Target("b", 99.1, 1.0, 10, 4096)]
    budget = int(10 * (107.3 + 99.1))
    plan = align(t, budget, "round_up")
    assert not plan.budget_met
    assert any("not enforced" in n for n in plan.notes)
    assert any("over budget" in n for n in plan.notes)


def test_rebalance_steps_down_least_important_first():
    ts = [Target("lo", 100.0, 0.1, 10, 4096), Target("hi", 100.0, 5.0, 10, 4096)]
    # nearest is 104 for both; budget only allows 104 + 96
    plan = align(ts, 10 * 200, "rebalance")
    assert plan.dims == {"lo": 96, "hi": 104}
    assert plan.budget_met


def test_gac_moves_parameters_to_important_targets():
    ts = [Target("lo", 100.0, 0.1, 10, 4096), Target("hi", 100.0, 5.0, 10, 4096)]
    plan = align(ts, 10 * 200, "gac", window=2)
    assert plan.dims == {"lo": 88, "hi": 112}
    assert plan.params == 2000


def test_infeasible_budget_names_the_minimum():
    ts = [Target("a", 100.0, 1.0, 10, 4096), Target("b", 100.0, 1.0, 10, 4096)]
    with pytest.raises(InfeasibleBudgetError) as e:
        align(ts, 10 * 100, "gac", window=2)
    assert e.value.min_budget == 10 * (88 + 88)  # candidates within 2 units of 100: 88..112
    assert "1,760" in str(e.value)
    with pytest.raises(InfeasibleBudgetError):
        align(ts, 10 * 100, "rebalance", window=2)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "100"])
def test_bad_budget(bad):
    with pytest.raises(GacError, match="budget must be a positive integer"):
        align([Target("a", 10.0, 1.0, 10)], bad)


def test_unknown_strategy_suggests():
    with pytest.raises(GacError, match="did you mean 'gac'"):
        align([Target("a", 10.0, 1.0, 10)], 1000, "gca")


def test_duplicate_names_and_empty():
    with pytest.raises(GacError, match="duplicate target name"):
        align([Target("a", 10.0, 1.0, 10), Target("a", 10.0, 1.0, 10)], 1000)
    with pytest.raises(GacError, match="no targets"):
        align([], 1000)


@pytest.mark.parametrize("unit", [8, 16, 32, 64])
def test_gac_full_alignment_at_each_unit(unit):
    p = lowrank_problem("llama3_8b", 0.15, seed=1)
    window = 64 // unit  # the same span (64 dims) around d* at every unit
    plan = align(p.targets, p.budget, "gac", unit=unit, window=window)
    assert plan.budget_met
    assert plan.aligned_by_unit[unit] == 1.0
    # at a coarser unit and equal span the candidate sets are subsets: the optimum can only get worse
    if unit > 8:
        assert plan.objective <= align(p.targets, p.budget, "gac", unit=8, window=8).objective + 1e-6


def test_candidate_filter_is_honoured():
    p = lowrank_problem("llama3_8b", 0.15, seed=2)

    def no_multiples_of_64(target, dims):
        return [d for d in dims if d % 64]

    plan = align(p.targets, p.budget, "gac", candidate_filter=no_multiples_of_64)
    assert all(d % 64 for d in plan.dims.values())
    cands = candidate_sets(p.targets, candidate_filter=no_multiples_of_64)
    assert all(plan.dims[t.name] in cs for t, cs in zip(p.targets, cands))


@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.3, -0.1, float("nan"), "0.2"])
def test_budget_for_ratio_rejects_bad_ratios(ratio):
    with pytest.raises(GacError, match=r"in \(0, 1\)"):
        budget_for_ratio(1000, ratio)


def test_budget_for_ratio():
    assert budget_for_ratio(1000, 0.15) == 850
