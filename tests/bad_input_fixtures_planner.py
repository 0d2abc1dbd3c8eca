"""The files the "Fifth catalogue: planner bounds and fetched inputs" rows of docs/bad-input.md name: allocations
whose latency budget, fixed latency or one latency is an integer of 400 digits, whose latencies are 1e308 ms each
(a float sum overflows), and a tie-heavy latency allocation (Llama-3-8B's 224 projections, equal scores, latencies
proportional to parameters, eight candidates each). Every name starts with ``pl_``; the set costs about 100 KB."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.bad_input_fixtures_axes import LATENCY_ALLOCATION


def planner_files(T: Path) -> None:
    """Every input of the "Fifth catalogue: planner bounds and fetched inputs" rows, under ``T``."""
    huge = 10**400

    def write(name: str, edit) -> None:
        data = copy.deepcopy(LATENCY_ALLOCATION)
        edit(data)
        (T / name).write_text(json.dumps(data))

    write("pl_budget400.json", lambda d: d.update(latency_budget_ms=huge))
    write("pl_fixed400.json", lambda d: d.update(latency_fixed_ms=huge))
    write("pl_latency400.json", lambda d: d["targets"][0]["latency_ms"].update({"96": huge}))

    def overflowing(d):
        for t in d["targets"]:
            t["latency_ms"] = {k: 1e308 for k in t["latency_ms"]}
        d["latency_budget_ms"] = 1e9

    write("pl_sum_overflow.json", overflowing)
    from gac.align import candidate_sets
    from gac.align.synthetic import lowrank_problem

    p = lowrank_problem("llama3_8b", 0.15, seed=0, windows=(4,), equal_scores=True)
    cands = candidate_sets(p.targets)
    targets = [{"name": t.name, "d_star": t.d_star, "score": t.score, "params_per_dim": t.params_per_dim,
                "d_max": t.d_max, "candidates": list(cs), "kind": t.kind,
                "latency_ms": {str(d): 1.37e-9 * t.params(d) for d in cs}} for t, cs in zip(p.targets, cands)]
    lo = sum(min(t["latency_ms"].values()) for t in targets)
    hi = sum(max(t["latency_ms"].values()) for t in targets)
    (T / "pl_ties.json").write_text(json.dumps({"budget": p.budget, "latency_budget_ms": (lo + hi) / 2,
                                                "targets": targets}))
