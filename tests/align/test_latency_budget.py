"""The latency-budget solver and its dual against brute force and a MILP, and the plans built on them."""

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from gac.align import candidate_sets
from gac.align.latency_budget import (
    align_latency,
    align_min_latency,
    check_latency_table,
    default_quantum,
    plan_latency,
    solve_latency_budget,
    solve_min_latency,
)
from gac.align.reference import brute_force, milp_reference
from gac.align.synthetic import lowrank_problem
from gac.align.targets import Target
from gac.errors import GacError


def _plans(n_opts):
    return itertools.product(*[range(k) for k in n_opts])


def _best_within(latency, values, budget):
    """Brute force over true (unrounded) latencies: the best value with exact sum <= budget, or None."""
    best = None
    for combo in _plans([len(x) for x in latency]):
        if sum(Fraction(latency[i][j]) for i, j in enumerate(combo)) > Fraction(budget):
            continue
        v = math.fsum(values[i][j] for i, j in enumerate(combo))
        best = v if best is None else max(best, v)
    return best


def _random_latency_problem(rng: random.Random, grid: bool):
    n = rng.randint(1, 6)
    latency, values = [], []
    for _ in range(n):
        k = rng.randint(1, 5)
        if grid:  # multiples of 1/8: exact in binary, so a quantum of 1/8 rounds nothing
            lat = [rng.randint(0, 40) / 8 for _ in range(k)]
        else:
            lat = [rng.uniform(0.0, 5.0) for _ in range(k)]
        latency.append(lat)
        values.append([rng.uniform(-5, 5) for _ in range(k)])
    lo = sum(min(x) for x in latency)
    hi = sum(max(x) for x in latency)
    return latency, values, rng.uniform(lo, hi + 1.0)


def test_on_an_exact_grid_the_latency_solver_equals_brute_force():
    rng = random.Random(11)
    for _ in range(500):
        latency, values, budget = _random_latency_problem(rng, grid=True)
        r = solve_latency_budget(latency, values, budget, quantum_ms=0.125)
        best = _best_within(latency, values, budget)
        assert r.held and r.latency_ms <= budget
        assert r.value == pytest.approx(best, rel=1e-12, abs=1e-9)
        assert r.rounded_ms == pytest.approx(r.latency_ms)  # nothing rounded on the grid
        assert r.latency_ms == math.fsum(latency[i][j] for i, j in enumerate(r.choice))
        assert r.value == pytest.approx(math.fsum(values[i][j] for i, j in enumerate(r.choice)), abs=1e-9)


