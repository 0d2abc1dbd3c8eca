"""Strategies that turn an allocation (targets with d* and scores) into integer dimensions under a budget.

``gac`` is the paper's Eq. 4 solved exactly. The others are the baselines peers use (docs/algorithm.md, "Strategies"):

=================  ==========================================================  ==================================
strategy           rule                                                        budget
=================  ==========================================================  ==================================
``unaligned``      floor(d*), then +1 towards ceil(d*) for the most important   held (the compressor's own output)
``round_nearest``  nearest candidate (ties up) — PaLU's rounding               may exceed: reported, noted
``round_up``       smallest candidate >= d* — ASVD's ``rank_align``            may exceed: reported, noted
``round_down``     largest candidate <= d* — Torch-Pruning, SliceGPT           held unless C_i has nothing <= d*
``rebalance``      round_nearest, step the least important down until the      held
                   budget holds, then the most important up while it fits
                   (the GAC authors' own baseline)
``gac``            exact multiple-choice knapsack over the candidate sets      held, exactly optimal
=================  ==========================================================  ==================================

The GAC authors' own procedures (:mod:`gac.align.authors_dp`; labelled options for reproducing their Table 5, never a
default): ``authors_dp`` (their "GAC DP": value in rank units, +-3 units around the rounded d*, a quantised budget;
budget held), ``authors_round`` (their "aligned_8" baseline; budget held) and ``round_to`` (LLM-Pruner's
``round_to``: the pruned count rounded down to the unit; may exceed). Their candidates are their own: gac's window
and hardware filter do not apply, and the alignment ``unit`` is passed to them.

Dense options (low-rank targets that may stay unfactorised, :mod:`gac.align.targets`): ``unaligned`` keeps the
compressor's choice (a dense d* stays dense, a factorised one is floored and topped up as above; dense targets are
never reduced). The peer rounding rules (``round_nearest``, ``round_up``, ``round_down``) round only: a dense d* stays
dense (there is nothing to align: its dimensions are the model's own) and a factorised d* is rounded among the rank
candidates, never to the dense option. ``rebalance`` steps through each target's candidate list ordered by cost, so
its down steps may factorise a dense target and its up steps may make a target dense. ``gac`` puts the dense cost
``out * in`` in the knapsack beside the rank candidates (Eq. 4's value ``s_i (params_i(d) - params_i(d*_i))`` with
``params_i(dense) = out * in``) and chooses exactly.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence

from gac import registry
from gac.align.authors_dp import authors_dp, authors_round, round_to
from gac.align.candidates import (
    DEFAULT_UNIT,
    DEFAULT_WINDOW,
    CandidateFilter,
    candidate_sets,
    check_unit,
    check_window,
)
from gac.align.plan import Plan, make_plan
from gac.align.solver import solve_mckp
from gac.align.targets import Target, check_unique
from gac.errors import GacError, InfeasibleBudgetError, unknown_name

Strategy = Callable[[Sequence[Target], Sequence[tuple[int, ...]], int], tuple[list[int], list[str], dict]]


def _unaligned(targets, cands, budget):
    dense = [t.dense_star for t in targets]
    dims = [t.dense_dim if k else max(1, math.floor(t.d_star)) for t, k in zip(targets, dense)]
    dims = [min(d, t.d_max) if t.d_max and not k else d for t, d, k in zip(targets, dims, dense)]
    used = sum(t.params(d) for t, d in zip(targets, dims))
    min_budget = sum(t.dense_params if k else t.params(1) for t, k in zip(targets, dense))
    if min_budget > budget:
        raise InfeasibleBudgetError(budget, min_budget, "every factorised target at dimension 1, the dense ones dense")
    notes = []
    if used > budget:  # floor(d*) does not fit: the least important give up one dimension at a time
        heap = [(t.score, i) for i, t in enumerate(targets) if dims[i] > 1 and not dense[i]]
        heapq.heapify(heap)
        while used > budget:
            _, i = heapq.heappop(heap)
            dims[i] -= 1
            used -= targets[i].params_per_dim
            if dims[i] > 1:
                heapq.heappush(heap, (targets[i].score, i))
        notes.append("floor(d*) exceeded the budget; the least important targets were reduced below floor(d*)")
    for i in sorted(range(len(targets)), key=lambda i: (-targets[i].score, i)):
        t = targets[i]
        if dense[i]:
            continue
        up = math.ceil(t.d_star)
        if t.d_max:
            up = min(up, t.d_max)
        while dims[i] < up and used + t.params_per_dim <= budget:
            dims[i] += 1
            used += t.params_per_dim
    return dims, notes, {}


def _ranks(t: Target, cs: tuple[int, ...]) -> tuple[int, ...]:
    """The rank candidates (the dense option excluded); a dense d* keeps only the dense option to round to."""
    if t.dense_star:
        return (t.dense_dim,)
    ranks = tuple(c for c in cs if not t.is_dense(c))
    return ranks or cs  # only the dense option is left (a hardware profile removed every rank)


def _nearest(t: Target, cs: tuple[int, ...]) -> int:
    return min(_ranks(t, cs), key=lambda c: (abs(c - t.d_star), -c))


def _round_nearest(targets, cands, budget):
    dims = [_nearest(t, cs) for t, cs in zip(targets, cands)]
    return dims, ["peer rule (PaLU): each d* rounded to its nearest candidate; the budget is not enforced"], {}


def _round_up(targets, cands, budget):
    dims = []
    for t, cs in zip(targets, cands):
        rs = _ranks(t, cs)
        dims.append(next((c for c in rs if c >= t.d_star), rs[-1]))
    return dims, ["peer rule (ASVD rank_align): each d* rounded up to a candidate; the budget is not enforced"], {}


def _round_down(targets, cands, budget):
    dims = []
    for t, cs in zip(targets, cands):
        rs = _ranks(t, cs)
        dims.append(next((c for c in reversed(rs) if c <= t.d_star), rs[0]))
    return dims, ["peer rule (Torch-Pruning round_to, SliceGPT): each d* rounded down to a candidate"], {}


def _rebalance(targets, cands, budget):
    idx = [cs.index(_nearest(t, cs)) for t, cs in zip(targets, cands)]
    used = sum(t.params(cs[k]) for t, cs, k in zip(targets, cands, idx))
    down_steps = up_steps = 0
    heap = [(t.score, i) for i, t in enumerate(targets) if idx[i] > 0]
    heapq.heapify(heap)
    while used > budget:
        _, i = heapq.heappop(heap)  # never empty: feasibility was checked by the caller
        cs = cands[i]
        used -= targets[i].params(cs[idx[i]]) - targets[i].params(cs[idx[i] - 1])
        idx[i] -= 1
        down_steps += 1
        if idx[i] > 0:
            heapq.heappush(heap, (targets[i].score, i))
    for i in sorted(range(len(targets)), key=lambda i: (-targets[i].score, i)):
        cs, t = cands[i], targets[i]
        while idx[i] + 1 < len(cs) and used + t.params(cs[idx[i] + 1]) - t.params(cs[idx[i]]) <= budget:
            used += t.params(cs[idx[i] + 1]) - t.params(cs[idx[i]])
            idx[i] += 1
            up_steps += 1
    dims = [cs[k] for cs, k in zip(cands, idx)]
    return dims, [], {"steps_down": down_steps, "steps_up": up_steps}


def _gac(targets, cands, budget):
    costs = [[t.params(d) for d in cs] for t, cs in zip(targets, cands)]
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(targets, cands)]
    res = solve_mckp(costs, values, budget)
    dims = [cs[j] for cs, j in zip(cands, res.choice)]
    return dims, [], {"solver": res.stats}


STRATEGIES: dict[str, Strategy] = registry.STRATEGIES.bind({
    "unaligned": _unaligned,
    "round_nearest": _round_nearest,
    "round_up": _round_up,
    "round_down": _round_down,
    "rebalance": _rebalance,
    "gac": _gac,
    "authors_dp": authors_dp,
    "authors_round": authors_round,
    "round_to": round_to,
})
# Strategies whose documented peer behaviour ignores the budget (they report budget_met instead).
BUDGET_FREE = frozenset({"round_nearest", "round_up", "round_down", "round_to"})
#: strategies that choose among their own candidates (the GAC authors' procedures): called with the alignment
#: ``unit``; gac's candidate window and hardware filter do not apply, and they check the budget's feasibility themselves
OWN_CANDIDATES = frozenset({"authors_dp", "authors_round", "round_to"})


def check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise GacError(f"budget must be a positive integer number of parameters, got {budget!r}")
    return budget


def _n(x: int) -> str:
    return f"{x:,}" if x < 10**21 else f"{float(x):.3g}"


_MAX_PARAMS = 2**62  # costs are int64 in the solver; every model's parameter count is far below


def check_magnitudes(targets: Sequence[Target], cands) -> None:
    """Parameter counts must fit the solver's int64 (2**62 with room for sums), and Eq. 4's values
    ``s_i * params_i(d)`` and their sum must stay finite in floating point (a score of 1e308 times a million
    parameters is inf, and an inf objective ranks nothing)."""
    costs = [max(t.params(d) for d in cs) for t, cs in zip(targets, cands)]
    i = max(range(len(costs)), key=costs.__getitem__)
    if costs[i] >= _MAX_PARAMS or sum(costs) >= _MAX_PARAMS:
        t = targets[i]
        raise GacError(f"parameter counts too large: target {t.name!r} reaches {_n(costs[i])} parameters (params_per_dim "
                       f"{_n(t.params_per_dim)} x dimension {_n(max(cands[i]))}), the targets together {_n(sum(costs))}, "
                       f"beyond the 2**62 that exact integer accounting allows; check params_per_dim (the parameters one "
                       f"unit of dimension adds: out + in for a low-rank weight), d_star and d_max")
    worst, total = None, 0.0
    for t, cs in zip(targets, cands):
        v = t.score * t.params_per_dim * max(max(cs), t.d_star)
        if not math.isfinite(v) or v > 1e300:
            worst = (t, v)
            break
        total += v
    if worst is None and math.isfinite(total) and total <= 1e300:
        return
    name = worst[0].name if worst else max(targets, key=lambda t: t.score).name
    score = worst[0].score if worst else max(t.score for t in targets)
    raise GacError(f"scores too large: target {name!r} has score {score:g}, and score x parameters overflows floating "
                   f"point; only the scores' ratios matter, so divide them all by a common factor (e.g. the largest)")


def align(
    targets: Sequence[Target],
    budget: int,
    strategy: str = "gac",
    unit: int = DEFAULT_UNIT,
    window: int = DEFAULT_WINDOW,
    candidate_filter: CandidateFilter | None = None,
) -> Plan:
    """Choose one dimension per target with ``strategy`` under ``budget`` total parameters.

    Raises :class:`GacError` for bad input and :class:`InfeasibleBudgetError` (with the minimum feasible
    budget) when no plan from the candidate sets fits.
    """
    if strategy not in STRATEGIES:
        raise unknown_name("strategy", strategy, STRATEGIES)
    budget, unit, window = check_budget(budget), check_unit(unit), check_window(window)
    targets = list(targets)
    if not targets:
        raise GacError("no targets to align; the allocation has an empty target list")
    check_unique(targets)
    t0 = time.perf_counter()
    cands = candidate_sets(targets, unit, window, candidate_filter)
    check_magnitudes(targets, cands)
    if strategy in OWN_CANDIDATES:
        dims, notes, stats = STRATEGIES[strategy](targets, cands, budget, unit=unit)
        if candidate_filter is not None:
            notes = [*notes, "the hardware profile's candidate filter does not apply to this strategy (its "
                             "candidates are the procedure's own)"]
    else:
        if strategy != "unaligned":
            min_budget = sum(t.params(cs[0]) for t, cs in zip(targets, cands))
            if min_budget > budget and strategy not in BUDGET_FREE:
                raise InfeasibleBudgetError(budget, min_budget, "every target at its smallest candidate")
        dims, notes, stats = STRATEGIES[strategy](targets, cands, budget)
    stats["time_s"] = time.perf_counter() - t0
    plan = make_plan(strategy, targets, dims, budget, unit, notes, stats)
    if not plan.budget_met and strategy not in BUDGET_FREE:  # a bug, never a silent overshoot
        raise AssertionError(f"strategy {strategy} exceeded the budget: {plan.params} > {budget}")
    if not plan.budget_met:
        plan.notes.append(f"over budget by {plan.params - budget:,} parameters")
    return plan
