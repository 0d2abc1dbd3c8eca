"""Independent references for the exact solver: brute force and a MILP (scipy.optimize.milp / HiGHS, gap 0).

Slow by design; used by the tests and `benchmarks/solver.py` to check `solve_mckp`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


def brute_force(costs, values, budget):
    """Best (value, cost) over all plans within budget, or None."""
    best = None
    for combo in itertools.product(*[range(len(c)) for c in costs]):
        cost = sum(costs[i][j] for i, j in enumerate(combo))
        if cost > budget:
            continue
        value = math.fsum(values[i][j] for i, j in enumerate(combo))
        if best is None or value > best[0] + 1e-12 or (abs(value - best[0]) <= 1e-12 and cost < best[1]):
            best = (value, cost)
    return best


def milp_reference(costs, values, budget):
    """Exact MILP optimum (mip_rel_gap=0). Returns (value, cost, choice) recomputed from the rounded solution."""
    n = len(costs)
    base = sum(min(c) for c in costs)
    g = 0
    for c in costs:
        for x in c:
            g = math.gcd(g, x - min(c))
    g = g or 1
    slack = (budget - base) // g
    flat_e, flat_v, rows = [], [], []
    scale = max(1e-300, max(abs(v) for vs in values for v in vs))
    for i, (cs, vs) in enumerate(zip(costs, values)):
        for c, v in zip(cs, vs):
            flat_e.append((c - min(cs)) // g)
            flat_v.append(v / scale)
            rows.append(i)
    m = len(flat_e)
    A_eq = np.zeros((n, m))
    A_eq[rows, np.arange(m)] = 1.0
    cons = [LinearConstraint(A_eq, 1, 1), LinearConstraint(np.asarray(flat_e, dtype=float)[None, :], -np.inf, slack)]
    res = milp(-np.asarray(flat_v), constraints=cons, integrality=np.ones(m), bounds=Bounds(0, 1),
               options={"mip_rel_gap": 0.0, "time_limit": 120})
    assert res.success, res.message
    x = np.round(res.x).astype(int)
    choice = [None] * n
    k = 0
    for i, cs in enumerate(costs):
        for j in range(len(cs)):
            if x[k]:
                choice[i] = j
            k += 1
    cost = sum(costs[i][j] for i, j in enumerate(choice))
    value = math.fsum(values[i][j] for i, j in enumerate(choice))
    return value, cost, choice
