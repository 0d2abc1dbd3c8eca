"""The exact latency solver on ties (equal scores, latency proportional to parameters): brute force on small problems,
its two searches (NumPy and Python integers) against each other, model-sized problems, and its work limit."""

import itertools
import random
from fractions import Fraction

import pytest

import gac.align.exact_mckp as exact_mckp
from gac.align import align, candidate_sets
from gac.align.latency_budget import align_latency, plan_latency, round_up, solve_latency_budget
from gac.align.synthetic import lowrank_problem
from gac.errors import GacError


def _tied_problem(rng: random.Random):
    """Copies of a few item types (identical rows, as equal scores give the projections of every layer), values
    ``score * (params - params*)`` with one score, latencies ``factor * params`` rounded to floats."""
    factor = rng.choice([1.37e-9, 3e-4, 0.1, 1 / 3])
    score = rng.choice([1.0, 0.37, 2.0])
    latency, values = [], []
    types = []
    for _ in range(rng.randint(1, 3)):
        ppd = rng.choice([9, 16, 36, 24])
        start = rng.randint(1, 30)
        dims = [start + k for k in range(rng.randint(2, 4))]
        d_star = rng.uniform(dims[0], dims[-1])
        types.append(([factor * ppd * 8 * d for d in dims], [score * (ppd * 8 * d - ppd * 8 * d_star) for d in dims]))
    for _ in range(rng.randint(2, 6)):
        lat, val = rng.choice(types)
        latency.append(list(lat))
        values.append(list(val))
    return latency, values


def _all_plans(latency, values):
    """Every plan's exact latency and value (with ties many share one)."""
    lat = [[Fraction(x) for x in row] for row in latency]
    val = [[Fraction(x) for x in row] for row in values]
    plans = {}
    for combo in itertools.product(*[range(len(x)) for x in latency]):
        key = sum((lat[i][j] for i, j in enumerate(combo)), Fraction(0))
        v = sum((val[i][j] for i, j in enumerate(combo)), Fraction(0))
        plans[key] = max(v, plans.get(key, v))
    return plans


def _exact_value(values, choice):
    return sum((Fraction(values[i][j]) for i, j in enumerate(choice)), Fraction(0))


@pytest.mark.parametrize("search", ["int64", "python"])
def test_random_tie_heavy_problems_equal_brute_force(search, monkeypatch):
    if search == "python":
        monkeypatch.setattr(exact_mckp, "_INT64_SAFE", 0)  # every number "too large": the Python-integer search
    rng = random.Random(5)
    seen = set()
    for _ in range(100):
        latency, values = _tied_problem(rng)
        plans = _all_plans(latency, values)
        lats = sorted(plans)
        # budgets at plans' own latencies (exact and rounded up) and between them: where ties decide
        for lat in {lats[0], *rng.sample(lats, min(3, len(lats)))}:
            for budget in (lat, round_up(lat), (lat + lats[-1]) / 2):
                r = solve_latency_budget(latency, values, budget)
                seen.add(r.stats.get("search"))
                assert r.exact_latency_ms <= Fraction(budget)
                assert _exact_value(values, r.choice) == max(v for x, v in plans.items() if x <= Fraction(budget))
    assert search in seen  # the search under test ran (others: problems the reduction settles first)


def _tied_llama(shape, window):
    p = lowrank_problem(shape, 0.15, seed=0, windows=(window,), equal_scores=True)
    cands = candidate_sets(p.targets)
    table = {t.name: {d: 1.37e-9 * t.params(d) for d in cs} for t, cs in zip(p.targets, cands)}
    lat = [[table[t.name][d] for d in cs] for t, cs in zip(p.targets, cands)]
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(p.targets, cands)]
    return p, table, lat, values


def _both_searches_agree(shape, monkeypatch):
    """The NumPy search and the Python-integer search at a mid budget: the same exact optimum, both within it."""
    _, _, lat, values = _tied_llama(shape, 4)
    lo, hi = sum(min(x) for x in lat), sum(max(x) for x in lat)
    budget = lo + 0.5 * (hi - lo)
    fast = solve_latency_budget(lat, values, budget)
    monkeypatch.setattr(exact_mckp, "_INT64_SAFE", 0)
    monkeypatch.setenv(exact_mckp.MAX_WORK_ENV, str(10**10))
    slow = solve_latency_budget(lat, values, budget)
    assert (fast.stats["search"], slow.stats["search"]) == ("int64", "python")
    assert _exact_value(values, fast.choice) == _exact_value(values, slow.choice)
    assert fast.held and slow.held


def test_both_searches_agree_on_a_tied_llama_8b_problem(monkeypatch):
    _both_searches_agree("llama3_8b", monkeypatch)


def test_the_tie_heavy_70b_problem_at_the_gac_plans_latency():
    # 560 targets of three identical kinds, eight candidates each: every option on one line, the LP bound prunes
    # nothing; the list of partial plans in NumPy proves the optimum within the default work limit
    p, table, _, _ = _tied_llama("llama3_70b", 4)
    gac = align(p.targets, p.budget, "gac")
    at = plan_latency(p.targets, gac.dims, table)
    lp = align_latency(p.targets, table, at, p.budget)
    s = lp.stats["solver"]
    assert s["search"] == "int64" and s["n_free"] == 560 and s["work"] <= exact_mckp.MAX_WORK
    assert lp.stats["latency"]["held"]
    exact = lambda dims: sum((Fraction(t.score * (t.params(dims[t.name]) - t.params_star)) for t in p.targets),  # noqa: E731
                             Fraction(0))
    assert exact(lp.dims) >= exact(gac.dims)


@pytest.mark.slow
def test_both_searches_agree_on_the_tie_heavy_70b_problem(monkeypatch):
    _both_searches_agree("llama3_70b", monkeypatch)


def test_the_work_limit_refuses_in_one_line_with_the_fix(monkeypatch):
    monkeypatch.setenv("GAC_EXACT_MAX_WORK", "1000")
    _, _, lat, values = _tied_llama("llama3_8b", 4)
    lo, hi = sum(min(x) for x in lat), sum(max(x) for x in lat)
    with pytest.raises(GacError) as e:
        solve_latency_budget(lat, values, lo + 0.5 * (hi - lo))
    msg = str(e.value)
    assert "\n" not in msg and "more than 1,000 partial plans" in msg
    assert "narrower candidate window" in msg and "GAC_EXACT_MAX_WORK=<count>" in msg
    monkeypatch.setenv("GAC_EXACT_MAX_WORK", "lots")
    with pytest.raises(GacError, match="GAC_EXACT_MAX_WORK='lots' must be a positive integer"):
        solve_latency_budget(lat, values, lo + 0.5 * (hi - lo))
