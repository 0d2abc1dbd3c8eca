"""Plans chosen for a latency target: the exact knapsack with latency as the cost, and its dual.

Each target's candidate dimension ``d`` has a latency ``lat_i(d)`` (its own kernels at the job's batch and sequence
length, from a latency table: :mod:`gac.profiling.latency_tables` measures one, :mod:`gac.predict.latency_tables`
predicts one for a GPU). Where the GPU is busy (a prefill) kernels run one after another, so the targets' latencies
add up; everything the plan does not change (attention, norms, the head) is a constant ``fixed_ms`` beside them.

**Latency budget** (:func:`solve_latency_budget`, strategy ``gac_latency``): maximise the compressor's score, the same
objective as the parameter solver (Eq. 4, ``sum_i s_i (params_i(d_i) - params_i(d*_i))``), subject to
``fixed_ms + sum_i lat_i(d_i) <= L``, solved exactly (:func:`gac.align.exact_mckp.solve_exact`): every latency, the
budget and every value at its exact value (a float is its binary value; a :class:`~fractions.Fraction` may be given),
no rounding and no quantum. So the plan is within the budget by exact arithmetic, and no plan within it scores more:
at a budget equal to a plan's own latency, that plan (or a better one) is returned. A plan's latency is reported
rounded **up** to a float (:func:`plan_latency`), so a budget copied from a reported latency holds that plan.

**Minimum latency at a parameter budget** (:func:`solve_min_latency`): the parameter count is the (integer, exact)
cost and the latency the value to minimise, with no rounding at all. ``bound="at_least"`` finds the fastest plan
keeping at least ``params`` parameters (the covering form: the fastest model of at least that size; solved as
the same knapsack over the parameters each target gives up below its largest candidate), ``bound="at_most"`` the
fastest plan within ``params`` (usually every target at its fastest candidate: a budget that binds only when those do
not fit). Ties in latency go to the plan with more parameters (``at_most``: to a larger candidate of equal latency
within a target).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from gac.align.candidates import (
    DEFAULT_UNIT,
    DEFAULT_WINDOW,
    CandidateFilter,
    candidate_sets,
    check_unit,
    check_window,
)
from gac.align.exact_mckp import solve_exact
from gac.align.plan import Plan, make_plan
from gac.align.solver import solve_mckp
from gac.align.strategies import check_magnitudes
from gac.align.targets import Target, check_unique
from gac.errors import GacError, InfeasibleBudgetError

# The strategies `gac align` runs with latency tables are gac.registry.LATENCY_STRATEGIES (not in
# gac.align.strategies.STRATEGIES: they take more inputs); the dual (align_min_latency, plans named
# gac_min_latency) is a Python entry point only.
BOUNDS = ("at_least", "at_most")

LatencyTable = Mapping[str, Mapping[int, float]]  # target name -> {candidate dim: latency in ms}
Ms = float | int | Fraction


@dataclass
class LatencyResult:
    """The outcome of :func:`solve_latency_budget`: the choice and its accounting (latencies in ms)."""

    choice: list[int]  # index into each item's option list
    latency_ms: float  # the chosen plan's latency, fixed_ms included, rounded up to a float
    value: float
    budget_ms: float
    fixed_ms: float = 0.0
    exact_latency_ms: Fraction = Fraction(0)  # the same latency, exact
    exact_budget_ms: Fraction = Fraction(0)
    stats: dict = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return self.exact_latency_ms <= self.exact_budget_ms

    @property
    def unused_ms(self) -> float:
        return float(self.exact_budget_ms - self.exact_latency_ms)

    def to_json(self) -> dict:
        return {"budget_kind": "latency_ms", "budget_ms": self.budget_ms, "latency_ms": self.latency_ms,
                "held": self.held, "unused_ms": self.unused_ms, "fixed_ms": self.fixed_ms, "solver": "exact"}


MAX_MS = 1e9  # ms (11.6 days): no prefill's latency; a million of them still sum to a finite float, exactly reported


def _shown(x) -> str:
    """A number as a message shows it: an integer of hundreds of digits by its size, not its digits."""
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10**20:
        return f"an integer of about {round(x.bit_length() * math.log10(2))} digits"
    return repr(x)


def check_ms(x, what: str, positive: bool = False) -> Fraction:
    """A latency in ms (a budget, a table's entry, the fixed part) as its exact value (a float's binary value): finite,
    >= 0 (> 0 with ``positive``) and at most :data:`MAX_MS`, so sums over any plan's targets stay finite floats."""
    if isinstance(x, bool) or not isinstance(x, (int, float, Fraction)) or (
            isinstance(x, float) and not math.isfinite(x)) or x < 0 or x > MAX_MS or (positive and x == 0):
        raise GacError(f"{what} must be a finite number of milliseconds {'above' if positive else 'from'} 0 "
                       f"{'and at most' if positive else 'to'} {MAX_MS:g} (no prefill takes longer), got {_shown(x)}")
    return Fraction(x)



