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
    plan_latency,
    plan_latency_exact,
    round_up,
    solve_latency_budget,
    solve_min_latency,
)
from gac.align.reference import milp_reference
from gac.align.synthetic import lowrank_problem
from gac.align.targets import Target
from gac.errors import GacError


def _plans(n_opts):
    return itertools.product(*[range(k) for k in n_opts])


MODES = ("proportional", "three_decimals", "irregular", "grid")


def _random_problem(rng: random.Random, mode: str):
    """A small problem shaped like a plan's: options are dims with params ``ppd * d``, values Eq. 4's
    ``score * (params - params*)`` (random scores), and latencies by ``mode``: proportional to the params (a float
    factor, so each latency is a rounded product), given to three decimals, irregular, or on a binary grid."""
    n = rng.randint(1, 5)
    factor = rng.uniform(1e-4, 3e-3)
    latency, values = [], []
    for _ in range(n):
        ppd = rng.choice([24, 40, 64])
        dims = sorted(rng.sample(range(1, 40), rng.randint(1, 4)))
        d_star = rng.uniform(dims[0], dims[-1] + 1)
        score = rng.uniform(0.1, 3.0)
        params = [ppd * 8 * d for d in dims]
        if mode == "proportional":
            lat = [factor * p for p in params]
        elif mode == "three_decimals":
            lat = [round(factor * p * rng.uniform(0.8, 1.6), 3) for p in params]
        elif mode == "irregular":
            lat = [rng.uniform(0.0, 5.0) for _ in params]
        else:
            lat = [rng.randint(0, 40) / 8 for _ in params]
        latency.append(lat)
        values.append([score * (p - ppd * 8 * d_star) for p in params])
    return latency, values


def _all_plans(latency, values):
    """Every plan's exact latency and exact value."""
    return [(sum((Fraction(latency[i][j]) for i, j in enumerate(c)), Fraction(0)),
             sum((Fraction(values[i][j]) for i, j in enumerate(c)), Fraction(0)))
            for c in _plans([len(x) for x in latency])]


def boundary_check(solve, seed: int = 0, problems: int = 160) -> dict:
    """Brute force at budgets equal to candidate plans' exact latencies (the fastest plan's among them), as the exact
    rational and rounded up to a float, and at fixed_ms > 0. ``solve(latency, values, budget, fixed)`` returns the
    choice or raises :class:`GacError`. Counts cases, boundary budgets, worse plans, overshoots and refusals."""
    rng = random.Random(seed)
    out = {"cases": 0, "budgets": 0, "worse": 0, "over": 0, "refused": 0}
    for k in range(problems):
        mode = MODES[k % len(MODES)]
        latency, values = _random_problem(rng, mode)
        plans = _all_plans(latency, values)
        out["cases"] += 1
        lats = sorted({lat for lat, _ in plans})
        picks = {lats[0], *rng.sample(lats, min(4, len(lats)))}
        fixed = rng.choice([0.0, 0.0, 0.45, 7.125])
        for lat in sorted(picks):
            for budget in (Fraction(fixed) + lat, round_up(Fraction(fixed) + lat)):
                out["budgets"] += 1
                best = max(v for x, v in plans if Fraction(fixed) + x <= Fraction(budget))
                try:
                    choice = solve(latency, values, budget, fixed)
                except GacError:
                    out["refused"] += 1
                    continue
                got_lat = Fraction(fixed) + sum((Fraction(latency[i][j]) for i, j in enumerate(choice)), Fraction(0))
                got = sum((Fraction(values[i][j]) for i, j in enumerate(choice)), Fraction(0))
                out["over"] += got_lat > Fraction(budget)
                out["worse"] += got < best
    return out


def test_at_budgets_equal_to_plans_latencies_the_solver_equals_brute_force():
    # the boundary is where rounding loses plans: a budget equal to a plan's own latency must keep that plan (or a
    # better one), the fastest plan's included, for latencies proportional to params, to three decimals, irregular
    counts = boundary_check(lambda lat, val, b, f: solve_latency_budget(lat, val, b, fixed_ms=f).choice)
    assert counts["cases"] == 160 and counts["budgets"] > 1200
    assert counts == {**counts, "worse": 0, "over": 0, "refused": 0}


def test_random_budgets_equal_brute_force_exactly():
    rng = random.Random(11)
    for k in range(400):
        latency, values = _random_problem(rng, MODES[k % len(MODES)])
        plans = _all_plans(latency, values)
        lo = sum(min(x) for x in latency)
        budget = rng.uniform(lo, sum(max(x) for x in latency) + 1.0)
        r = solve_latency_budget(latency, values, budget)
        best = max(v for x, v in plans if x <= Fraction(budget))
        assert r.held and r.latency_ms <= budget and r.exact_latency_ms <= Fraction(budget)
        assert Fraction(r.latency_ms) >= r.exact_latency_ms  # reported rounded up
        assert sum((Fraction(values[i][j]) for i, j in enumerate(r.choice)), Fraction(0)) == best
        assert r.value == float(best)


