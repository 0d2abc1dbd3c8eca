"""Unconstrained allocation (paper Eq. 2): importance scores -> continuous dimensions d*_i under the budget B.

Eq. 2 as written is a linear program whose optimum puts the whole budget on the single most important weight, so
every compressor uses a smoothing rule instead. gac's rule (``"proportional"``, PaLU's Fisher-proportional rank rule
generalised to any proxy and any target shape):

    keep_i  = clip(lambda * (s_i / s_bar) ** power,  lo,  hi_i)         (fraction of W_i's dense parameters kept)
    d*_i    = keep_i * |W_i| / params_per_dim_i

* ``s_i`` is the proxy's per-parameter importance, ``s_bar`` the parameter-weighted mean over all targets;
* ``power`` tempers the spread: ``power = 1`` is PaLU's proportional rule, ``power = 0`` the uniform allocation
  (same ratio everywhere, what ASVD/LLM-Pruner do without a sensitivity search). gac's default is 0.5 (square
  root): gradient and Fisher scores span several orders of magnitude across weights, and with ``power = 1`` most
  targets end at a bound (the floor or d_max) instead of at a score-driven d*;
* ``hi_i = params_per_dim_i * d_max_i / |W_i|`` is the most a target can keep (for low-rank targets the
  break-even rank, see :mod:`gac.compression.compressors.base`); ``lo = min_keep * B / |W|`` (default a quarter of the uniform
  share) stops a low-scored weight from being wiped out;
* ``lambda`` is found by bisection so that ``sum_i params_per_dim_i * d*_i = B`` (to float precision); when even
  ``hi`` everywhere spends less than B, every target sits at its ``d_max`` and the plan is under budget.

More important weights (higher s_i) keep a larger fraction; equal scores give the uniform allocation.

``"uniform"`` (``power = 0``) keeps the same fraction of every target: LLM-Pruner's reference default (each pruned
layer loses the same share of its MLP channels, ``ch_sparsity`` without ``--global_pruning``).

``"fisher_uniform"`` is PaLU's default rank search (``rank_search.py``, ``--search_method fisher_uniform``): one score
per *projection* (the parameter-weighted mean of its head groups' scores; with PaLU's proxy ``fisher_rms`` the mean
over the projection's weights of ``sqrt(mean g^2)``), the projection's total rank proportional to that score,
capped at its full rank, and split evenly over its head groups:

    r_p = lambda * F_p,   d*_g = min(r_p / G_p, d_max_g)   for each of the G_p groups g of projection p

with ``lambda`` found by bisection so that the parameters ``sum_g params_per_dim_g * d*_g`` equal B (PaLU states its
target in ranks, ``param_ratio_target * sum of full ranks``; for projections of one shape the two are the same
constraint). PaLU then rounds each group's rank to the nearest multiple of 32, and never below 32: gac keeps that
floor in d* (``d*_g >= min(32, d_max_g)``, or, when the budget cannot give every group that much, the largest
uniform floor it can), so no group is starved below what the reference would keep and every d* stays at or above
the alignment unit; the rounding itself is an alignment rule (``round_nearest`` with ``unit=32``).

``"sensitivity"`` is ASVD's own search: the calibration perplexity of the model with *one* target truncated to each
kept fraction of a grid (:func:`sensitivity_table`), then a bisection on a perplexity threshold: each target keeps
the smallest grid fraction whose perplexity stays under the threshold, the threshold chosen as the lowest whose
allocation fits B. The chosen fractions are then scaled (same clip rule, ``power = 1`` on the chosen fractions) to
spend B exactly, and each target's per-parameter score for the aligned step (Eq. 4) is its perplexity increase per
removed parameter, averaged over the grid.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from gac.errors import GacError, InfeasibleBudgetError

log = logging.getLogger(__name__)

ALLOCATIONS = ("proportional", "uniform", "sensitivity", "fisher_uniform")
DEFAULT = "default"  # the compressor's own rule (Compressor.default_allocation): what its reference does
ALLOCATION_CHOICES = (DEFAULT, *ALLOCATIONS)


def resolve_allocation(name: str | None, compressor) -> str:
    """``None`` / ``"default"`` -> the compressor's own rule; any other name must be one of :data:`ALLOCATIONS`."""
    from gac.errors import unknown_name

    if name is None or name == DEFAULT:
        return compressor.default_allocation
    if name not in ALLOCATIONS:
        raise unknown_name("allocation", str(name), ALLOCATION_CHOICES)
    return name
