"""The exact knapsack solver against brute force and a MILP."""

import math
import random

import numpy as np
import pytest

from gac.align import candidate_sets, solve_mckp
from gac.align.reference import brute_force, milp_reference
from gac.align.synthetic import lowrank_problem
from gac.errors import InfeasibleBudgetError


def _random_problem(rng: random.Random, linear: bool):
    n = rng.randint(1, 6)
    costs = [sorted(rng.sample(range(0, 60), rng.randint(1, 5))) for _ in range(n)]
    s = [rng.choice([0.0, rng.random(), rng.random() * 10]) for _ in range(n)]
    if linear:  # the paper's Eq. 4: value = s * (cost - cost*)
        star = [rng.uniform(min(c), max(c)) for c in costs]
        values = [[s[i] * (c - star[i]) for c in costs[i]] for i in range(n)]
    else:  # any values: the solver is a general MCKP solver
        values = [[rng.uniform(-5, 5) for _ in costs[i]] for i in range(n)]
    lo, hi = sum(min(c) for c in costs), sum(max(c) for c in costs)
    budget = rng.randint(lo, hi + 5)
    return costs, values, budget


@pytest.mark.parametrize("linear", [True, False])
def test_equals_brute_force_on_small_random_problems(linear):
    rng = random.Random(1234 + linear)
    for _ in range(1500):
        costs, values, budget = _random_problem(rng, linear)
        best_value, best_cost = brute_force(costs, values, budget)
        r = solve_mckp(costs, values, budget)
        assert r.cost <= budget
        assert r.value == pytest.approx(best_value, rel=1e-12, abs=1e-9)
        # the reported cost and value are those of the reported choice
        assert r.cost == sum(costs[i][j] for i, j in enumerate(r.choice))
        assert r.value == pytest.approx(math.fsum(values[i][j] for i, j in enumerate(r.choice)), abs=1e-9)
        # ties go to the cheaper plan
        if abs(r.value - best_value) < 1e-12:
            assert r.cost <= best_cost


def test_large_costs_with_common_factor_are_exact():
    # costs in the hundreds of millions, a gcd of 8192: budget quantization would overshoot or lose optimality
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(2, 5)
        ppd = [rng.choice([8192, 5120, 18432]) for _ in range(n)]
        costs = [[p * d for d in sorted(rng.sample(range(800, 1200, 8), 4))] for p in ppd]
        values = [[rng.random() * c for c in cs] for cs in costs]
        budget = rng.randint(sum(min(c) for c in costs), sum(max(c) for c in costs))
        bv, _ = brute_force(costs, values, budget)
        r = solve_mckp(costs, values, budget)
        assert r.cost <= budget
        assert r.value == pytest.approx(bv, rel=1e-12)


def test_infeasible_budget_reports_minimum():
    with pytest.raises(InfeasibleBudgetError) as e:
        solve_mckp([[10, 20], [5, 7]], [[0, 1], [0, 1]], 14)
    assert e.value.min_budget == 15
    assert "15" in str(e.value)


def test_deterministic():
    p = lowrank_problem("llama3_8b", 0.15, seed=3, windows=(4, 8))
    cands = candidate_sets(p.targets)
    costs = [[t.params(d) for d in cs] for t, cs in zip(p.targets, cands)]
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(p.targets, cands)]
    a = solve_mckp(costs, values, p.budget)
    b = solve_mckp(costs, values, p.budget)
    assert a.choice == b.choice


def _llama_case(shape, seed, windows=(4, 5, 6, 7, 8), equal=False):
    p = lowrank_problem(shape, 0.15, seed=seed, windows=windows, equal_scores=equal)
    cands = candidate_sets(p.targets)
    costs = [[t.params(d) for d in cs] for t, cs in zip(p.targets, cands)]
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(p.targets, cands)]
    return p, costs, values