@pytest.mark.parametrize("quantum", [None, 0.01, 0.3])
def test_real_latencies_hold_the_budget_and_lose_at_most_n_quanta(quantum):
    # the plan's true latency holds the budget; its value is at least the best at budget - n*q, at most the best at
    # the budget, and exactly brute force's on the rounded problem
    rng = random.Random(int(1000 * (quantum or 0)) + 5)
    answered = 0
    for _ in range(150):
        latency, values, budget = _random_latency_problem(rng, grid=False)
        try:
            r = solve_latency_budget(latency, values, budget, quantum_ms=quantum)
        except GacError as e:  # a coarse quantum can leave no plan that fits once rounded; only then
            assert "too coarse" in str(e)
            q = Fraction(repr(quantum or default_quantum(budget, len(latency))))
            units = Fraction(budget) // q
            assert sum(-((-Fraction(min(x))) // q) for x in latency) > units
            continue
        answered += 1
        n = len(latency)
        assert r.held and r.latency_ms <= budget
        assert Fraction(r.latency_ms) <= Fraction(budget)
        assert r.optimal_within_ms == pytest.approx(n * r.quantum_ms)
        upper = _best_within(latency, values, budget)
        lower = _best_within(latency, values, budget - r.optimal_within_ms)
        assert r.value <= upper + 1e-9
        if lower is not None:
            assert r.value >= lower - 1e-9
        q = Fraction(repr(r.quantum_ms))
        costs = [[int(-((-Fraction(x)) // q)) for x in ls] for ls in latency]
        bv, _ = brute_force(costs, values, int(Fraction(budget) // q))
        assert r.value == pytest.approx(bv, rel=1e-12, abs=1e-9)
    assert answered > 70


def test_fixed_latency_is_part_of_the_budget():
    latency, values = [[1.0, 2.0], [1.0, 3.0]], [[0.0, 1.0], [0.0, 2.0]]
    assert solve_latency_budget(latency, values, 4.0).choice == [0, 1]
    r = solve_latency_budget(latency, values, 4.0, fixed_ms=1.0)
    assert r.choice == [1, 0] and r.latency_ms == 4.0 and r.held
    with pytest.raises(GacError, match=r"infeasible latency budget: 2.5 ms is below the fastest plan .* \(3 ms"):
        solve_latency_budget(latency, values, 2.5, fixed_ms=1.0)


def test_a_too_coarse_quantum_is_refused_with_the_fix():
    with pytest.raises(GacError, match="too coarse .* give a quantum below 0.1 ms"):
        solve_latency_budget([[0.4], [0.4]], [[0.0], [0.0]], 1.0, quantum_ms=0.6)  # 2 quanta > 1 quantum of budget
    r = solve_latency_budget([[0.4], [0.4]], [[0.0], [0.0]], 1.0, quantum_ms=0.099)
    assert r.held and r.latency_ms == 0.8


def test_default_quantum_keeps_the_rounding_below_a_thousandth_of_the_budget():
    for budget, n in [(100.0, 224), (3.0, 7), (1e-3, 1), (5000.0, 10_000)]:
        q = default_quantum(budget, n)
        assert n * q <= 1e-3 * budget * (1 + 1e-12)
        assert n * q * 10 > 1e-3 * budget  # the largest power of ten that does
        assert math.log10(q) == pytest.approx(round(math.log10(q)))


def _best_min_latency(params, latency, p, bound):
    best = None
    for combo in _plans([len(x) for x in params]):
        kept = sum(params[i][j] for i, j in enumerate(combo))
        if (kept < p) if bound == "at_least" else (kept > p):
            continue
        ms = math.fsum(latency[i][j] for i, j in enumerate(combo))
        if best is None or ms < best[0] - 1e-12 or (abs(ms - best[0]) <= 1e-12 and kept > best[1]):
            best = (ms, kept)
    return best


@pytest.mark.parametrize("bound", ["at_least", "at_most"])
def test_min_latency_equals_brute_force(bound):
    rng = random.Random(77 + len(bound))
    for _ in range(800):
        n = rng.randint(1, 5)
        params = [sorted(rng.sample(range(0, 60), rng.randint(1, 4))) for _ in range(n)]
        # latency mostly grows with parameters, with cliffs; many equal latencies for the tie-break
        latency = [[round(8 * (p / 10 + rng.choice([0.0, 0.0, 1.5]) + rng.random() * 0.2)) / 8 for p in row]
                   for row in params]  # multiples of 1/8: sums are exact, so ties are real ties
        lo, hi = sum(min(r) for r in params), sum(max(r) for r in params)
        p = rng.randint(lo, hi)
        best = _best_min_latency(params, latency, p, bound)
        r = solve_min_latency(params, latency, p, bound)
        kept = sum(params[i][j] for i, j in enumerate(r.choice))
        assert kept == r.params
        assert (kept >= p) if bound == "at_least" else (kept <= p)
        assert r.latency_ms == pytest.approx(best[0], abs=1e-9)
        if bound == "at_least":  # ties go to more parameters (the solver's cheaper plan gives up fewer)
            assert r.params == best[1]


def test_min_latency_refuses_a_size_no_plan_reaches():
    with pytest.raises(GacError, match="no plan keeps 100 parameters"):
        solve_min_latency([[10, 20], [30]], [[1.0, 2.0], [1.0]], 100)


# ------------------------------------------------------------------------------------------------ llama-shaped, MILP
def _table(targets, cands, seed=0):
    """A synthetic latency table with alignment cliffs: time ~ d (out + in), x1.6 off multiples of 16, noise."""
    rng = np.random.default_rng(seed)
    table = {}
    for t, cs in zip(targets, cands):
        row = {}
        for d in cs:
            base = 1e-9 * t.params(d) * (1.6 if d % 16 else 1.0)
            row[d] = float(base * (1 + 0.03 * rng.random()) + 0.002)
        table[t.name] = row
    return table


def _llama(seed, windows=(4,)):
    p = lowrank_problem("llama3_8b", 0.15, seed=seed, windows=windows)
    cands = candidate_sets(p.targets)
    return p, cands, _table(p.targets, cands, seed)


def _milp_latency(latency, values, budget):
    """The MILP on the true latencies (no rounding): the best value with sum latency <= budget."""
    flat_l = [x for ls in latency for x in ls]
    scale = max(1e-300, max(abs(v) for vs in values for v in vs))
    flat_v = [v / scale for vs in values for v in vs]
    n, m = len(latency), len(flat_l)
    a = np.zeros((n, m))
    k = 0
    for i, ls in enumerate(latency):
        a[i, k:k + len(ls)] = 1
        k += len(ls)
    res = milp(-np.asarray(flat_v), integrality=np.ones(m), bounds=Bounds(0, 1),
               constraints=[LinearConstraint(a, 1, 1), LinearConstraint(np.asarray(flat_l)[None, :], -np.inf, budget)],
               options={"mip_rel_gap": 0.0, "time_limit": 120})
    assert res.success, res.message
    return -res.fun * scale


@pytest.mark.parametrize("seed", [0, 1])
def test_latency_budget_equals_milp_on_llama_shaped_problems(seed):
    p, cands, table = _llama(seed)
    targets = p.targets
    lat = [[table[t.name][d] for d in cs] for t, cs in zip(targets, cands)]
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(targets, cands)]
    lo, hi = sum(min(x) for x in lat), sum(max(x) for x in lat)
    for frac in (0.3, 0.7):
        budget = lo + frac * (hi - lo)
        r = solve_latency_budget(lat, values, budget)
        assert r.held
        # exact on the rounded problem ...
        q = Fraction(repr(r.quantum_ms))
        costs = [[int(-((-Fraction(x)) // q)) for x in ls] for ls in lat]
        mv, mc, _ = milp_reference(costs, values, int(Fraction(budget) // q))
        assert r.value == pytest.approx(mv, rel=1e-9)
        # ... and between the true optimum at the budget and at the budget less n quanta
        assert r.value <= _milp_latency(lat, values, budget) * (1 + 1e-9) + 1e-9
        assert r.value >= _milp_latency(lat, values, budget - r.optimal_within_ms) * (1 - 1e-9) - 1e-9


def test_min_latency_equals_milp_on_a_llama_shaped_problem():
    p, cands, table = _llama(3)
    params = [[t.params(d) for d in cs] for t, cs in zip(p.targets, cands)]
    lat = [[table[t.name][d] for d in cs] for t, cs in zip(p.targets, cands)]
    top = [max(r) for r in params]
    r = solve_min_latency(params, lat, p.budget)
    mv, _, choice = milp_reference([[t - x for x in row] for t, row in zip(top, params)],
                                   [[-x for x in ls] for ls in lat], sum(top) - p.budget)
    assert r.params >= p.budget
    assert r.latency_ms == pytest.approx(-mv, rel=1e-9)


def test_latency_plans_hold_their_budgets_and_trade_against_the_parameter_plan():
    from gac.align import align

    p, cands, table = _llama(0, windows=(8,))
    gac = align(p.targets, p.budget, "gac")
    at = plan_latency(p.targets, gac.dims, table)
    assert at is not None
    # at the latency gac's parameter plan reaches, the latency plan scores at least as well (within the rounding)
    lp = align_latency(p.targets, table, at, p.budget)
    s = lp.stats["latency"]
    assert lp.strategy == "gac_latency" and s["held"] and s["latency_ms"] <= at
    assert s["budget_kind"] == "latency_ms" and s["quantum_ms"] == default_quantum(at, len(p.targets))
    assert plan_latency(p.targets, lp.dims, table) == s["latency_ms"]
    assert lp.objective >= gac.objective - 1e-9 * abs(gac.objective) or s["optimal_within_ms"] > 0
    # the fastest plan at least as large as gac's is no slower than gac's plan
    fast = align_min_latency(p.targets, table, gac.params)
    assert fast.params >= gac.params and fast.stats["latency"]["latency_ms"] <= at + 1e-12
    assert fast.stats["latency"]["held"]
    most = align_min_latency(p.targets, table, p.budget, bound="at_most")
    assert most.params <= p.budget and most.budget_met


def test_a_table_missing_a_candidate_is_refused_by_name():
    t = Target("a", 100.0, 1.0, 10, d_max=256)
    with pytest.raises(GacError, match=r"lacks candidate dimensions: 'a' at \[104\]"):
        align_latency([t], {"a": {96: 1.0}}, 5.0, 2000)
    with pytest.raises(GacError, match=r"'b' \(no entry\)"):
        align_latency([t, Target("b", 50.0, 1.0, 10)], {"a": {96: 1.0, 104: 1.0}}, 5.0, 2000)


def test_check_latency_table_reads_json_keys_and_refuses_bad_entries():
    assert check_latency_table({"a": {"96": 1, "104": 1.5}}) == {"a": {96: 1.0, 104: 1.5}}
    for bad, what in [({"a": {"x": 1.0}}, "positive integers"), ({"a": {"96": -1.0}}, ">= 0"),
                      ({"a": {"96": float("nan")}}, ">= 0"), ({"a": {}}, "non-empty"), ([1], "must map"),
                      ({"a": {"0": 1.0}}, "positive integers")]:
        with pytest.raises(GacError, match=what):
            check_latency_table(bad)