SENSITIVITY_GRID = (0.2, 0.4, 0.6, 0.8)


def proportional_allocation(
    dense: Sequence[int],
    params_per_dim: Sequence[int],
    d_max: Sequence[int],
    scores: Sequence[float],
    budget: int,
    power: float = 0.5,
    min_keep: float = 0.25,
    weights: Sequence[float] | None = None,
) -> list[float]:
    """Continuous d*_i (see module docstring). ``weights`` replaces ``(s_i/s_bar)**power`` when given."""
    n = len(dense)
    if not (len(params_per_dim) == len(d_max) == len(scores) == n) or n == 0:
        raise GacError("allocation needs one dense size, params_per_dim, d_max and score per target (and >= 1 target)")
    if not math.isfinite(power) or power < 0:
        raise GacError(f"allocation power must be a finite number >= 0, got {power}")
    for s in scores:
        if not math.isfinite(s) or s < 0:
            raise GacError(f"allocation got a non-finite or negative score ({s}); scores must be finite and >= 0")
    total = float(sum(dense))
    hi = [p * dm / w for p, dm, w in zip(params_per_dim, d_max, dense)]
    cap = sum(h * w for h, w in zip(hi, dense))
    if budget >= cap:
        log.info("budget %d >= the most the compressed weights can hold (%d): every target at d_max", budget, int(cap))
        return [float(dm) for dm in d_max]
    min_params = sum(params_per_dim)  # every target at d = 1
    if budget < min_params:
        raise InfeasibleBudgetError(budget, min_params, "every target at dimension 1")
    lo_frac = min_keep * budget / total
    lo = [max(min(lo_frac, h), p / w) for h, p, w in zip(hi, params_per_dim, dense)]  # at least d = 1
    if weights is None:
        sbar = math.fsum(s * w for s, w in zip(scores, dense)) / total
        weights = [1.0] * n if sbar <= 0 or power == 0 else [(s / sbar) ** power for s in scores]
    if sum(f * w for f, w in zip(lo, dense)) > budget:  # the floor alone overspends: drop it to d = 1
        lo = [p / w for p, w in zip(params_per_dim, dense)]

    def spend(lam):
        return math.fsum(min(max(lam * x, f), h) * w for x, f, h, w in zip(weights, lo, hi, dense))

    a, b = 0.0, 1.0
    while spend(b) < budget:
        b *= 2.0
        if b > 1e30:
            break
    for _ in range(200):
        m = 0.5 * (a + b)
        if m in (a, b):  # converged to float resolution: further steps change nothing
            break
        if spend(m) <= budget:
            a = m
        else:
            b = m
    keep = [min(max(a * x, f), h) for x, f, h in zip(weights, lo, hi)]
    d = [k * w / p for k, w, p in zip(keep, dense, params_per_dim)]
    return [min(max(x, 1.0), float(dm)) for x, dm in zip(d, d_max)]


