"""Exact multiple-choice knapsack (MCKP): one option per item, total cost <= budget, maximal total value.

This is the optimisation of the paper's Eq. 4. The paper quantizes the budget by a unit u, which can both
overshoot the budget and miss the optimum. This solver is exact in integers and holds the budget exactly:

1. Dominated options (no cheaper, at least as valuable option exists) are dropped; every item's cheapest
   option is paid up front, and the remaining *slack* ``B - sum_i min_j c_ij`` is measured in units of
   ``g = gcd`` of all the extra costs ``c_ij - min_j c_ij``. This is exact: every plan's extra cost is a
   multiple of g, so a plan fits iff its extra cost in units of g fits ``floor(slack / g)``.
2. The LP relaxation (greedy over the upper convex hull of each item's options) gives the break multiplier
   lambda and the Lagrangian upper bound ``UB = lambda * S + sum_i max_j (v_ij - lambda * e_ij)``. Any plan
   has value ``UB - sum_i pen_i(j_i) - lambda * unused`` with non-negative penalties, so with a feasible
   lower bound ``LB`` (a greedy plan) an option whose penalty exceeds ``UB - LB`` cannot be in an optimum
   and is removed. Items left with one option are fixed. This reduction is exact, not a heuristic.
3. A dynamic programme over the remaining slack (in units of g) solves the reduced problem exactly;
   ties go to the smaller total cost, then to the cheaper option of the earlier item, so the result is
   deterministic. Its table is bounded (1 GiB, ``GAC_SOLVER_MAX_MB``): when ties survive the reduction (equal
   scores make every penalty zero), a larger core is solved exactly for a better lower bound (which may meet the
   upper bound, a proof of optimality, or shrink the allowed sets); if the DP still does not fit, the solver
   raises :class:`GacError` with the memory it would need, never an inexact answer.

Values are floats; the reduction keeps a relative tolerance of 1e-9 so rounding never removes an optimal
option. Costs are Python/NumPy integers (no overflow below 2**63).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gac.errors import GacError, InfeasibleBudgetError

_REL_TOL = 1e-9
_CORE_SIZES = (32, 256, 2048, 16384)  # items solved exactly for the lower bound (more only while the DP is too big)


@dataclass
class MCKPResult:
    choice: list[int]  # index into each item's ORIGINAL option list
    cost: int
    value: float
    stats: dict = field(default_factory=dict)


def min_feasible_budget(costs: Sequence[Sequence[int]]) -> int:
    return int(sum(min(int(c) for c in cs) for cs in costs))


def solve_mckp(costs: Sequence[Sequence[int]], values: Sequence[Sequence[float]], budget: int) -> MCKPResult:
    """Exact MCKP. ``costs[i][j]`` (int >= 0) and ``values[i][j]`` (finite float) of option j of item i."""
    t0 = time.perf_counter()
    n = len(costs)
    if n != len(values):
        raise ValueError("costs and values must have one entry per item")
    budget = int(budget)
    min_budget = min_feasible_budget(costs) if n else 0
    if min_budget > budget:
        raise InfeasibleBudgetError(budget, min_budget)
    if n == 0:
        return MCKPResult([], 0, 0.0, {"n_items": 0})

    # 1. Per item: sort by cost, drop dominated options. Keep the map back to the original index.
    opt_cost: list[np.ndarray] = []
    opt_val: list[np.ndarray] = []
    opt_idx: list[np.ndarray] = []
    for cs, vs in zip(costs, values):
        c = np.asarray(cs, dtype=np.int64)
        v = np.asarray(vs, dtype=np.float64)
        if c.ndim != 1 or c.shape != v.shape or c.size == 0:
            raise ValueError("each item needs at least one option and as many values as costs")
        if (c < 0).any():
            raise ValueError("costs must be non-negative")
        if not np.isfinite(v).all():
            raise ValueError("values must be finite")
        order = np.lexsort((-v, c))  # by cost, then by value descending (the better of equal-cost options first)
        keep, best = [], -math.inf
        for k in order:
            if v[k] > best:
                keep.append(k)
                best = v[k]
        keep = np.asarray(keep, dtype=np.int64)
        opt_cost.append(c[keep])
        opt_val.append(v[keep])
        opt_idx.append(keep)

    base_cost = int(sum(int(c[0]) for c in opt_cost))
    extra = [c - c[0] for c in opt_cost]
    g = 0
    for e in extra:
        for x in e[1:]:
            g = math.gcd(g, int(x))
    if g == 0:  # every item has a single (cheapest, best) option
        choice = [0] * n
        return _finish(choice, opt_cost, opt_val, opt_idx, t0, {"n_items": n, "g": 0, "n_free": 0, "dp_width": 0})
    slack = (budget - base_cost) // g
    ext = [(e // g).astype(np.int64) for e in extra]
    gain = [v - v[0] for v in opt_val]

    # Everything fits: the most expensive option of each item is also its most valuable.
    if sum(int(e[-1]) for e in ext) <= slack:
        choice = [len(e) - 1 for e in ext]
        return _finish(choice, opt_cost, opt_val, opt_idx, t0, {"n_items": n, "g": g, "n_free": 0, "dp_width": 0})

    # 2. LP relaxation over upper convex hulls -> lambda; Lagrangian bound; greedy lower bound.
    lam, lp_choice = _lp_break(ext, gain, slack)
    red = [gn - lam * e for gn, e in zip(gain, ext)]  # v - lambda e
    red_max = [float(r.max()) for r in red]
    ub = lam * slack + sum(red_max)
    tol_scale = max(1.0, abs(ub), sum(abs(float(gn[-1])) for gn in gain))
    lb_choice, lb, gap = None, -math.inf, math.inf
    limit = dp_limit_bytes()
    for core_size in _CORE_SIZES:  # a larger core only when the exact DP below would not fit in memory
        choice = _core_lower_bound(ext, gain, red, red_max, slack, lp_choice, core_size, limit)
        value = float(sum(gain[i][j] for i, j in enumerate(choice)))
        if lb_choice is None or value > lb:
            lb_choice, lb = choice, value
        gap = max(0.0, ub - lb)
        tol = _REL_TOL * max(tol_scale, abs(lb))
        stats = {"n_items": n, "g": g, "slack_units": int(slack), "lambda": lam, "ub": ub, "lb": lb,
                 "n_free": 0, "dp_width": 0, "core": core_size}
        if gap <= tol:  # the incumbent meets the upper bound: it is optimal
            return _finish(lb_choice, opt_cost, opt_val, opt_idx, t0, stats)
        allowed, free, rem, width = _reduce(ext, red, red_max, gap, tol, lb_choice, slack)
        need = _dp_bytes(len(free), width)
        if need <= limit or core_size >= n:
            break
    if need > limit:
        raise GacError(
            f"the exact solver would need {_size(need)} for this allocation ({len(free):,} targets whose "
            f"candidates stay tied after the exact reduction, {width + 1:,} budget steps), above its limit of "
            f"{_size(limit)}; ties like this come from equal or proportional scores: give the targets "
            f"distinct scores, or raise the limit with {DP_LIMIT_ENV}=<MiB> if the memory is there"
        )

    # 3. Fix single-option items; DP over the rest.
    choice = [int(a[0]) for a in allowed]
    if free and rem >= 0:
        sub = _dp(
            [ext[i][allowed[i]] - ext[i][allowed[i][0]] for i in free],
            [gain[i][allowed[i]] for i in free],
            width,
        )
        for i, k in zip(free, sub):
            choice[i] = int(allowed[i][k])
    elif free:  # cannot happen (LB plan is feasible and within the allowed sets); be safe
        choice = list(lb_choice)
    value = float(sum(gain[i][choice[i]] for i in range(n)))
    if value < lb - tol:  # never worse than the incumbent
        choice = list(lb_choice)
    stats.update(n_free=len(free), dp_width=int(width))
    return _finish(choice, opt_cost, opt_val, opt_idx, t0, stats)


def _reduce(ext, red, red_max, gap, tol, lb_choice, slack):
    """The exact reduction: options whose penalty exceeds the gap cannot be optimal. Returns the allowed options per
    item, the items left free, the slack left for them above their cheapest allowed options, and the DP's width."""
    allowed: list[np.ndarray] = []
    for i in range(len(ext)):
        pen = red_max[i] - red[i]
        ok = np.flatnonzero(pen <= gap + tol)
        if lb_choice[i] not in ok:  # keeps the incumbent representable (a no-op unless rounding)
            ok = np.union1d(ok, [lb_choice[i]])
        allowed.append(ok)
    free = [i for i in range(len(ext)) if len(allowed[i]) > 1]
    fixed_cost = sum(int(ext[i][allowed[i][0]]) for i in range(len(ext)) if len(allowed[i]) == 1)
    free_base = sum(int(ext[i][allowed[i][0]]) for i in free)
    rem = slack - fixed_cost - free_base
    width = 0
    if free and rem >= 0:
        width = min(rem, sum(int(ext[i][allowed[i][-1]] - ext[i][allowed[i][0]]) for i in free))
    return allowed, free, rem, width


