"""Benchmark: the exact gac solver against a MILP on model-shaped allocation problems.

Prints, per problem family, the median solve time of `gac` (over seeds), the MILP (HiGHS, gap 0) time and
the optimality gap (MILP objective minus gac objective; 0 means gac found the optimum). The process is pinned
to one CPU core.

    python benchmarks/solver.py                 # 224 / 560 / 2,000 targets, 5 seeds each
    python benchmarks/solver.py --seeds 2 --no-milp-2000
    python benchmarks/solver.py --quick         # seconds: one seed, one solve, the MILP on the 224-target families only
    python benchmarks/solver.py --latency-ties  # the exact latency planner's worst case: equal scores, latency
                                                # proportional to parameters (Llama-3-8B and -70B shapes)

Every plan is also checked against the solver run directly (``solve_mckp``): the objectives agree within
``REL_TOL`` of the summed terms' size (the objective sums terms of ~1e9 to a total near 0, where float rounding of
the sum alone is ~1e-6).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

from gac.align import align, candidate_sets  # noqa: E402
from gac.align.reference import milp_reference  # noqa: E402
from gac.align.solver import solve_mckp  # noqa: E402
from gac.align.synthetic import lowrank_problem  # noqa: E402
from gac.machine import hold_cpu_lock  # noqa: E402

FAMILIES = [
    ("Llama-3-8B (224)", "llama3_8b", False),
    ("Llama-3-70B (560)", "llama3_70b", False),
    ("MoE-like (2000)", "moe_2000", False),
    ("Llama-3-8B equal scores", "llama3_8b", True),
    ("Llama-3-70B equal scores", "llama3_70b", True),
]
REL_TOL = 1e-12  # objectives that differ by less than this times sum_i max_j |v_ij| are equal (float rounding)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--repeats", type=int, default=3, help="timed solves per seed (the minimum is kept)")
    ap.add_argument("--no-milp-2000", action="store_true", help="skip the MILP on the 2,000-target family")
    ap.add_argument("--quick", action="store_true",
                    help="one seed, one timed solve, the MILP on the 224-target families only (a smoke run)")
    ap.add_argument("--latency-ties", action="store_true",
                    help="time the exact latency planner on the tie-heavy problems instead (see latency_ties)")
    args = ap.parse_args(argv)
    if args.latency_ties:
        hold_cpu_lock()
        return latency_ties()
    if args.quick:
        args.seeds, args.repeats = 1, 1
    hold_cpu_lock(enabled=not args.quick)
    milp_max = 224 if args.quick else 1999 if args.no_milp_2000 else None

    print(f"one core (affinity {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}), "
          f"ratio {args.ratio}, {args.seeds} seeds, candidates: unit 8, windows 4-8 (8-16 per target)\n")
    header = (f"| {'problem':<26} | targets | cands/target | gac median ms | gac max ms | MILP median s "
              f"| max rel. gap (MILP - gac) | budget held |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for label, shape, equal in FAMILIES:
        times, milp_times, gaps, held, ncand = [], [], [], [], []
        for seed in range(args.seeds):
            p = lowrank_problem(shape, args.ratio, seed=seed, windows=(4, 5, 6, 7, 8), equal_scores=equal)
            best = None
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                plan = align(p.targets, p.budget, "gac")
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            times.append(best)
            held.append(plan.params <= p.budget)
            cands = candidate_sets(p.targets)
            ncand.append(statistics.mean(len(c) for c in cands))
            costs = [[t.params(d) for d in cs] for t, cs in zip(p.targets, cands)]
            values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(p.targets, cands)]
            scale = max(1.0, sum(max(abs(v) for v in vs) for vs in values))  # magnitude of the summed terms
            r = solve_mckp(costs, values, p.budget)
            assert abs(r.value - plan.objective) <= REL_TOL * scale, (label, seed, r.value, plan.objective)
            if milp_max is not None and len(p.targets) > milp_max:
                continue
            t0 = time.perf_counter()
            mv, mc, _ = milp_reference(costs, values, p.budget)
            milp_times.append(time.perf_counter() - t0)
            gaps.append((mv - r.value) / scale)
        milp = f"{statistics.median(milp_times):.2f}" if milp_times else "skipped"
        gap = f"{max(gaps):.3g}" if gaps else "-"
        print(f"| {label:<26} | {len(p.targets):>7} | {statistics.mean(ncand):>12.1f} | "
              f"{1000 * statistics.median(times):>13.1f} | {1000 * max(times):>10.1f} | {milp:>13} | "
              f"{gap:>25} | {'yes' if all(held) else 'NO':>11} |")
    print("\nrel. gap: (MILP objective - gac objective) / sum_i max_j |v_ij| (the size of the summed terms);\n"
          f"|gap| < {REL_TOL:g} is float rounding: gac equals the optimum.")
    return 0


def latency_ties() -> int:
    """The exact latency planner's worst case (tests/align/test_exact_ties.py): equal scores and latency
    ``1.37e-9 x params``, so every target's options lie on one line and the LP bound prunes nothing; window 4. Budgets:
    the gac plan's own latency (as ``align=gac_latency_at_gac`` sets it) and the middle of the reachable range."""
    from gac.align.latency_budget import align_latency, plan_latency, solve_latency_budget

    print("| problem | targets | budget | seconds | partial plans examined | search | load avg |")
    print("|---|---|---|---|---|---|---|")
    for label, shape in (("Llama-3-8B equal scores", "llama3_8b"), ("Llama-3-70B equal scores", "llama3_70b")):
        p = lowrank_problem(shape, 0.15, seed=0, windows=(4,), equal_scores=True)
        cands = candidate_sets(p.targets)
        table = {t.name: {d: 1.37e-9 * t.params(d) for d in cs} for t, cs in zip(p.targets, cands)}
        at = plan_latency(p.targets, align(p.targets, p.budget, "gac").dims, table)
        t0 = time.perf_counter()
        planned = align_latency(p.targets, table, at, p.budget)
        dt = time.perf_counter() - t0
        s = planned.stats["solver"]
        print(f"| {label} | {len(p.targets)} | the gac plan's latency | {dt:.2f} | {s['work']:,} | {s['search']} "
              f"| {_load()} |")
        lat = [[table[t.name][d] for d in cs] for t, cs in zip(p.targets, cands)]
        values = [[t.score * (t.params(d) - t.params_star) for d in cs] for t, cs in zip(p.targets, cands)]
        lo, hi = sum(min(x) for x in lat), sum(max(x) for x in lat)
        t0 = time.perf_counter()
        r = solve_latency_budget(lat, values, lo + 0.5 * (hi - lo))
        dt = time.perf_counter() - t0
        print(f"| {label} | {len(p.targets)} | mid budget | {dt:.2f} | {r.stats.get('work', 0):,} | "
              f"{r.stats['search']} | {_load()} |")
    return 0


def _load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