def test_fractions_are_taken_exactly():
    # 1/3 ms is no float: as a Fraction the plan at exactly 1 ms fits a budget of exactly 1 ms
    third = Fraction(1, 3)
    r = solve_latency_budget([[third, 0], [third, 0], [third, 0]], [[1.0, 0.0]] * 3, Fraction(1))
    assert r.choice == [0, 0, 0] and r.exact_latency_ms == 1 and r.held
    r = solve_latency_budget([[third, 0], [third, 0], [third, 0]], [[1.0, 0.0]] * 3, Fraction(1) - Fraction(1, 10**30))
    assert sorted(r.choice) == [0, 0, 1]


def test_plan_latency_is_rounded_up_so_it_holds_its_plan_as_a_budget():
    t = [Target("a", 8.0, 1.0, 10, d_max=64), Target("b", 8.0, 1.0, 10, d_max=64)]
    table = {"a": {8: 0.1}, "b": {8: 0.2}}
    ms = plan_latency(t, {"a": 8, "b": 8}, table)
    exact = Fraction(0.1) + Fraction(0.2)
    assert Fraction(ms) >= exact > Fraction(math.nextafter(ms, 0))  # the least float at least the exact sum
    assert plan_latency_exact(t, {"a": 8, "b": 8}, table) == Fraction(0.1) + Fraction(0.2)
    assert align_latency(t, table, ms, 10**6).dims == {"a": 8, "b": 8}


def test_fixed_latency_is_part_of_the_budget():
    latency, values = [[1.0, 2.0], [1.0, 3.0]], [[0.0, 1.0], [0.0, 2.0]]
    assert solve_latency_budget(latency, values, 4.0).choice == [0, 1]
    r = solve_latency_budget(latency, values, 4.0, fixed_ms=1.0)
    assert r.choice == [1, 0] and r.latency_ms == 4.0 and r.held
    with pytest.raises(GacError, match=r"infeasible latency budget: 2.5 ms is below the fastest plan .* \(3 ms"):
        solve_latency_budget(latency, values, 2.5, fixed_ms=1.0)


def test_the_fastest_plans_own_latency_is_a_feasible_budget():
    # latencies to three decimals: the fastest plan's exact latency is a budget with a plan, never refused
    latency = [[0.123, 0.456], [1.001, 2.002], [0.333, 0.5]]
    fastest = Fraction(0.123) + Fraction(1.001) + Fraction(0.333)
    r = solve_latency_budget(latency, [[0.0, 1.0]] * 3, round_up(fastest))
    assert r.choice == [0, 0, 0] and r.held
    with pytest.raises(GacError, match="infeasible latency budget"):
        solve_latency_budget(latency, [[0.0, 1.0]] * 3, fastest - Fraction(1, 10**20))


def test_ties_on_the_break_slope_are_solved_exactly_on_a_model_sized_problem():
    # equal scores with latency proportional to params: every option lies on one line, the LP bound does not prune;
    # the exact list of partial plans still ends, and at the gac plan's own latency returns a plan at least as good
    from gac.align import align

    p = lowrank_problem("llama3_8b", 0.15, seed=0, windows=(1,), equal_scores=True)
    cands = candidate_sets(p.targets)
    table = {t.name: {d: 1.37e-9 * t.params(d) for d in cs} for t, cs in zip(p.targets, cands)}
    gac = align(p.targets, p.budget, "gac")
    at = plan_latency(p.targets, gac.dims, table)
    lp = align_latency(p.targets, table, at, p.budget)
    assert lp.stats["latency"]["held"] and lp.objective >= gac.objective


def test_the_partial_plan_limit_raises_with_the_fix(monkeypatch):
    monkeypatch.setenv("GAC_EXACT_MAX_STATES", "3")
    p = lowrank_problem("llama3_8b", 0.15, seed=0, windows=(4,), equal_scores=True)
    cands = candidate_sets(p.targets, window=4)
    lat = [[1.37e-9 * t.params(d) for d in cs] for t, cs in zip(p.targets, cands)]
    values = [[t.params(d) - t.params_star for d in cs] for t, cs in zip(p.targets, cands)]
    lo, hi = sum(min(x) for x in lat), sum(max(x) for x in lat)
    with pytest.raises(GacError, match="more than 3 partial plans.*GAC_EXACT_MAX_STATES"):
        solve_latency_budget(lat, values, lo + 0.3 * (hi - lo))


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
        # the MILP on the true latencies (HiGHS, gap 0, its own float tolerances) finds the same optimum
        assert r.value == pytest.approx(_milp_latency(lat, values, budget), rel=1e-9)


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
    assert s["budget_kind"] == "latency_ms" and s["solver"] == "exact"
    assert plan_latency(p.targets, lp.dims, table) == s["latency_ms"]

    def eq4(dims):  # the exact Eq. 4 value the solver maximises
        return sum((Fraction(t.score * (t.params(dims[t.name]) - t.params_star)) for t in p.targets), Fraction(0))

    assert eq4(lp.dims) >= eq4(gac.dims)  # the gac plan is within its own latency: never a worse plan
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
    for bad, what in [({"a": {"x": 1.0}}, "positive integers"), ({"a": {"96": -1.0}}, r"from 0 to 1e\+09"),
                      ({"a": {"96": float("nan")}}, "from 0 to"), ({"a": {}}, "non-empty"), ([1], "must map"),
                      ({"a": {"96": 10**400}}, "an integer of about 400 digits"), ({"a": {"96": 1e308}}, "got 1e\\+308"),
                      ({"a": {"0": 1.0}}, "positive integers")]:
        with pytest.raises(GacError, match=what):
            check_latency_table(bad)
