"""Two alignment rules the GAC authors' own scripts ran, offered as labelled strategies (never a default).

``authors_dp``: the "GAC DP" of ``scripts/asvd_gac_experiment.py`` (``JihaoXin/GAC``), which is *not* the paper's
Eq. 4 (gac's ``gac`` strategy is). Per target ``i`` with unconstrained rank ``d*_i``, score ``f_i``, and cost
``c_i = params_per_dim`` per rank:

* candidates: the multiples of ``unit`` within ``radius`` (3) units of ``round(d*_i / unit) * unit`` (Python's
  half-to-even ``round``), in ``[unit, d_max_i]``; none: ``max(unit, min(d_max_i, round(...)))``;
* value ``f_i * (r - d*_i)``, in *rank* units (Eq. 4 values parameters, ``f_i c_i (r - d*_i)``);
* the budget quantised to cells of ``q = unit * min_i c_i`` parameters, each candidate's cost floored to whole cells
  (``r c_i // q``); a DP over exact cell counts; the answer is the largest reachable cell at or below ``budget // q``
  (searched within 10 cells, then anywhere), whatever its value;
* then one pass over the targets by ascending score stepping each down by ``unit`` while the exact cost is over the
  budget, and one pass by descending score stepping each up by ``unit`` while it fits (up to ``d_max``);
* above 500,000 cells, :func:`authors_round_to_n` instead.

Ties in the sorts keep the authors' order (their dictionary holds the targets in reverse order after the backtrack).
**Where it departs from the authors** (gac's hard budget): the authors' single down pass can leave the plan over
budget (the floored cell costs under-count); gac repeats the same pass until the budget holds and says so in the
plan's notes and ``stats["budget_repair_steps"]``; the authors' ranks are returned unchanged whenever they fit.
A target whose d* is dense (ASVD's sensitivity search) stays dense, its cost taken from the budget first; the dense
option is never a candidate (the authors' procedure has none). The authors' ``max_rank = min(out, in)`` is the
target's ``d_max`` here (for ``stable_rank_svd`` units the largest multiple of ``unit`` in ``min(out, in)``, the same
candidates). gac's candidate window and hardware filter do not apply: the window is part of the procedure.

``authors_round`` (:func:`authors_round_to_n`): the scripts' "aligned_8" baseline and the DP's fallback: each rank to the nearest multiple
(half to even, at least ``unit``, at most ``d_max``), then round-robin passes over the targets by ascending score
stepping down by ``unit`` until the budget holds, then passes by descending score stepping up while it fits. (gac's
``rebalance`` is the same idea with a heap: it always steps the currently least important target.)

``round_to``: LLM-Pruner / Torch-Pruning's ``round_to`` as LLM-Pruner ships it (``metapruner.py``): the number of
*pruned* channels is rounded down to a multiple of the unit, ``n_pruned -= n_pruned % unit`` with
``n_pruned = d_max - floor(d*)``, so the kept width ``d_max - n_pruned`` rounds *up* (to a multiple of the unit
when ``d_max`` is one); the budget is not enforced. This is what the authors' LLM-Pruner "GAC" bars read
(``pruned_r8``). gac's ``round_down`` is the opposite direction; gac's ``round_up`` (``ceil(d* / unit) * unit``)
gives the same widths except when ``floor(d*)`` is a multiple of the unit and d* is not whole, or ``d_max`` is not
a multiple of the unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gac.align.targets import Target
from gac.errors import GacError, InfeasibleBudgetError

AUTHORS_UNIT = 8
AUTHORS_RADIUS = 3
DP_CELL_LIMIT = 500_000  # the authors' switch to the greedy rule
_BEST_SPAN = 10  # the authors search the best cell this close to the budget first


def _cap(t: Target, unit: int) -> int:
    if t.d_max is None:
        raise GacError(f"target {t.name!r} has no d_max; the authors' rules bound every rank by the weight's own")
    return t.d_max


def authors_window(t: Target, unit: int = AUTHORS_UNIT, radius: int = AUTHORS_RADIUS) -> list[int]:
    """The authors' candidates of one target (module docstring)."""
    top = _cap(t, unit)
    centre = round(t.d_star / unit) * unit
    cands = [centre + o * unit for o in range(-radius, radius + 1) if unit <= centre + o * unit <= top]
    return cands or [max(unit, min(top, centre))]


