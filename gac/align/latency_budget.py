"""Plans chosen for a latency target: the exact knapsack with latency as the cost, and its dual.

Each target's candidate dimension ``d`` has a latency ``lat_i(d)`` (its own kernels at the job's batch and sequence
length, from a latency table: :mod:`gac.profiling.latency_tables` measures one, :mod:`gac.predict.latency_tables`
predicts one for a GPU). Where the GPU is busy (a prefill) kernels run one after another, so the targets' latencies
add up; everything the plan does not change (attention, norms, the head) is a constant ``fixed_ms`` beside them.

**Latency budget** (:func:`solve_latency_budget`, strategy ``gac_latency``): maximise the compressor's score, the same
objective as the parameter solver (Eq. 4, ``sum_i s_i (params_i(d_i) - params_i(d*_i))``), subject to
``fixed_ms + sum_i lat_i(d_i) <= L``. Latencies are real numbers; the exact solver (:func:`gac.align.solver.solve_mckp`)
takes integer costs, so each latency is rounded **up** to a whole number of quanta ``q`` and the budget **down**:
``c_i(d) = ceil(lat_i(d) / q)``, ``U = floor((L - fixed_ms) / q)``, computed exactly in rationals (each latency at
its exact binary value, the quantum at the decimal it prints as: 0.001 is 1/1000). A plan whose rounded
cost fits ``U`` then has a true latency ``<= sum c q <= U q <= L``: the budget holds for the true latencies, not for
their rounding. The price of the rounding is optimality by at most ``n q`` of budget: each option's rounding adds less
than ``q``, so every plan whose true latency is at most ``L - n q`` fits, and the plan found is at least as good as the
best plan at that tighter budget (``optimal_within_ms``). The default quantum is the power of ten at most
``0.1% x L / n``: the rounding then costs at most 0.1% of the budget. The solver's DP runs over the spread of the
candidates' latencies (not over the whole budget), so a fine quantum stays affordable.

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
from gac.align.plan import Plan, make_plan
from gac.align.solver import solve_mckp
from gac.align.strategies import _check_magnitudes
from gac.align.targets import Target, check_unique
from gac.errors import GacError, InfeasibleBudgetError

# The strategies `gac align` runs with latency tables are gac.registry.LATENCY_STRATEGIES (not in
# gac.align.strategies.STRATEGIES: they take more inputs); the dual (align_min_latency, plans named
# gac_min_latency) is a Python entry point only.
#: the default quantum keeps the rounding below this share of the latency budget
QUANTUM_SHARE = 1e-3
BOUNDS = ("at_least", "at_most")

LatencyTable = Mapping[str, Mapping[int, float]]  # target name -> {candidate dim: latency in ms}


@dataclass
class LatencyResult:
    """The outcome of :func:`solve_latency_budget`: the choice and its accounting (all latencies in ms)."""

    choice: list[int]  # index into each item's option list
    latency_ms: float  # the chosen plan's true latency, fixed_ms included (a correctly rounded sum)
    value: float
    budget_ms: float
    quantum_ms: float
    fixed_ms: float = 0.0
    rounded_ms: float = 0.0  # the chosen plan's latency after rounding each option up to quanta (fixed_ms included)
    optimal_within_ms: float = 0.0  # n * quantum: the plan is at least as good as the optimum at budget - this
    stats: dict = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return self.latency_ms <= self.budget_ms

    @property
    def unused_ms(self) -> float:
        return self.budget_ms - self.latency_ms

    def to_json(self) -> dict:
        return {"budget_kind": "latency_ms", "budget_ms": self.budget_ms, "latency_ms": self.latency_ms,
                "held": self.held, "unused_ms": self.unused_ms, "fixed_ms": self.fixed_ms,
                "quantum_ms": self.quantum_ms, "rounding_ms": self.rounded_ms - self.latency_ms,
                "optimal_within_ms": self.optimal_within_ms}


def _ms(x, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise GacError(f"{what} must be a finite number of milliseconds >= 0, got {x!r}")
    return float(x)


def default_quantum(budget_ms: float, n_items: int) -> float:
    """The power of ten at most ``QUANTUM_SHARE * budget_ms / n_items`` (so the rounding costs at most 0.1% of the
    budget), and at least 1e-9 ms."""
    share = QUANTUM_SHARE * float(budget_ms) / max(1, n_items)
    if share <= 0:
        return 1e-6
    return max(1e-9, 10.0 ** math.floor(math.log10(share)))


def _units_up(x: float, q: Fraction) -> int:
    """``ceil(x / q)`` in exact rational arithmetic."""
    return -((-Fraction(x)) // q)


def solve_latency_budget(
    latency: Sequence[Sequence[float]],
    values: Sequence[Sequence[float]],
    budget_ms: float,
    quantum_ms: float | None = None,
    fixed_ms: float = 0.0,
) -> LatencyResult:
    """Exact MCKP with latency as the cost: maximal total value with ``fixed_ms + sum latency <= budget_ms``.

    ``latency[i][j]`` (ms, finite, >= 0) and ``values[i][j]`` of option j of item i. See the module docstring for the
    rounding and its guarantee. Raises :class:`GacError` when no plan fits (naming the fastest plan's latency).
    """
    t0 = time.perf_counter()
    n = len(latency)
    if n != len(values):
        raise ValueError("latency and values must have one entry per item")
    budget_ms = _ms(budget_ms, "the latency budget")
    fixed_ms = _ms(fixed_ms, "the fixed latency (fixed_ms)")
    for i, (ls, vs) in enumerate(zip(latency, values)):
        if len(ls) != len(vs) or not len(ls):
            raise ValueError("each item needs at least one option and as many values as latencies")
        for x in ls:
            _ms(x, f"item {i}'s latency")
    q_float = default_quantum(budget_ms, n) if quantum_ms is None else float(quantum_ms)
    if isinstance(quantum_ms, bool) or not math.isfinite(q_float) or q_float <= 0:
        raise GacError(f"the latency quantum must be a positive number of milliseconds, got {quantum_ms!r}")
    q = Fraction(repr(q_float))  # the decimal the quantum reads as (0.001 is 1/1000, not the float next to it)
    room = Fraction(budget_ms) - Fraction(fixed_ms)
    fastest = math.fsum([fixed_ms] + [min(ls) for ls in latency])
    if room < 0 or sum((Fraction(min(ls)) for ls in latency), Fraction(0)) > room:
        raise GacError(f"infeasible latency budget: {budget_ms:.6g} ms is below the fastest plan the candidate sets "
                       f"allow ({fastest:.6g} ms, {fixed_ms:.6g} ms of it fixed); raise the latency budget to at least "
                       f"{fastest:.6g} ms or allow smaller (faster) candidate dimensions")
    units = int(room // q)
    costs = [[_units_up(x, q) for x in ls] for ls in latency]
    try:
        res = solve_mckp(costs, values, units)
    except InfeasibleBudgetError:
        gap = float(room - sum((Fraction(min(ls)) for ls in latency), Fraction(0))) / n  # rounding room per item
        fix = f"a quantum below {gap:.3g} ms" if gap > 0 else "a slightly larger budget"
        raise GacError(f"the latency quantum {q_float:g} ms is too coarse for a budget of {budget_ms:.6g} ms: rounded "
                       f"up to quanta, even the fastest plan ({fastest:.6g} ms) does not fit; give {fix}") from None
    except GacError as e:
        raise GacError(f"{e}; or use a coarser latency quantum than {q_float:g} ms") from None
    chosen = [latency[i][j] for i, j in enumerate(res.choice)]
    true = math.fsum([fixed_ms, *chosen])
    if Fraction(fixed_ms) + sum((Fraction(x) for x in chosen), Fraction(0)) > Fraction(budget_ms):
        raise AssertionError(f"latency plan over budget: {true} > {budget_ms}")  # a bug, never a silent overshoot
    stats = dict(res.stats, budget_units=units, cost_units=res.cost, time_s=time.perf_counter() - t0)
    return LatencyResult(choice=list(res.choice), latency_ms=true, value=res.value, budget_ms=budget_ms,
                         quantum_ms=q_float, fixed_ms=fixed_ms, rounded_ms=fixed_ms + float(res.cost * q),
                         optimal_within_ms=n * q_float, stats=stats)


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
    fixed_ms = _ms(fixed_ms, "the fixed latency (fixed_ms)")
    param_budget = int(param_budget)
    ps = [[int(p) for p in row] for row in params]
    for i, (row, ls) in enumerate(zip(ps, latency)):
        if len(row) != len(ls) or not row:
            raise ValueError("each item needs at least one option and as many latencies as parameter counts")
        if min(row) < 0:
            raise ValueError("parameter counts must be non-negative")
        for x in ls:
            _ms(x, f"item {i}'s latency")
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
    ms = math.fsum([fixed_ms] + [latency[i][j] for i, j in enumerate(res.choice)])
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
            entries[dim] = _ms(ms, f"{source}: {name!r} at dimension {dim}: the latency")
        out[str(name)] = entries
    return out


def latency_costs(targets: Sequence[Target], cands: Sequence[Sequence[int]], table: LatencyTable) -> list[list[float]]:
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
        out.append([float(row[d]) for d in cs])
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise GacError(f"the latency table lacks candidate dimensions: {', '.join(missing[:5])}{more}; give a latency "
                       f"for every candidate (measure or predict the table with the same unit and window)")
    return out


def plan_latency(targets: Sequence[Target], dims: Mapping[str, int] | Sequence[int], table: LatencyTable,
                 fixed_ms: float = 0.0) -> float | None:
    """The summed latency of a plan's dimensions by ``table`` (None when the table lacks one of them)."""
    ds = [dims[t.name] for t in targets] if isinstance(dims, Mapping) else list(dims)
    parts = [fixed_ms]
    for t, d in zip(targets, ds):
        row = table.get(t.name)
        if row is None or int(d) not in row:
            return None
        parts.append(float(row[int(d)]))
    return math.fsum(parts)


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
    latency_budget_ms: float,
    param_budget: int,
    unit: int = DEFAULT_UNIT,
    window: int = DEFAULT_WINDOW,
    candidate_filter: CandidateFilter | None = None,
    quantum_ms: float | None = None,
    fixed_ms: float = 0.0,
) -> Plan:
    """Strategy ``gac_latency``: the best plan by Eq. 4 whose summed latency holds ``latency_budget_ms``.

    ``param_budget`` is not enforced (latency is the budget): the plan records it, and ``budget_met`` says whether the
    plan also holds it. ``plan.stats["latency"]`` holds the latency accounting (:meth:`LatencyResult.to_json`).
    """
    t0 = time.perf_counter()
    targets, unit, window, cands = _setup(targets, unit, window, candidate_filter)
    _check_magnitudes(targets, cands)
    lat = latency_costs(targets, cands, table)
    values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(targets, cands)]
    res = solve_latency_budget(lat, values, latency_budget_ms, quantum_ms, fixed_ms)
    dims = [cs[j] for cs, j in zip(cands, res.choice)]
    stats = {"solver": res.stats, "latency": res.to_json(), "time_s": time.perf_counter() - t0}
    plan = make_plan("gac_latency", targets, dims, param_budget, unit, [], stats)
    plan.notes.append(f"latency budget {res.budget_ms:.6g} ms held: {res.latency_ms:.6g} ms by the latency table "
                      f"(quantum {res.quantum_ms:g} ms); parameters are not budgeted: {plan.params:,} "
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