@pytest.mark.parametrize("shape,seed", [("llama3_8b", 0), ("llama3_8b", 1), ("llama3_8b", 2), ("llama3_70b", 0), ("llama3_70b", 1)])
def test_equals_milp_on_llama_shaped_problems(shape, seed):
    p, costs, values = _llama_case(shape, seed)
    assert len(p.targets) == {"llama3_8b": 224, "llama3_70b": 560}[shape]
    mv, mc, _ = milp_reference(costs, values, p.budget)
    r = solve_mckp(costs, values, p.budget)
    assert mc <= p.budget and r.cost <= p.budget
    assert r.value == pytest.approx(mv, rel=1e-9)


def test_equals_milp_with_equal_scores_and_random_budgets():
    # equal scores make the problem a subset-sum: the reduction cannot fix anything, the DP does the work
    p, costs, values = _llama_case("llama3_8b", 5, equal=True)
    rng = np.random.default_rng(0)
    lo = sum(min(c) for c in costs)
    hi = sum(max(c) for c in costs)
    for budget in [int(x) for x in rng.integers(lo, hi, size=3)]:
        mv, mc, _ = milp_reference(costs, values, budget)
        r = solve_mckp(costs, values, budget)
        assert r.cost <= budget
        assert r.value == pytest.approx(mv, rel=1e-9, abs=1e-6)


def _tie_problem(n: int, extra: int):
    """n items with costs 1000/2000/2001 and values equal to their costs (equal scores): every penalty is zero, and
    a slack of 1000*q + r with r > q cannot be filled exactly, so the Lagrangian bound never certifies a plan."""
    costs = [[1000, 2000, 2001]] * n
    values = [[float(c) for c in cs] for cs in costs]
    return costs, values, 1000 * n + extra


def test_ties_beyond_the_dp_memory_limit_are_refused_not_approximated(monkeypatch):
    from gac.errors import GacError

    costs, values, budget = _tie_problem(300, 10_500)
    r = solve_mckp(costs, values, budget)  # the default limit holds this DP: the exact optimum
    assert r.cost - 1000 * 300 == 10_010  # a + b = 10 upgrades, b <= 10 of them the 1001 step: 10,010 at most
    monkeypatch.setenv("GAC_SOLVER_MAX_MB", "0.01")
    with pytest.raises(GacError, match="the exact solver would need .* above its limit of"):
        solve_mckp(costs, values, budget)
    monkeypatch.setenv("GAC_SOLVER_MAX_MB", "-3")
    with pytest.raises(GacError, match="must be a positive number of MiB"):
        solve_mckp(costs, values, budget)


@pytest.mark.parametrize("linear", [True, False])
def test_under_a_tiny_memory_limit_the_solver_is_exact_or_refuses(linear, monkeypatch):
    # the escalating core and the bounded DP never trade exactness for memory: each answer is brute force's
    from gac.errors import GacError

    monkeypatch.setenv("GAC_SOLVER_MAX_MB", "0.0005")  # 524 bytes: only tiny DPs fit
    rng = random.Random(99 + linear)
    answered = refused = 0
    for _ in range(400):
        costs, values, budget = _random_problem(rng, linear)
        best_value, _ = brute_force(costs, values, budget)
        try:
            r = solve_mckp(costs, values, budget)
        except GacError:
            refused += 1
            continue
        answered += 1
        assert r.cost <= budget and r.value == pytest.approx(best_value, rel=1e-12, abs=1e-9)
    assert answered > 100 and refused > 0


def test_ten_thousand_equal_score_targets_solve_exactly_in_bounded_memory():
    # issue 23: 10,000 targets, window 8, equal scores used to ask numpy for a 1.46 TiB DP table; the balanced core
    # now finds a plan that meets the Lagrangian upper bound, which proves it optimal
    from gac.align import align
    from gac.align.targets import Target

    p = lowrank_problem("moe_2000", 0.15, equal_scores=True)
    targets = [Target(f"{k}.{t.name}", t.d_star, t.score, t.params_per_dim, t.d_max, kind=t.kind)
               for k in range(5) for t in p.targets]
    plan = align(targets, 5 * p.budget, "gac", window=8)
    s = plan.stats["solver"]
    assert len(targets) == 10_000 and plan.budget_met
    assert s["ub"] - s["lb"] <= 1e-9 * max(1.0, abs(s["ub"])) and s["dp_width"] == 0