def _cost(targets, dims) -> int:
    return sum(t.params_per_dim * d for t, d in zip(targets, dims))


def authors_round_to_n(targets: Sequence[Target], budget: int, unit: int = AUTHORS_UNIT) -> list[int]:
    """The authors' ``strategy_round_to_n`` over factorised targets (module docstring)."""
    targets = list(targets)
    dims = [min(max(unit, round(t.d_star / unit) * unit), _cap(t, unit)) for t in targets]
    total = _cost(targets, dims)
    asc = sorted(range(len(targets)), key=lambda i: targets[i].score)
    desc = list(reversed(asc))
    while total > budget:
        reduced = False
        for i in asc:
            if dims[i] > unit:
                dims[i] -= unit
                total -= unit * targets[i].params_per_dim
                reduced = True
                if total <= budget:
                    break
        if not reduced:
            break
    while True:
        added = False
        for i in desc:
            step = unit * targets[i].params_per_dim
            if dims[i] + unit <= _cap(targets[i], unit) and total + step <= budget:
                dims[i] += unit
                total += step
                added = True
        if not added:
            break
    return dims


def authors_dp_dims(targets: Sequence[Target], budget: int, unit: int = AUTHORS_UNIT,
                    radius: int = AUTHORS_RADIUS) -> tuple[list[int], dict]:
    """The authors' ``strategy_gac_dp`` over factorised targets, *without* gac's budget repair.

    Returns ``(dims, info)``; ``info["over_budget"]`` says whether the authors' result exceeds ``budget``."""
    targets = list(targets)
    if not targets:
        raise GacError("no targets to align")
    cands = [authors_window(t, unit, radius) for t in targets]
    q = unit * min(t.params_per_dim for t in targets)
    B = budget // q + 2
    if B > DP_CELL_LIMIT:
        dims = authors_round_to_n(targets, budget, unit)
        return dims, {"path": "greedy", "cells": B, "over_budget": _cost(targets, dims) > budget}
    n = len(targets)
    dp = np.full(B + 1, -np.inf)
    dp[0] = 0.0
    choice = np.zeros((n, B + 1), dtype=np.int64)  # 0: none, else the chosen rank
    for i, (t, cs) in enumerate(zip(targets, cands)):
        new = np.full(B + 1, -np.inf)
        for c in cs:
            val = t.score * (c - t.d_star)
            cu = (c * t.params_per_dim) // q
            if cu > B:
                continue
            cand = np.full(B + 1, -np.inf)
            cand[cu:] = dp[: B + 1 - cu] + val
            better = cand > new  # strict: the first candidate keeps a tie, as in the authors' loop
            new[better] = cand[better]
            choice[i, better] = c
        dp = new
    max_b = budget // q
    reach = np.isfinite(dp)
    best = next((b for b in range(min(max_b, B), max(0, max_b - _BEST_SPAN), -1) if reach[b]), None)
    if best is None:
        best = next((b for b in range(min(max_b, B), -1, -1) if reach[b]), None)
    if best is None:
        dims = authors_round_to_n(targets, budget, unit)
        return dims, {"path": "greedy", "cells": B, "over_budget": _cost(targets, dims) > budget}
    dims = [0] * n
    b = best
    for i in range(n - 1, -1, -1):
        c = int(choice[i, b]) or cands[i][len(cands[i]) // 2]
        dims[i] = c
        b -= (c * targets[i].params_per_dim) // q
    # the authors' dictionary holds the targets in backtrack (reverse) order; the stable sorts below keep it
    back = list(range(n - 1, -1, -1))
    actual = _cost(targets, dims)
    steps_down = 0
    if actual > budget:
        for i in sorted(back, key=lambda i: targets[i].score):
            if actual <= budget:
                break
            if dims[i] > unit:
                dims[i] -= unit
                actual -= unit * targets[i].params_per_dim
                steps_down += 1
    over = actual > budget
    info = {"path": "dp", "cells": B, "best_cell": best, "steps_down": steps_down, "over_budget": over}
    if over:
        return dims, info  # the authors' fill pass adds nothing while over budget
    _fill(targets, dims, budget, unit, back)
    return dims, info


def _fill(targets, dims, budget, unit, back) -> None:
    actual = _cost(targets, dims)
    for i in sorted(back, key=lambda i: targets[i].score, reverse=True):
        step = unit * targets[i].params_per_dim
        if dims[i] + unit <= _cap(targets[i], unit) and actual + step <= budget:
            dims[i] += unit
            actual += step


def authors_dp(targets, cands, budget, unit: int = AUTHORS_UNIT, radius: int = AUTHORS_RADIUS):
    """The ``authors_dp`` strategy (gac's strategy signature; ``cands`` is not used, see the module docstring)."""
    targets = list(targets)
    dense = [t.dense_star for t in targets]
    fixed = sum(t.dense_params for t, k in zip(targets, dense) if k)
    free = [t for t, k in zip(targets, dense) if not k]
    notes = ["authors' DP (JihaoXin/GAC asvd_gac_experiment.py): value score x (rank - d*) in rank units, "
             f"+-{radius} units of {unit} around the rounded d*, budget in cells of {unit} x the smallest (out + in)"]
    stats: dict = {}
    dims_free: list[int] = []
    if free:
        rest = budget - fixed
        need = sum(t.params_per_dim * unit for t in free)
        if rest < need:
            raise InfeasibleBudgetError(budget, fixed + need, f"every factorised target at {unit}, the dense ones dense")
        dims_free, info = authors_dp_dims(free, rest, unit, radius)
        stats.update(info)
        if info["path"] == "greedy":
            notes.append(f"the DP would need {info['cells']:,} cells (> {DP_CELL_LIMIT:,}): the authors' greedy rule ran")
        repair = 0
        if _cost(free, dims_free) > rest:
            back = list(range(len(free) - 1, -1, -1))
            order = sorted(back, key=lambda i: free[i].score)
            over = _cost(free, dims_free) - rest
            while _cost(free, dims_free) > rest:
                moved = False
                for i in order:
                    if _cost(free, dims_free) <= rest:
                        break
                    if dims_free[i] > unit:
                        dims_free[i] -= unit
                        repair += 1
                        moved = True
                if not moved:
                    raise InfeasibleBudgetError(budget, fixed + need, f"every factorised target at {unit}")
            _fill(free, dims_free, rest, unit, back)
            notes.append(f"the authors' procedure ended {over:,} parameters over budget; gac stepped {repair} more "
                         f"targets down by {unit} (least important first) to hold it")
        stats["budget_repair_steps"] = repair
    it = iter(dims_free)
    dims = [t.dense_dim if k else next(it) for t, k in zip(targets, dense)]
    return dims, notes, stats


def authors_round(targets, cands, budget, unit: int = AUTHORS_UNIT):
    """The ``authors_round`` strategy: :func:`authors_round_to_n` (the scripts' "aligned_8" row); dense d* stay dense,
    their cost taken from the budget first. It holds the budget whenever every factorised target at ``unit`` does."""
    targets = list(targets)
    dense = [t.dense_star for t in targets]
    fixed = sum(t.dense_params for t, k in zip(targets, dense) if k)
    free = [t for t, k in zip(targets, dense) if not k]
    need = sum(t.params_per_dim * unit for t in free)
    if free and budget - fixed < need:
        raise InfeasibleBudgetError(budget, fixed + need, f"every factorised target at {unit}, the dense ones dense")
    it = iter(authors_round_to_n(free, budget - fixed, unit) if free else [])
    dims = [t.dense_dim if k else next(it) for t, k in zip(targets, dense)]
    return dims, [f"the GAC authors' round_to_n: nearest multiple of {unit} (half to even), then round-robin steps "
                  f"by score"], {}


def round_to(targets, cands, budget, unit: int = AUTHORS_UNIT):
    """LLM-Pruner's ``round_to`` (module docstring): kept width ``d_max - (n - n % unit)``, ``n = d_max - floor(d*)``."""
    dims = []
    for t in targets:
        top = _cap(t, unit)
        if t.dense_star:
            dims.append(t.dense_dim)
            continue
        n_pruned = top - math.floor(t.d_star)
        dims.append(top - (n_pruned - n_pruned % unit))
    return dims, [f"peer rule (LLM-Pruner round_to={unit}): the pruned count rounded down to a multiple of {unit} "
                  f"(the kept width up); the budget is not enforced"], {}