def sensitivity_allocation(
    dense: Sequence[int],
    params_per_dim: Sequence[int],
    d_max: Sequence[int],
    table: Sequence[Sequence[float]],
    grid: Sequence[float],
    base_ppl: float,
    budget: int,
) -> tuple[list[float], list[float]]:
    """ASVD's sensitivity search. ``table[i][k]``: calibration perplexity with target i alone at kept fraction ``grid[k]``.

    Returns (d*, per-parameter scores).
    """
    n = len(dense)
    hi = [min(1.0, p * dm / w) for p, dm, w in zip(params_per_dim, d_max, dense)]
    grid = list(grid)
    for i, row in enumerate(table):
        for v in row:
            if not math.isfinite(v):
                raise GacError(f"sensitivity search: non-finite calibration perplexity for target #{i}; the truncated model diverged")

    def pick(th):
        fr = []
        for i in range(n):
            ok = [g for g, v in zip(grid, table[i]) if v <= th and g <= hi[i]]
            fr.append(min(ok) if ok else hi[i])
        return fr

    def cost(fr):
        return sum(f * w for f, w in zip(fr, dense))

    levels = sorted({v for row in table for v in row} | {base_ppl})
    chosen = pick(levels[-1])
    for th in levels:  # lowest threshold whose allocation fits
        fr = pick(th)
        if cost(fr) <= budget:
            chosen = fr
            break
    scores = []
    for i in range(n):
        incs = [max(v - base_ppl, 0.0) / max((1.0 - g) * dense[i], 1.0) for g, v in zip(grid, table[i])]
        scores.append(max(sum(incs) / len(incs), 1e-12))
    d = proportional_allocation(dense, params_per_dim, d_max, scores, budget, weights=chosen, min_keep=0.0)
    return d, scores


PALU_BLOCK = 32  # PaLU rounds every group's rank to a multiple of 32, at least 32 (rounding_search_result)


def fisher_uniform_allocation(
    dense: Sequence[int],
    params_per_dim: Sequence[int],
    d_max: Sequence[int],
    scores: Sequence[float],
    groups: Sequence,
    budget: int,
    min_rank: int = PALU_BLOCK,
) -> list[float]:
    """PaLU's ``fisher_uniform`` rank search (module docstring). ``groups[i]``: the projection target i belongs to
    (targets with equal keys are that projection's head groups; give every target its own key for a plain
    rank-proportional-to-score rule). ``min_rank``: the floor of every d* (module docstring)."""
    n = len(dense)
    if not (len(params_per_dim) == len(d_max) == len(scores) == len(groups) == n) or n == 0:
        raise GacError("fisher_uniform needs one dense size, params_per_dim, d_max, score and projection per target")
    for s in scores:
        if not math.isfinite(s) or s < 0:
            raise GacError(f"allocation got a non-finite or negative score ({s}); scores must be finite and >= 0")
    cap = sum(p * d for p, d in zip(params_per_dim, d_max))
    if budget >= cap:
        return [float(d) for d in d_max]
    if budget < sum(params_per_dim):
        raise InfeasibleBudgetError(budget, sum(params_per_dim), "every target at dimension 1")
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    w = [0.0] * n
    for idx in members.values():
        f = math.fsum(scores[i] * dense[i] for i in idx) / math.fsum(dense[i] for i in idx)  # the projection's score
        for i in idx:
            w[i] = f / len(idx)  # d*_i = lambda * F_p / G_p
    if not any(x > 0 for x in w):
        w = [1.0] * n  # all scores zero: the same rank everywhere

    def spend(d):
        return math.fsum(p * x for p, x in zip(params_per_dim, d))

    def bisect(f, hi_start):  # the largest t with spend(f(t)) <= budget
        a, b = 0.0, hi_start
        while spend(f(b)) < budget and b < 1e300:
            b *= 2.0
        for _ in range(200):
            m = 0.5 * (a + b)
            if spend(f(m)) <= budget:
                a = m
            else:
                b = m
        return a

    floor = [float(min(max(min_rank, 1), d)) for d in d_max]
    if spend(floor) > budget:  # the budget cannot give every group min_rank: the largest uniform floor it can
        t = bisect(lambda t: [min(max(t, 1.0), d) for d in d_max], float(max(min_rank, 1)))
        floor = [min(max(t, 1.0), float(d)) for d in d_max]
    lam = bisect(lambda t: [min(max(t * x, f), d) for x, f, d in zip(w, floor, d_max)], 1.0)
    return [min(max(lam * x, f), float(d)) for x, f, d in zip(w, floor, d_max)]