def round_up(x: Fraction) -> float:
    """The smallest float at least ``x``: a latency reported this way, given back as a budget, holds its plan."""
    f = float(x)
    return f if Fraction(f) >= x else math.nextafter(f, math.inf)


def solve_latency_budget(
    latency: Sequence[Sequence[Ms]],
    values: Sequence[Sequence[float]],
    budget_ms: Ms,
    fixed_ms: Ms = 0.0,
) -> LatencyResult:
    """The exact optimum: maximal total value with ``fixed_ms + sum latency <= budget_ms``, exactly.

    ``latency[i][j]`` (ms, finite, >= 0) and ``values[i][j]`` of option j of item i. Raises :class:`GacError` when no
    plan fits (naming the fastest plan's latency)."""
    t0 = time.perf_counter()
    n = len(latency)
    if n != len(values):
        raise ValueError("latency and values must have one entry per item")
    budget = check_ms(budget_ms, "the latency budget")
    fixed = check_ms(fixed_ms, "the fixed latency (fixed_ms)")
    lat = []
    for i, (ls, vs) in enumerate(zip(latency, values)):
        if len(ls) != len(vs) or not len(ls):
            raise ValueError("each item needs at least one option and as many values as latencies")
        lat.append([check_ms(x, f"item {i}'s latency") for x in ls])
        for v in vs:
            if not math.isfinite(v):
                raise ValueError("values must be finite")
    fastest = fixed + sum((min(ls) for ls in lat), Fraction(0))
    if fastest > budget:
        up = round_up(fastest)
        raise GacError(f"infeasible latency budget: {float(budget):.6g} ms is below the fastest plan the candidate "
                       f"sets allow ({up:.6g} ms, {float(fixed):.6g} ms of it fixed); raise the latency budget to at "
                       f"least {up!r} ms or allow smaller (faster) candidate dimensions")
    res = solve_exact(lat, values, budget - fixed)
    exact = fixed + res.cost
    if exact > budget:
        raise AssertionError(f"latency plan over budget: {exact} > {budget}")  # a bug, never a silent overshoot
    return LatencyResult(choice=res.choice, latency_ms=round_up(exact), value=float(res.value),
                         budget_ms=float(budget_ms), fixed_ms=float(fixed_ms), exact_latency_ms=exact,
                         exact_budget_ms=budget, stats=dict(res.stats, time_s=time.perf_counter() - t0))


@dataclass
class MinLatencyResult:
    """The outcome of :func:`solve_min_latency`."""

    choice: list[int]
    latency_ms: float  # fixed_ms included
    params: int
    param_budget: int
    bound: str
    stats: dict = field(default_factory=dict)


