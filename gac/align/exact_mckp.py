"""The multiple-choice knapsack solved exactly over rational costs and values: no rounding, no quantum.

:func:`gac.align.solver.solve_mckp` is exact over integer costs (parameter counts). A latency is a real number (a
float: its exact binary value; or a :class:`~fractions.Fraction`), and rounding latencies to quanta either loses plans
that fit (each latency rounded up) or admits plans that do not (rounded down). :func:`solve_exact` keeps every number
exact: after one common denominator for the costs and one for the values, every step is integer arithmetic.

1. Per item, dominated options (a cheaper or equal one at least as valuable exists) are dropped; every item's cheapest
   option is paid up front; the extra costs are divided by their gcd.
2. The LP relaxation (greedy over each item's upper convex hull) gives the break slope ``lambda = p / q`` and the
   Lagrangian identity: with ``red = q g - p e`` and ``pen_i = max_j red_ij - red_i(plan) >= 0``, every plan has
   ``q value = UB - sum_i pen_i - p unused``. The LP plan's integral part, topped up greedily, is the first incumbent.
3. A plan better than the incumbent has ``sum pen < gap = UB - q LB``: options whose penalty reaches the gap are
   removed (exactly, in integers); an item left with one option is fixed.
4. The free items join a list of partial plans one at a time (the items not yet added at their LP option): a partial
   plan is its cost and value relative to the LP plan. One is dropped when another no dearer is at least as valuable,
   when its penalties plus ``p`` times the capacity it must leave unused reach the gap, or when the items still to
   come cannot bring it within the budget. A partial plan within the budget is a whole plan: it raises the incumbent
   and narrows the gap. After the last item the incumbent is optimal.

The list is the work. It stays short when the LP bound is tight (distinct scores); ties on the break slope (equal
scores with latency proportional to parameters, say) keep more plans. It is bounded by :data:`MAX_STATES`
(``GAC_EXACT_MAX_STATES``): past it the solver raises :class:`GacError` naming the count, never an inexact answer.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from gac.errors import GacError

MAX_STATES_ENV = "GAC_EXACT_MAX_STATES"
MAX_STATES = 2_000_000  # partial plans kept at once (a few hundred MB of Python integers)

Number = int | float | Fraction


@dataclass
class ExactResult:
    choice: list[int]  # index into each item's original option list
    cost: Fraction  # the plan's exact total cost
    value: Fraction  # its exact total value
    stats: dict = field(default_factory=dict)


def max_states() -> int:
    raw = os.environ.get(MAX_STATES_ENV, "").strip()
    if not raw:
        return MAX_STATES
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n <= 0:
        raise GacError(f"{MAX_STATES_ENV}={raw!r} must be a positive integer (the exact latency solver's limit on "
                       f"partial plans)")
    return n


def _common_denominator(rows: Sequence[Sequence[Fraction]], *extra: Fraction) -> int:
    den = 1
    for row in rows:
        for x in row:
            den = math.lcm(den, x.denominator)
    for x in extra:
        den = math.lcm(den, x.denominator)
    return den


def solve_exact(costs: Sequence[Sequence[Number]], values: Sequence[Sequence[Number]], budget: Number) -> ExactResult:
    """The plan (one option per item) of greatest total value with total cost ``<= budget``, all exact.

    ``costs`` must be finite and ``>= 0``; the caller checks that the cheapest plan fits (else ``ValueError``)."""
    t0 = time.perf_counter()
    n = len(costs)
    if n != len(values):
        raise ValueError("costs and values must have one entry per item")
    fc = [[Fraction(x) for x in row] for row in costs]
    fv = [[Fraction(x) for x in row] for row in values]
    fb = Fraction(budget)
    for row, vrow in zip(fc, fv):
        if not row or len(row) != len(vrow):
            raise ValueError("each item needs at least one option and as many values as costs")
    if sum((min(row) for row in fc), Fraction(0)) > fb:
        raise ValueError("no plan fits the budget")
    cden = _common_denominator(fc, fb)
    vden = _common_denominator(fv)
    ic = [[int(x * cden) for x in row] for row in fc]
    iv = [[int(x * vden) for x in row] for row in fv]
    cap = int(fb * cden)  # floor: the costs are integers

    # 1. per item: by cost, dominated options dropped; extra cost and gain over the cheapest option
    idx, ext, gain = [], [], []
    for c, v in zip(ic, iv):
        order = sorted(range(len(c)), key=lambda j: (c[j], -v[j], j))
        keep, best = [], None
        for j in order:
            if best is None or v[j] > best:
                keep.append(j)
                best = v[j]
        idx.append(keep)
        ext.append([c[j] - c[keep[0]] for j in keep])
        gain.append([v[j] - v[keep[0]] for j in keep])
    base_cost = sum(c[k[0]] for c, k in zip(ic, idx))
    g = 0
    for e in ext:
        for x in e[1:]:
            g = math.gcd(g, x)
    stats = {"n_items": n, "states_max": 0, "n_free": 0}

    def finish(choice):
        orig = [idx[i][j] for i, j in enumerate(choice)]
        cost = sum((fc[i][j] for i, j in enumerate(orig)), Fraction(0))
        value = sum((fv[i][j] for i, j in enumerate(orig)), Fraction(0))
        stats["time_s"] = time.perf_counter() - t0
        return ExactResult(orig, cost, value, stats)

    if g == 0:  # every item has one undominated option
        return finish([0] * n)
    slack = (cap - base_cost) // g
    ext = [[x // g for x in e] for e in ext]
    if sum(e[-1] for e in ext) <= slack:  # everything fits: every item's dearest option is its best
        return finish([len(e) - 1 for e in ext])

    # 2. the LP relaxation: hull segments by decreasing slope until one does not fit
    segs = []
    for i, (e, v) in enumerate(zip(ext, gain)):
        h = _upper_hull(e, v)
        segs += [(Fraction(v[b] - v[a], e[b] - e[a]), i, b, e[b] - e[a]) for a, b in zip(h[:-1], h[1:])]
    segs.sort(key=lambda s: (-s[0], s[1], s[2]))
    lp = [0] * n
    left = slack
    lam = None
    for slope, i, b, length in segs:
        if length > left:
            lam = slope
            break
        lp[i] = b
        left -= length
    p, q = lam.numerator, lam.denominator  # lam > 0: gains strictly increase with cost after step 1
    red = [[q * v - p * x for x, v in zip(e, gv)] for e, gv in zip(ext, gain)]
    red_max = [max(r) for r in red]
    ub = p * slack + sum(red_max)  # q times the LP bound
    choice = _greedy_fill(ext, gain, slack, lp)
    lb = sum(gain[i][j] for i, j in enumerate(choice))
    stats.update({"lambda": float(lam), "lp_gap": float(Fraction(ub - q * lb, q))})
    if q * lb >= ub:
        return finish(choice)

    # 3. the exact reduction; 4. the partial plans over the free items
    gap = ub - q * lb
    lp_cost = sum(ext[i][lp[i]] for i in range(n))
    lp_value = sum(gain[i][lp[i]] for i in range(n))
    room = slack - lp_cost  # >= 0: the LP's integral part fits
    free = []
    for i in range(n):
        pen = [red_max[i] - r for r in red[i]]
        ok = [j for j in range(len(pen)) if pen[j] < gap]  # the LP option (penalty 0) is always kept
        if len(ok) > 1:
            # widest cost range first: what the items left can still move shrinks fastest (fewer partial plans)
            free.append((-(max(ext[i][j] for j in ok) - min(ext[i][j] for j in ok)), i, ok))
    free.sort()
    stats["n_free"] = len(free)
    limit = max_states()
    # what the items still to come can add to (up) or take from (down) a partial plan's cost
    up_rem, down_rem = [0] * (len(free) + 1), [0] * (len(free) + 1)
    for k in range(len(free) - 1, -1, -1):
        _, i, ok = free[k]
        up_rem[k] = up_rem[k + 1] + max(ext[i][j] for j in ok) - ext[i][lp[i]]
        down_rem[k] = down_rem[k + 1] + ext[i][lp[i]] - min(ext[i][j] for j in ok)
    # a partial plan: (cost, -value, penalty), relative to the LP plan, and its path of (item, option) changes
    states = [(0, 0, 0, ())]
    best_state = None
    better = lb - lp_value  # a partial plan within the budget must be worth more than this (relative) to improve
    for k, (_, i, ok) in enumerate(free):
        e0, g0, r0 = ext[i][lp[i]], gain[i][lp[i]], red[i][lp[i]]
        up, down = up_rem[k + 1], down_rem[k + 1]
        cand = []
        for j in ok:
            mc, mv, mp = ext[i][j] - e0, gain[i][j] - g0, r0 - red[i][j]
            most = room + down - mc  # a dearer partial plan cannot be brought within the budget
            if j == lp[i]:
                cand += [s for s in states if s[0] <= most]
            else:
                cand += [(dc + mc, ndv - mv, pen + mp, (i, j, node)) for dc, ndv, pen, node in states
                         if dc <= most and pen + mp < gap]
        cand.sort()
        states = []
        top = None
        for st in cand:
            dc, ndv, pen, node = st
            if top is not None and ndv >= top:
                continue  # dominated: a no dearer plan is at least as valuable
            top = ndv
            if pen >= gap or (dc < room - up and pen + p * (room - up - dc) >= gap):
                continue  # its penalties and the capacity it must leave unused reach the gap
            if dc <= room and -ndv > better:  # a whole plan within the budget, better than the incumbent
                better = -ndv
                gap = ub - q * (lp_value + better)
                best_state = node
            states.append(st)
        stats["states_max"] = max(stats["states_max"], len(states))
        if len(states) > limit:
            raise GacError(f"the exact latency solver would keep more than {limit:,} partial plans ({len(free):,} of "
                           f"{n:,} targets stay free after the exact reduction); this comes from ties: equal scores "
                           f"with latencies proportional to parameters; give the targets distinct scores, or raise "
                           f"the limit with {MAX_STATES_ENV}=<count> if the memory is there")
        if not states:
            break
    if best_state is not None:
        choice = list(lp)
        node = best_state
        while node:
            i, j, node = node
            choice[i] = j
    return finish(choice)


def _upper_hull(e: list[int], v: list[int]) -> list[int]:
    """Indices of the upper concave hull of the points (e, v), e strictly increasing, from index 0."""
    hull: list[int] = []
    for k in range(len(e)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (v[b] - v[a]) * (e[k] - e[a]) <= (v[k] - v[a]) * (e[b] - e[a]):
                hull.pop()
            else:
                break
        hull.append(k)
    return hull


def _greedy_fill(ext, gain, slack, start) -> list[int]:
    """A plan within ``slack``: ``start``, then the best single upgrade that fits, while one improves it."""
    choice = list(start)
    left = slack - sum(ext[i][j] for i, j in enumerate(choice))
    while left > 0:
        best = None
        for i, (e, v) in enumerate(zip(ext, gain)):
            j0 = choice[i]
            for j in range(j0 + 1, len(e)):
                if e[j] - e[j0] > left:
                    break
                d = v[j] - v[j0]
                if best is None or d > best[0]:
                    best = (d, i, j)
        if best is None:
            break
        _, i, j = best
        left -= ext[i][j] - ext[i][choice[i]]
        choice[i] = j
    return choice
