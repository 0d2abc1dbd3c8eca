"""The multiple-choice knapsack solved exactly over rational costs and values: no rounding, no quantum.

:func:`gac.align.solver.solve_mckp` is exact over integer costs (parameter counts). A latency is a real number (a
float: its exact binary value; or a :class:`~fractions.Fraction`), and rounding latencies to quanta either loses plans
that fit (each latency rounded up) or admits plans that do not (rounded down). :func:`solve_exact` keeps every number
exact: after one common denominator for the costs and one for the values, every step is integer arithmetic.

1. Per item, dominated options (a cheaper or equal one at least as valuable exists) are dropped; every item's cheapest
   option is paid up front; the extra costs are divided by their gcd, the gains by theirs.
2. The LP relaxation (greedy over each item's upper convex hull) gives the break slope ``lambda = p / q`` and the
   Lagrangian identity: with ``red = q g - p e`` and ``pen_i = max_j red_ij - red_i(plan) >= 0``, every plan has
   ``q value = UB - sum_i pen_i - p unused``. The LP plan's integral part, topped up greedily, is the first incumbent.
3. A plan better than the incumbent has ``sum pen < gap = UB - q LB``: options whose penalty reaches the gap are
   removed (exactly, in integers); an item left with one option is fixed.
4. The free items join a list of partial plans one at a time (the items not yet added at their LP option): a partial
   plan is its cost ``dc`` and value ``dv`` relative to the LP plan, and its penalty is ``p dc - q dv`` (every LP
   option maximises its item's ``red``). One is dropped when another no dearer is at least as valuable, when its
   penalties plus ``p`` times the capacity it must leave unused reach the gap, or when the items still to come cannot
   bring it within the budget. A partial plan within the budget is a whole plan: it raises the incumbent and narrows
   the gap. After the last item the incumbent is optimal.

The list is the work. It stays short when the LP bound is tight (distinct scores); ties on the break slope (equal
scores with latency proportional to parameters, say) keep one partial plan per reachable cost in the window the items
to come can still move, thousands per item. So the list is kept in NumPy 64-bit integers whenever every cost, value
and the slope's terms fit (the usual case: latencies in ms, Eq. 4 values), and in Python integers of any size
otherwise, with the same steps; the penalty test is decided in floats where its sign is clear by a wide margin and in
integers where it is not, so every decision stays exact. Two limits bound it, and past either the solver raises
:class:`GacError` naming it and the fix, never an inexact answer: :data:`MAX_STATES` partial plans kept at once
(``GAC_EXACT_MAX_STATES``, memory) and :data:`MAX_WORK` partial plans examined in all (``GAC_EXACT_MAX_WORK``, time:
one kept plan extended by one option; each counts :data:`_PYTHON_WEIGHT` times in Python integers).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from gac.align.solver import upper_hull
from gac.errors import GacError

MAX_STATES_ENV = "GAC_EXACT_MAX_STATES"
MAX_STATES = 2_000_000  # partial plans kept at once (a few hundred MB of Python integers)
MAX_WORK_ENV = "GAC_EXACT_MAX_WORK"
MAX_WORK = 50_000_000  # partial plans examined in all (one kept plan extended by one option): bounds the time

Number = int | float | Fraction


@dataclass
class ExactResult:
    choice: list[int]  # index into each item's original option list
    cost: Fraction  # the plan's exact total cost
    value: Fraction  # its exact total value
    stats: dict = field(default_factory=dict)


def _env_count(name: str, default: int, what: str) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n <= 0:
        raise GacError(f"{name}={raw!r} must be a positive integer (the exact latency solver's limit on {what})")
    return n


def max_states() -> int:
    return _env_count(MAX_STATES_ENV, MAX_STATES, "partial plans kept at once")


def max_work() -> int:
    return _env_count(MAX_WORK_ENV, MAX_WORK, "partial plans examined")


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
    h = 0
    for gv in gain:
        for x in gv[1:]:
            h = math.gcd(h, x)
    if h > 1:  # an exact rescaling: smaller numbers (ties often share a large factor)
        gain = [[x // h for x in gv] for gv in gain]
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
        h = upper_hull(e, v)
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
    # what the items still to come can add to (up) or take from (down) a partial plan's cost
    up_rem, down_rem = [0] * (len(free) + 1), [0] * (len(free) + 1)
    for k in range(len(free) - 1, -1, -1):
        _, i, ok = free[k]
        up_rem[k] = up_rem[k + 1] + max(ext[i][j] for j in ok) - ext[i][lp[i]]
        down_rem[k] = down_rem[k + 1] + ext[i][lp[i]] - min(ext[i][j] for j in ok)
    span_v = sum(max(gain[i][j] for j in ok) - min(gain[i][j] for j in ok) for _, i, ok in free)
    search = _Search(ext, gain, lp, [(i, ok) for _, i, ok in free], up_rem, down_rem, room, p, q, ub, lp_value,
                     lb - lp_value, max_states(), max_work(), n, stats)
    fits = max(up_rem[0] + down_rem[0] + room, span_v, p, q) < _INT64_SAFE
    changes = search.run_int64() if fits else search.run_python()
    stats["search"] = "int64" if fits else "python"
    if changes is not None:  # a plan better than the first incumbent: the LP plan with these changes
        choice = list(lp)
        for i, j in changes:
            choice[i] = j
    return finish(choice)


_PYTHON_WEIGHT = 16  # a partial plan in Python integers costs 10-20 times one in NumPy: it counts 16 times
_INT64_SAFE = 2**61  # every partial sum of costs and values, and the slope's terms, below this: int64 cannot overflow


@dataclass
class _Search:
    """Step 4: the list of partial plans over the free items, relative to the LP plan. A partial plan is its cost
    ``dc`` and value ``dv`` relative to the LP plan (the items not yet added at their LP option); its penalty is
    ``p dc - q dv`` (every LP option maximises its item's reduced value). :meth:`run_int64` is the same search on
    NumPy arrays, taken when every number fits 64 bits (ties: thousands of partial plans per item); :meth:`run_python`
    keeps Python integers of any size."""

    ext: list
    gain: list
    lp: list
    free: list  # (item, allowed options) in the order they join
    up_rem: list
    down_rem: list
    room: int
    p: int
    q: int
    ub: int
    lp_value: int
    better: int  # a whole plan must be worth more than this (relative to the LP plan) to improve the incumbent
    limit: int
    work_limit: int
    n: int
    stats: dict

    def _gap(self) -> int:
        return self.ub - self.q * (self.lp_value + self.better)

    def _count(self, work: int, states: int, k: int) -> int:
        self.stats["states_max"] = max(self.stats["states_max"], states)
        if states > self.limit:
            raise GacError(f"the exact latency solver would keep more than {self.limit:,} partial plans "
                           f"({len(self.free):,} of {self.n:,} targets stay free after the exact reduction); this "
                           f"comes from ties: equal scores with latencies proportional to parameters; give the targets "
                           f"distinct scores or a narrower candidate window, or raise the limit with "
                           f"{MAX_STATES_ENV}=<count> if the memory is there")
        if work > self.work_limit:
            raise GacError(f"the exact latency solver would examine more than {self.work_limit:,} partial plans "
                           f"(past {k:,} of the {len(self.free):,} targets the exact reduction leaves free, of "
                           f"{self.n:,}); ties this wide (equal scores with latencies proportional to parameters, "
                           f"many targets, wide windows) take too long to prove; give the targets distinct scores or "
                           f"a narrower candidate window (window 1-4), or raise the limit with {MAX_WORK_ENV}=<count> "
                           f"if the time is there")
        self.stats["work"] = work
        return work

    def run_python(self) -> list[tuple[int, int]] | None:
        ext, gain = self.ext, self.gain
        p, q, room = self.p, self.q, self.room
        gap = self._gap()
        states = [(0, 0, 0, ())]  # (cost, -value, penalty, path of (item, option) changes)
        best_state, work = None, 0
        for k, (i, ok) in enumerate(self.free):
            e0, g0 = ext[i][self.lp[i]], gain[i][self.lp[i]]
            up, down = self.up_rem[k + 1], self.down_rem[k + 1]
            work = self._count(work + _PYTHON_WEIGHT * len(states) * len(ok), len(states), k)
            cand = []
            for j in ok:
                mc, mv = ext[i][j] - e0, gain[i][j] - g0
                mp = p * mc - q * mv
                most = room + down - mc  # a dearer partial plan cannot be brought within the budget
                if j == self.lp[i]:
                    cand += [s for s in states if s[0] <= most]
                else:
                    cand += [(dc + mc, ndv - mv, pen + mp, (i, j, node)) for dc, ndv, pen, node in states
                             if dc <= most and pen + mp < gap]
            cand.sort(key=lambda s: (s[0], s[1]))
            states = []
            top = None
            for st in cand:
                dc, ndv, pen, node = st
                if top is not None and ndv >= top:
                    continue  # dominated: a no dearer plan is at least as valuable
                top = ndv
                if pen >= gap or (dc < room - up and pen + p * (room - up - dc) >= gap):
                    continue  # its penalties and the capacity it must leave unused reach the gap
                if dc <= room and -ndv > self.better:  # a whole plan within the budget, better than the incumbent
                    self.better = -ndv
                    gap = self._gap()
                    best_state = node
                states.append(st)
            if not states:
                break
        if best_state is None:
            return None
        out, node = [], best_state
        while node:
            i, j, node = node
            out.append((i, j))
        return out

    def run_int64(self) -> list[tuple[int, int]] | None:
        ext, gain = self.ext, self.gain
        p, q, room = self.p, self.q, self.room
        pf, qf = float(p), float(q)
        dc = np.zeros(1, np.int64)
        dv = np.zeros(1, np.int64)
        parents: list[tuple[np.ndarray, np.ndarray]] = []  # per item joined: each kept plan's parent and option
        best, work = None, 0  # best: (item index in free, parent, option) of the incumbent's last change
        for k, (i, ok) in enumerate(self.free):
            e0, g0 = ext[i][self.lp[i]], gain[i][self.lp[i]]
            up, down = self.up_rem[k + 1], self.down_rem[k + 1]
            work = self._count(work + len(dc) * len(ok), len(dc), k)
            blocks_c, blocks_v, blocks_p, blocks_o = [], [], [], []
            arange = np.arange(len(dc), dtype=np.int64)
            for j in ok:
                c = dc + (ext[i][j] - e0)
                keep = c <= room + down  # a dearer partial plan cannot be brought within the budget
                blocks_c.append(c[keep])
                blocks_v.append(dv[keep] + (gain[i][j] - g0))
                blocks_p.append(arange[keep])
                blocks_o.append(np.full(int(keep.sum()), j, np.int64))
            c, v = np.concatenate(blocks_c), np.concatenate(blocks_v)
            par, opt = np.concatenate(blocks_p), np.concatenate(blocks_o)
            order = np.lexsort((-v, c))  # by cost, the more valuable first
            c, v, par, opt = c[order], v[order], par[order], opt[order]
            if len(v):  # dominated: a no dearer plan is at least as valuable
                prev = np.empty_like(v)
                prev[0] = np.iinfo(np.int64).min
                np.maximum.accumulate(v[:-1], out=prev[1:])
                keep = v > prev
                c, v, par, opt = c[keep], v[keep], par[keep], opt[keep]
            whole = np.flatnonzero(c <= room)  # whole plans within the budget (the items to come at their LP option)
            if len(whole):
                w = whole[np.argmax(v[whole])]
                if int(v[w]) > self.better:
                    self.better = int(v[w])
                    best = (k, int(par[w]), int(opt[w]))
            gap = self._gap()
            # the capacity a plan must leave unused: below room - up even the items to come cannot fill it
            t = (p * (room - up) - gap) // q  # dv <= t: penalties plus the unused capacity reach the gap
            keep = ~((c < room - up) & (v <= max(min(t, 2**62), -(2**62))))
            keep &= self._below_gap(c, v, gap, pf, qf)
            c, v, par, opt = c[keep], v[keep], par[keep], opt[keep]
            parents.append((par.astype(np.int32), opt.astype(np.int32)))
            dc, dv = c, v
            if not len(dc):
                break
        if best is None:
            return None
        out = []
        k, par, j = best
        while k >= 0:  # back along the parents: the item joined at k took option j
            i = self.free[k][0]
            if j != self.lp[i]:
                out.append((i, j))
            k -= 1
            if k >= 0:
                par, j = int(parents[k][0][par]), int(parents[k][1][par])
        return out

    def _below_gap(self, c: np.ndarray, v: np.ndarray, gap: int, pf: float, qf: float) -> np.ndarray:
        """``p c - q v < gap``, exactly: in floats where the sign is clear by a wide margin, else in integers."""
        a, b = pf * c.astype(np.float64), qf * v.astype(np.float64)
        g = float(gap)
        x = a - b - g
        margin = (np.abs(a) + np.abs(b) + abs(g)) * 2.0**-46 + 1.0
        ok = x < -margin
        unsure = np.flatnonzero(np.abs(x) <= margin)
        p, q = self.p, self.q
        for s in unsure:
            ok[s] = p * int(c[s]) - q * int(v[s]) < gap
        return ok


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