def solve_min_latency(
    params: Sequence[Sequence[int]],
    latency: Sequence[Sequence[float]],
    param_budget: int,
    bound: str = "at_least",
    fixed_ms: float = 0.0,
) -> MinLatencyResult:
    """Exact minimum summed latency over plans with ``sum params >= param_budget`` (``bound="at_least"``) or
    ``<= param_budget`` (``"at_most"``); ties go to more parameters (module docstring). No rounding: the parameters
    are the cost."""
    t0 = time.perf_counter()
    if bound not in BOUNDS:
        raise GacError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
    if len(params) != len(latency):
        raise ValueError("params and latency must have one entry per item")
    fixed = check_ms(fixed_ms, "the fixed latency (fixed_ms)")
    param_budget = int(param_budget)
    ps = [[int(p) for p in row] for row in params]
    for i, (row, ls) in enumerate(zip(ps, latency)):
        if len(row) != len(ls) or not row:
            raise ValueError("each item needs at least one option and as many latencies as parameter counts")
        if min(row) < 0:
            raise ValueError("parameter counts must be non-negative")
        for x in ls:
            check_ms(x, f"item {i}'s latency")
    # the solver maximises; fewer parameters break ties (its cheaper plan): negate latency, and for "at_least" the
    # cost is what each item gives up below its largest option, so the cheaper tie keeps more parameters
    values = [[-float(x) for x in ls] for ls in latency]
    if bound == "at_least":
        top = [max(row) for row in ps]
        most = sum(top)
        if most < param_budget:
            raise GacError(f"no plan keeps {param_budget:,} parameters: the largest candidates hold {most:,}; lower "
                           f"the parameter count or allow larger candidate dimensions")
        res = solve_mckp([[t - p for p in row] for t, row in zip(top, ps)], values, most - param_budget)
    else:
        # ties to more parameters: the solver's tie-break prefers less cost, so break exact latency ties here
        res = solve_mckp(ps, values, param_budget)
        res = _more_params_on_ties(ps, latency, param_budget, res)
    kept = sum(ps[i][j] for i, j in enumerate(res.choice))
    ms = round_up(fixed + sum((Fraction(latency[i][j]) for i, j in enumerate(res.choice)), Fraction(0)))
    return MinLatencyResult(list(res.choice), ms, int(kept), param_budget, bound,
                            dict(res.stats, time_s=time.perf_counter() - t0))


def _more_params_on_ties(ps, latency, budget, res):
    """Within items, swap to an option of equal latency and more parameters while the budget allows (a plan with the
    same latency; the solver's own tie-break keeps the cheaper one)."""
    choice = list(res.choice)
    left = budget - sum(ps[i][j] for i, j in enumerate(choice))
    for i, j in enumerate(choice):
        best = j
        for k in range(len(ps[i])):
            if latency[i][k] == latency[i][j] and ps[i][best] < ps[i][k] <= ps[i][j] + left:
                best = k
        left -= ps[i][best] - ps[i][j]
        choice[i] = best
    res.choice = choice
    return res


# ------------------------------------------------------------------------------------------------ plans from targets
def check_latency_table(table: object, source: str = "latency table") -> dict[str, dict[int, float]]:
    """A latency table as ``{target name: {dim: ms}}`` (JSON object keys may be strings of integers)."""
    if not isinstance(table, Mapping):
        raise GacError(f"{source} must map target names to {{dimension: latency in ms}}, got {type(table).__name__}")
    out: dict[str, dict[int, float]] = {}
    for name, row in table.items():
        if not isinstance(row, Mapping) or not row:
            raise GacError(f"{source}: the entry of {name!r} must be a non-empty {{dimension: latency in ms}} object")
        entries = {}
        for d, ms in row.items():
            try:
                dim = int(d)
            except (TypeError, ValueError):
                dim = None
            if dim is None or isinstance(d, bool) or dim <= 0 or str(dim) != str(d).strip():
                raise GacError(f"{source}: {name!r} has dimension {d!r}; dimensions must be positive integers")
            check_ms(ms, f"{source}: {name!r} at dimension {dim}: the latency")
            entries[dim] = ms if isinstance(ms, Fraction) else float(ms)
        out[str(name)] = entries
    return out


def latency_costs(targets: Sequence[Target], cands: Sequence[Sequence[int]], table: LatencyTable) -> list[list[Ms]]:
    """``lat_i(d)`` for every candidate of every target, or a :class:`GacError` naming what the table lacks."""
    out, missing = [], []
    for t, cs in zip(targets, cands):
        row = table.get(t.name)
        if row is None:
            missing.append(f"{t.name!r} (no entry)")
            continue
        lack = [d for d in cs if d not in row]
        if lack:
            missing.append(f"{t.name!r} at {lack}")
            continue
        out.append([row[d] for d in cs])
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise GacError(f"the latency table lacks candidate dimensions: {', '.join(missing[:5])}{more}; give a latency "
                       f"for every candidate (measure or predict the table with the same unit and window)")
    return out


def plan_latency(targets: Sequence[Target], dims: Mapping[str, int] | Sequence[int], table: LatencyTable,
                 fixed_ms: Ms = 0.0) -> float | None:
    """The summed latency of a plan's dimensions by ``table``, rounded up to a float (so that as a budget it holds
    the plan; None when the table lacks one of them)."""
    exact = plan_latency_exact(targets, dims, table, fixed_ms)
    return None if exact is None else round_up(exact)


