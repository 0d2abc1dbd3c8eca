"""A plan: the chosen dimension per target, with its accounting."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from gac.align.targets import Target

REPORT_UNITS = (8, 16, 32)


@dataclass
class Plan:
    """The outcome of one strategy on one allocation problem.

    ``objective`` is the paper's Eq. 4, ``sum_i s_i * (params_i(d_i) - params_i(d*_i))``, for every strategy, so
    plans from different strategies under the same budget compare directly (higher is better).

    ``dense`` names the targets left unfactorised (their ``dims`` entry is the dense weight's rank ``min(out, in)``,
    their parameters ``out * in``); a dense target counts as aligned: its dimensions are the model's own.
    """

    strategy: str
    dims: dict[str, int]
    params: int
    budget: int
    objective: float
    unit: int
    aligned_fraction: float
    aligned_by_unit: dict[int, float]
    budget_met: bool
    notes: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    dense: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """The ``gac align`` output format (plus extra keys that readers may ignore)."""
        d = asdict(self)
        d["aligned_by_unit"] = {str(k): v for k, v in self.aligned_by_unit.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> Plan:
        d = dict(d)
        d["aligned_by_unit"] = {int(k): float(v) for k, v in d.get("aligned_by_unit", {}).items()}
        d.setdefault("notes", [])
        d.setdefault("stats", {})
        d.setdefault("dense", [])
        return cls(**d)


def aligned_fraction(dims: Sequence[int], unit: int, dense: Sequence[bool] | None = None) -> float:
    """Fraction of ``dims`` that are multiples of ``unit``; entries flagged in ``dense`` count as aligned."""
    dims = list(dims)
    if not dims:
        return 1.0
    dense = list(dense) if dense is not None else [False] * len(dims)
    return sum(1 for d, k in zip(dims, dense) if k or d % unit == 0) / len(dims)


def objective(targets: Sequence[Target], dims: Sequence[int]) -> float:
    return math.fsum(t.score * (t.params(d) - t.params_star) for t, d in zip(targets, dims))


def make_plan(
    strategy: str,
    targets: Sequence[Target],
    dims: Sequence[int],
    budget: int,
    unit: int,
    notes: Sequence[str] = (),
    stats: dict | None = None,
) -> Plan:
    dims = [int(d) for d in dims]
    params = sum(t.params(d) for t, d in zip(targets, dims))
    units = sorted({*REPORT_UNITS, unit})
    dense = [t.is_dense(d) for t, d in zip(targets, dims)]
    return Plan(
        strategy=strategy,
        dims={t.name: d for t, d in zip(targets, dims)},
        params=int(params),
        budget=int(budget),
        objective=objective(targets, dims),
        unit=unit,
        aligned_fraction=aligned_fraction(dims, unit, dense),
        aligned_by_unit={u: aligned_fraction(dims, u, dense) for u in units},
        budget_met=params <= budget,
        notes=list(notes),
        stats=dict(stats or {}),
        dense=[t.name for t, k in zip(targets, dense) if k],
    )