DP_LIMIT_ENV = "GAC_SOLVER_MAX_MB"


def dp_limit_bytes() -> int:
    """The most memory the exact DP may take (its choice table): 1 GiB, or ``GAC_SOLVER_MAX_MB``."""
    from gac.checks import env_number

    return int(env_number(DP_LIMIT_ENV) * 2**20)


def _size(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _dp_bytes(m: int, width: int) -> int:
    """Memory of :func:`_dp` over ``m`` items and ``width + 1`` states: the choice table plus two value rows."""
    return m * (width + 1) * 2 + 3 * (width + 1) * 8 if m else 0


def _finish(choice, opt_cost, opt_val, opt_idx, t0, stats) -> MCKPResult:
    cost = int(sum(int(opt_cost[i][j]) for i, j in enumerate(choice)))
    value = float(sum(float(opt_val[i][j]) for i, j in enumerate(choice)))
    orig = [int(opt_idx[i][j]) for i, j in enumerate(choice)]
    stats["time_s"] = time.perf_counter() - t0
    return MCKPResult(orig, cost, value, stats)


def upper_hull(e, v) -> list[int]:
    """Indices of the upper concave hull of the points (e, v), e strictly increasing, starting at index 0: exact on
    Python integers (the exact planner's), in floating point on numpy arrays."""
    hull: list[int] = []
    for k in range(len(e)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b if it lies on or below the segment a -> k
            if (v[b] - v[a]) * (e[k] - e[a]) <= (v[k] - v[a]) * (e[b] - e[a]):
                hull.pop()
            else:
                break
        hull.append(k)
    return hull


def _lp_break(ext, gain, slack) -> tuple[float, list[int]]:
    """LP relaxation: take hull segments by decreasing slope. Returns (lambda, integral part of the LP plan)."""
    segs = []  # (slope, item, to_index, length)
    for i, (e, v) in enumerate(zip(ext, gain)):
        h = upper_hull(e, v)
        for a, b in zip(h[:-1], h[1:]):
            length = int(e[b] - e[a])
            segs.append(((v[b] - v[a]) / length, i, b, length))
    segs.sort(key=lambda s: (-s[0], s[1], s[2]))
    choice = [0] * len(ext)
    left = slack
    for slope, i, b, length in segs:
        if length <= left:
            choice[i] = b
            left -= length
        else:
            return max(0.0, float(slope)), choice
    return 0.0, choice  # everything fits (handled by the caller)


def _core_lower_bound(ext, gain, red, red_max, slack, lp_choice, core_size: int = _CORE_SIZES[0],
                      limit: int | None = None) -> list[int]:
    """A strong feasible plan: solve exactly the items closest to the LP break, the others at their LP choice.

    The "core" are the items whose cheapest deviation from the LP plan costs the least penalty per unit of
    cost, half of them among the deviations up (more cost) and half among those down, so that the core can both
    spend and free budget when penalties tie (equal scores make every penalty zero); outside the core, items keep
    the LP's integral choice. The result is then topped up greedily. The core shrinks until its DP fits ``limit``.
    """
    n = len(ext)
    up, down = [], []
    for i in range(n):
        j0 = lp_choice[i]
        dist = (ext[i] - ext[i][j0]).astype(np.float64)
        pen = red_max[i] - red[i]
        ratio = np.divide(pen, np.abs(dist), out=np.full(len(dist), math.inf), where=dist != 0)
        up.append(float(ratio[dist > 0].min()) if (dist > 0).any() else math.inf)
        down.append(float(ratio[dist < 0].min()) if (dist < 0).any() else math.inf)
    by_up = [i for i in sorted(range(n), key=lambda i: (up[i], i)) if up[i] < math.inf]
    by_down = [i for i in sorted(range(n), key=lambda i: (down[i], i)) if down[i] < math.inf]
    by_any = sorted(range(n), key=lambda i: (min(up[i], down[i]), i))
    choice = list(lp_choice)
    size = min(n, core_size)
    while size >= 1:
        core = list(dict.fromkeys([*by_up[: (size + 1) // 2], *by_down[: size // 2]]))
        taken = set(core)
        core += [i for i in by_any if i not in taken][: size - len(core)]
        core = sorted(i for i in core if len(ext[i]) > 1)
        if not core:
            break
        in_core = set(core)
        rem = slack - sum(int(ext[i][lp_choice[i]]) for i in range(n) if i not in in_core)
        width = min(rem, sum(int(ext[i][-1]) for i in core))
        if width < 0:
            break
        if limit is not None and _dp_bytes(len(core), width) > limit:
            size //= 2
            continue
        sub = _dp([ext[i] for i in core], [gain[i] for i in core], width)
        for i, k in zip(core, sub):
            choice[i] = int(k)
        break
    return _greedy_fill(ext, gain, slack, choice)


def _greedy_fill(ext, gain, slack, start) -> list[int]:
    """A feasible plan: start from the LP's integral part, then spend what is left on the best single upgrades."""
    choice = list(start)
    left = slack - sum(int(ext[i][j]) for i, j in enumerate(choice))
    improved = True
    while improved and left > 0:
        improved = False
        best = None
        for i, (e, v) in enumerate(zip(ext, gain)):
            j0 = choice[i]
            extra = e - e[j0]
            ok = np.flatnonzero((extra > 0) & (extra <= left))
            if ok.size:
                k = ok[np.argmax(v[ok])]
                d = v[k] - v[j0]
                if d > 0 and (best is None or d > best[0]):
                    best = (d, i, int(k))
        if best is not None:
            _, i, k = best
            left -= int(ext[i][k] - ext[i][choice[i]])
            choice[i] = k
            improved = True
    return choice


def _dp(shifts: list[np.ndarray], vals: list[np.ndarray], width: int) -> list[int]:
    """Exact DP over total shift in [0, width]; returns the chosen option index per item."""
    m = len(shifts)
    neg = -np.inf
    best = np.full(width + 1, neg)
    best[0] = 0.0
    choices = np.zeros((m, width + 1), dtype=np.int16 if max(len(s) for s in shifts) < 32767 else np.int32)
    for t, (sh, val) in enumerate(zip(shifts, vals)):
        new = np.full(width + 1, neg)
        ch = choices[t]
        for j in range(len(sh)):
            s = int(sh[j])
            if s > width:
                break
            cand = best[: width + 1 - s] + val[j]
            seg = new[s:]
            better = cand > seg
            np.copyto(seg, cand, where=better)
            np.copyto(ch[s:], j, where=better)
        best = new
    b = int(np.argmax(best))  # first maximum = smallest total cost among ties
    out = [0] * m
    for t in range(m - 1, -1, -1):
        j = int(choices[t][b])
        out[t] = j
        b -= int(shifts[t][j])
    return out