def plan_latency_exact(targets: Sequence[Target], dims: Mapping[str, int] | Sequence[int], table: LatencyTable,
                       fixed_ms: Ms = 0.0) -> Fraction | None:
    """The exact summed latency of a plan's dimensions by ``table`` (None when the table lacks one of them)."""
    ds = [dims[t.name] for t in targets] if isinstance(dims, Mapping) else list(dims)
    total = Fraction(fixed_ms)
    for t, d in zip(targets, ds):
        row = table.get(t.name)
        if row is None or int(d) not in row:
            return None
        total += Fraction(row[int(d)])
    return total


def _setup(targets, unit, window, candidate_filter):
    unit, window = check_unit(unit), check_window(window)
    targets = list(targets)
    if not targets:
        raise GacError("no targets to align; the allocation has an empty target list")
    check_unique(targets)
    return targets, unit, window, candidate_sets(targets, unit, window, candidate_filter)


def align_latency(
    targets: Sequence[Target],
    table: LatencyTable,
    latency_budget_ms: Ms,
    param_budget: int,
    unit: int = DEFAULT_UNIT,
    window: int = DEFAULT_WINDOW,
    candidate_filter: CandidateFilter | None = None,
    fixed_ms: Ms = 0.0,
) -> Plan:
    """Strategy ``gac_latency``: the best plan by Eq. 4 whose summed latency holds ``latency_budget_ms``.

    ``param_budget`` is not enforced (latency is the budget): the plan records it, and ``budget_met`` says whether the
    plan also holds it. ``plan.stats["latency"]`` holds the latency accounting (:meth:`LatencyResult.to_json`).
    """
    t0 = time.perf_counter()
    targets, unit, window, cands = _setup(targets, unit, window, candidate_filter)
    check_magnitudes(targets, cands)
    lat = latency_costs(targets, cands, table)
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(targets, cands)]
    res = solve_latency_budget(lat, values, latency_budget_ms, fixed_ms)
    dims = [cs[j] for cs, j in zip(cands, res.choice)]
    stats = {"solver": res.stats, "latency": res.to_json(), "time_s": time.perf_counter() - t0}
    plan = make_plan("gac_latency", targets, dims, param_budget, unit, [], stats)
    plan.notes.append(f"latency budget {res.budget_ms:.6g} ms held: {res.latency_ms:.6g} ms by the latency table "
                      f"(solved exactly); parameters are not budgeted: {plan.params:,} "
                      + ("within" if plan.budget_met else "above") + f" the parameter budget {param_budget:,}")
    return plan


def align_min_latency(
    targets: Sequence[Target],
    table: LatencyTable,
    param_budget: int,
    bound: str = "at_least",
    unit: int = DEFAULT_UNIT,
    window: int = DEFAULT_WINDOW,
    candidate_filter: CandidateFilter | None = None,
    fixed_ms: float = 0.0,
) -> Plan:
    """Strategy ``gac_min_latency``: the fastest plan with at least (``bound="at_least"``) or at most (``"at_most"``)
    ``param_budget`` parameters. ``plan.stats["latency"]`` holds its latency; ``budget_met`` is ``params <= budget``
    as for every plan (with ``at_least`` the plan usually sits just above the budget)."""
    t0 = time.perf_counter()
    targets, unit, window, cands = _setup(targets, unit, window, candidate_filter)
    lat = latency_costs(targets, cands, table)
    params = [[t.params(d) for d in cs] for t, cs in zip(targets, cands)]
    if bound == "at_most":
        least = sum(min(p) for p in params)
        if least > param_budget:
            raise InfeasibleBudgetError(param_budget, least, "every target at its smallest candidate")
    res = solve_min_latency(params, lat, param_budget, bound, fixed_ms)
    dims = [cs[j] for cs, j in zip(cands, res.choice)]
    stats = {"solver": res.stats, "time_s": time.perf_counter() - t0,
             "latency": {"budget_kind": f"params_{bound}", "param_budget": int(param_budget),
                         "latency_ms": res.latency_ms, "fixed_ms": fixed_ms,
                         "held": (res.params >= param_budget) if bound == "at_least" else (res.params <= param_budget)}}
    plan = make_plan("gac_min_latency", targets, dims, param_budget, unit, [], stats)
    rel = "at least" if bound == "at_least" else "at most"
    plan.notes.append(f"the fastest plan with {rel} {param_budget:,} parameters: {res.latency_ms:.6g} ms by the "
                      f"latency table, {plan.params:,} parameters")
    return plan
