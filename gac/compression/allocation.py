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

With dense options (``dense_dims``: low-rank targets that may stay unfactorised) the cap is the dense weight
itself: ``hi_i = 1``, and a target whose share passes the largest factorised fraction (``params_per_dim_i * d_max_i /
|W_i|``) jumps to dense (``d*_i = dense_dims[i]``); ``lambda`` is then the largest whose total stays <= B.

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

``"sensitivity"`` is ASVD's own search (Yuan et al. 2023, STRS; the reference ``hahnyuan/ASVD4LLM``,
``sensitivity.py`` + ``binary_search.py``), reproduced step by step:

1. the table (:func:`gac.compression.sensitivity.sensitivity_table`): calibration perplexity of the model with *one*
   weight truncated to each kept parameter ratio of the grid (the reference's 0.4, 0.5, ..., 0.9), every other
   weight dense; the rank for ratio g is the reference's ``int(g * out * in) // (out + in)``;
2. every (weight, ratio, perplexity) entry with ratio < 1 is sorted by perplexity, highest first; a cut at index
   ``m`` accepts the entries from ``m`` on (perplexity below the threshold ``ppl[m]``); each weight keeps the smallest
   accepted ratio, or stays dense when it has none (or when the rank would not save parameters);
3. a binary search on ``m`` finds the threshold whose allocation meets the budget: the largest kept parameter count
   that fits B, counted exactly (ranks, and ``out * in`` for dense weights). The reference's loop ends on its last
   probe, which can be one entry past its (nominal) target; gac stops at the last cut that fits B.

The chosen ranks are d* as they are: the ``unaligned`` strategy then reproduces the reference's model exactly.
Each target's per-parameter score for the aligned step (Eq. 4, ``knapsack_score="proxy"``) is its perplexity increase
per removed parameter, averaged over the grid.

``"stable_rank"`` is the GAC authors' allocation (their Table 5 script's "ASVD" rows, which are not ASVD's search):
a data-free stable-rank score per weight fed to the same binary search, the budget the cost of the chosen ranks
(:mod:`gac.compression.stable_rank`). It is the ``stable_rank_svd`` compressor's own and only allocation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from gac import registry
from gac.errors import GacError, InfeasibleBudgetError

log = logging.getLogger(__name__)

DEFAULT = "default"  # the compressor's own rule (Compressor.default_allocation): what its reference does
ALLOCATION_CHOICES = registry.ALLOCATIONS.names
ALLOCATIONS = tuple(n for n in ALLOCATION_CHOICES if n != DEFAULT)
SENSITIVITY_GRID = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # the reference's param_ratio_candidates (ASVD4LLM, sensitivity.py)
#: the GAC authors' data-free allocation (gac.compression.stable_rank), the stable_rank_svd compressor's own
STABLE_RANK = "stable_rank"
#: allocations that never read the importance proxy: ASVD's sensitivity search ranks weights by the calibration
#: perplexity of probes, and the stable-rank allocation by a score of the weights alone, so their d*, their scores and
#: therefore every plan are the same whatever the proxy
PROXY_FREE = ("sensitivity", STABLE_RANK)


def resolve_allocation(name: str | None, compressor) -> str:
    """``None`` / ``"default"`` -> the compressor's own rule; any other name must be one of :data:`ALLOCATIONS`."""
    from gac.errors import unknown_name

    if name is None or name == DEFAULT:
        return compressor.default_allocation
    if name not in ALLOCATIONS:
        raise unknown_name("allocation", str(name), ALLOCATION_CHOICES)
    own = compressor.default_allocation == STABLE_RANK
    if (name == STABLE_RANK) != own:  # the stable-rank ranks and stable_rank_svd's units (no dense option) go together
        raise GacError(f"allocation={name} with compressor {compressor.name}: the stable-rank allocation is the "
                       f"stable_rank_svd compressor's own and that compressor takes no other; use "
                       + ("allocation=default" if own else "compressor=stable_rank_svd, or another allocation"))
    return name


def check_sensitivity_samples(n) -> int | None:
    """ASVD's ``sensitivity_samples``: None (every calibration sample, the reference) or an integer >= 1."""
    if n is None or (isinstance(n, str) and n.strip().lower() in ("", "none", "null", "all")):
        return None
    try:
        v = int(n)
        ok = not isinstance(n, bool) and float(n) == v and v >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise GacError(f"sensitivity_samples={n!r} is not a whole number >= 1; give how many calibration samples "
                       f"the sensitivity probes run on, or null for all of them (the reference)")
    return v


def check_sensitivity_grid(grid) -> tuple[float, ...]:
    """A sensitivity grid: kept parameter ratios in (0, 1] (1 = dense), sorted, without repeats; else a GacError."""
    if isinstance(grid, str):
        try:
            grid = [float(x) for x in grid.replace(",", " ").split()]
        except ValueError:
            raise GacError(f"sensitivity grid {grid!r} is not a list of numbers; give kept ratios such as "
                           f"0.4,0.5,0.6,0.7,0.8,0.9") from None
    try:
        vals = [float(g) for g in grid]
    except (TypeError, ValueError):
        raise GacError(f"sensitivity grid {grid!r} is not a list of numbers; give kept parameter ratios in (0, 1] "
                       f"such as {list(SENSITIVITY_GRID)}") from None
    if any(isinstance(g, bool) for g in grid) or not vals:
        raise GacError(f"sensitivity grid {grid!r} must be a non-empty list of kept parameter ratios in (0, 1]")
    bad = [g for g in vals if not (math.isfinite(g) and 0 < g <= 1)]
    if bad:
        raise GacError(f"sensitivity grid {vals} has ratios outside (0, 1]: {bad}; each entry is the fraction of a "
                       f"weight's parameters kept (1 = dense), e.g. {list(SENSITIVITY_GRID)}")
    if all(g >= 1 for g in vals):
        raise GacError(f"sensitivity grid {vals} has no ratio below 1: nothing could be compressed; add kept ratios "
                       f"such as {list(SENSITIVITY_GRID)}")
    return tuple(sorted(set(vals)))


def reference_rank(dense: int, params_per_dim: int, ratio: float) -> int:
    """The rank the reference gives a weight at kept parameter ratio ``ratio``: ``int(ratio * |W|) // (out + in)``."""
    return int(dense * ratio) // params_per_dim


def proportional_allocation(
    dense: Sequence[int],
    params_per_dim: Sequence[int],
    d_max: Sequence[int],
    scores: Sequence[float],
    budget: int,
    power: float = 0.5,
    min_keep: float = 0.25,
    weights: Sequence[float] | None = None,
    dense_dims: Sequence[int | None] | None = None,
) -> list[float]:
    """Continuous d*_i (see module docstring). ``weights`` replaces ``(s_i/s_bar)**power`` when given.
    ``dense_dims[i]`` (not None): target i may stay dense; its d* is then ``dense_dims[i]``."""
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
    dd = list(dense_dims) if dense_dims is not None else [None] * n
    top = [1.0 if x is not None else h for x, h in zip(dd, hi)]  # the most a target can keep: dense, or d_max
    cap = sum(h * w for h, w in zip(top, dense))
    if budget >= cap:
        log.info("budget %d >= the most the compressed weights can hold (%d): every target at its top", budget, int(cap))
        return [float(x) if x is not None else float(dm) for x, dm in zip(dd, d_max)]
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

    def keeps(lam):
        out = []
        for x, f, h, dn in zip(weights, lo, hi, dd):
            k = max(lam * x, f)
            out.append((1.0 if k > h else k) if dn is not None else min(k, h))  # past the top rank: dense (a jump)
        return out

    def spend(lam):
        return math.fsum(k * w for k, w in zip(keeps(lam), dense))

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
    out = []
    for k, w, p, dm, x, h in zip(keeps(a), dense, params_per_dim, d_max, dd, hi):
        if x is not None and k > h:
            out.append(float(x))  # dense
        else:
            out.append(min(max(k * w / p, 1.0), float(dm)))
    return out


def sensitivity_allocation(
    dense: Sequence[int],
    params_per_dim: Sequence[int],
    d_cap: Sequence[int],
    table: Sequence[Sequence[float]],
    grid: Sequence[float],
    base_ppl: float,
    budget: int,
    dense_dims: Sequence[int | None] | None = None,
) -> tuple[list[float], list[float], dict]:
    """ASVD's sensitivity search (module docstring). ``table[i][k]``: calibration perplexity with target i alone at
    kept parameter ratio ``grid[k]``; ``d_cap[i]``: the largest rank the factors hold; ``dense_dims[i]``: the plan
    dimension of target i left dense (None: it cannot stay dense and keeps its largest rank instead).

    Returns ``(d*, per-parameter scores, info)``; ``info`` holds the threshold, the cut, the kept ratio per target
    and the exact parameter count.
    """
    n = len(dense)
    grid = [float(g) for g in grid]
    if not (len(params_per_dim) == len(d_cap) == len(table) == n) or n == 0:
        raise GacError("sensitivity search needs one dense size, params_per_dim, cap and table row per target")
    dd = list(dense_dims) if dense_dims is not None else [None] * n
    for i, row in enumerate(table):
        if len(row) != len(grid):
            raise GacError(f"sensitivity table row #{i} has {len(row)} entries for a grid of {len(grid)}; recompute it")
        for v in row:
            if not math.isfinite(v):
                raise GacError(f"sensitivity search: non-finite calibration perplexity for target #{i}; the truncated "
                               f"model diverged")

    def rank(i, g):  # None: dense (g >= 1, or the rank would not save parameters)
        if g >= 1:
            return None
        r = max(1, reference_rank(dense[i], params_per_dim[i], g))
        return r if r <= d_cap[i] or dd[i] is None else None

    def cost(i, g):
        r = rank(i, g)
        if r is None:
            return dense[i] if dd[i] is not None else params_per_dim[i] * d_cap[i]
        return params_per_dim[i] * min(r, d_cap[i])

    entries = [(i, g, v) for i in range(n) for g, v in zip(grid, table[i]) if g < 1]
    order = sorted(range(len(entries)), key=lambda k: -entries[k][2])  # stable: the reference's sorted(key=-ppl)
    entries = [entries[k] for k in order]

    def ratios(m):
        r = [1.0] * n
        for i, g, _ in entries[m:]:
            r[i] = min(r[i], g)
        return r

    def total(m):
        return sum(cost(i, g) for i, g in enumerate(ratios(m)))

    if total(0) > budget:
        smallest = min(g for g in grid if g < 1)
        raise InfeasibleBudgetError(
            budget, total(0), f"the sensitivity grid: every weight at its smallest kept ratio {smallest}; add smaller "
            f"kept ratios to the grid (sensitivity_grid) or use allocation='proportional'")
    lo, hi = 0, len(entries)  # total(lo) <= budget; total(len) = everything dense > budget
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if total(mid) <= budget:
            lo = mid
        else:
            hi = mid
    chosen = ratios(lo)
    d = []
    for i, g in enumerate(chosen):
        r = rank(i, g)
        if r is None:
            d.append(float(dd[i]) if dd[i] is not None else float(d_cap[i]))
        else:
            d.append(float(min(r, d_cap[i])))
    scores = []
    for i in range(n):
        incs = [max(v - base_ppl, 0.0) / max((1.0 - g) * dense[i], 1.0) for g, v in zip(grid, table[i]) if g < 1]
        scores.append(max(sum(incs) / len(incs), 1e-12))
    info = {"cut": lo, "entries": len(entries), "threshold_ppl": entries[lo][2] if lo < len(entries) else None,
            "kept_ratio": chosen, "params": total(lo)}
    return d, scores, info


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
