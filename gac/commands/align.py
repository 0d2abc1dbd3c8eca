"""``gac align``: aligned dimensions for any compressor's allocation (bring your own compressor)."""

from __future__ import annotations

import json
import sys

NAME = "align"
HELP = "choose aligned dimensions for an allocation JSON under its parameter budget"
DESCRIPTION = """\
Read an allocation (budget, targets with d*, score, params_per_dim, optional d_max/candidates) and write a
plan: one dimension per target, its parameter count, the objective of Eq. 4 and the aligned fraction.
Exit code 2 on bad input (the message names the problem); no output file is written then.
"""


def add_arguments(p):
    from gac.registry import LATENCY_STRATEGIES, STRATEGIES

    p.add_argument("allocation", metavar="ALLOCATION.json", help="input allocation (format: docs/algorithm.md, 'The gac align file format')")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan here (default, or -: print it)")
    p.add_argument("--strategy", default="gac", help=f"one of: {', '.join(STRATEGIES)} (default: gac); "
                   f"{', '.join(LATENCY_STRATEGIES)} with a latency budget and per-target latencies in the file")
    p.add_argument("--unit", default=None,
                   help="alignment unit (overrides the file's; default 8): a multiple of 8 or an engine's, e.g. llama.cpp:q4_K")
    from gac.align.candidates import DEFAULT_WINDOW

    p.add_argument("--window", type=int, default=None, help=f"candidate window in units (default: the file's, else "
                   f"{DEFAULT_WINDOW} = the two aligned dims bracketing d*)")
    p.add_argument("--compare", action="store_true", help="also print a table of every strategy on stderr")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")


def run(args) -> int:
    from gac.align.allocation_io import load_allocation
    from gac.io import check_output_file, write_output
    from gac.registry import LATENCY_STRATEGIES, STRATEGIES

    if args.strategy not in LATENCY_STRATEGIES:
        args.strategy = STRATEGIES.resolve(args.strategy, extra=LATENCY_STRATEGIES)
    from gac.align.candidates import check_window, resolve_unit

    if args.unit is not None:
        args.unit = resolve_unit(args.unit)  # before reading anything
    if args.window is not None:
        check_window(args.window)
        from gac.jobs.config.axes import axis_of, refusal, window_unused

        why = window_unused(args.strategy)
        if why:  # the sweep refuses align.window under these strategies too
            raise refusal(f"--window {args.window}", axis_of("align.window"), why)
    if args.output == "-":  # the plan is text: '-' is stdout, as without -o (no summary line then)
        args.output = None
    if args.output:
        check_output_file(args.output, "-o", args.force, inputs=[args.allocation])
    alloc = load_allocation(args.allocation)
    unit = alloc.unit if args.unit is None else args.unit
    window = alloc.window if args.window is None else args.window
    plan = solve(alloc, args.strategy, unit, window, args.allocation)
    if args.compare:
        print(format_comparison(alloc, unit, window), file=sys.stderr)
    out = plan.to_json()
    if args.output:
        write_output(args.output, out, "-o", args.force, inputs=[args.allocation])
        print(
            f"{plan.strategy}: {len(plan.dims)} targets, params {plan.params:,} / budget {plan.budget:,}, "
            f"aligned {plan.aligned_fraction:.0%} at unit {unit} ({by_unit(plan)}), objective {plan.objective:.6g}"
            f"{latency_line(plan)} -> {args.output}"
        )
    else:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


def solve(alloc, strategy: str, unit: int, window: int, source: str = "allocation"):
    """The plan of ``strategy`` for ``alloc``; with latencies in the file, its summed latency in
    ``plan.stats["latency"]`` (for ``gac_latency``, the latency budget's accounting)."""
    from gac.align.latency_budget import align_latency, plan_latency
    from gac.align.strategies import align
    from gac.errors import GacError

    if strategy == "gac_latency":
        if alloc.latency is None or alloc.latency_budget_ms is None:
            raise GacError(f"{source}: strategy 'gac_latency' needs 'latency_budget_ms' and every target's "
                           f"'latency_ms' (its latency at each candidate dimension) in the allocation")
        return align_latency(alloc.targets, alloc.latency, alloc.latency_budget_ms, alloc.budget, unit, window,
                             fixed_ms=alloc.latency_fixed_ms)
    plan = align(alloc.targets, alloc.budget, strategy, unit=unit, window=window)
    if alloc.latency is not None:
        ms = plan_latency(alloc.targets, plan.dims, alloc.latency, alloc.latency_fixed_ms)
        info = {"latency_ms": ms, "fixed_ms": alloc.latency_fixed_ms}
        if alloc.latency_budget_ms is not None:
            info.update(latency_budget_ms=alloc.latency_budget_ms,
                        within_latency_budget=None if ms is None else ms <= alloc.latency_budget_ms)
        plan.stats["latency"] = info
    return plan


def _latency_cell(plan) -> str:
    ms = plan.stats.get("latency", {}).get("latency_ms")
    return "-" if ms is None else f"{ms:.6g}"


def latency_line(plan) -> str:
    """``, latency 1.23 ms / budget 1.25 ms (held)`` when the plan has latencies, else empty."""
    info = plan.stats.get("latency")
    if not info or info.get("latency_ms") is None:
        return ""
    budget = info.get("budget_ms", info.get("latency_budget_ms"))
    if budget is None:
        return f", latency {info['latency_ms']:.6g} ms"
    held = info.get("held", info.get("within_latency_budget"))
    return f", latency {info['latency_ms']:.6g} ms / budget {budget:.6g} ms ({'held' if held else 'over'})"


def by_unit(plan) -> str:
    """The aligned fraction at 8, 16 and 32, e.g. ``8: 100%, 16: 52%, 32: 27%``."""
    return ", ".join(f"{u}: {plan.aligned_by_unit[u]:.0%}" for u in (8, 16, 32) if u in plan.aligned_by_unit)


def comparison(alloc, unit: int, window: int) -> list:
    """``(strategy, plan or the GacError it refused with)`` for every strategy (``gac_latency`` too when the
    allocation has a latency budget)."""
    from gac.align.strategies import STRATEGIES
    from gac.errors import GacError

    out = []
    for name in [*STRATEGIES] + (["gac_latency"] if alloc.latency_budget_ms is not None else []):
        try:
            out.append((name, solve(alloc, name, unit, window)))
        except GacError as e:
            out.append((name, e))
    return out


def format_comparison(alloc, unit: int, window: int, rows: list | None = None) -> str:
    from gac.errors import GacError

    lines = [
        f"{'strategy':<14} {'params':>16} {'budget':>16} {'met':>4} {'align%':>7} {'@8':>5} {'@16':>5} {'@32':>5} "
        f"{'objective':>14} {'ms':>8}" + (f" {'latency_ms':>12}" if alloc.latency is not None else ""),
    ]
    for name, p in comparison(alloc, unit, window) if rows is None else rows:
        if isinstance(p, GacError):
            lines.append(f"{name:<14} error: {p}")
            continue
        lines.append(
            f"{name:<14} {p.params:>16,} {p.budget:>16,} {'yes' if p.budget_met else 'NO':>4} "
            f"{100 * p.aligned_fraction:>6.1f}% "
            + " ".join(f"{100 * p.aligned_by_unit.get(u, float('nan')):>4.0f}%" for u in (8, 16, 32))
            + f" {p.objective:>14.6g} {1000 * p.stats['time_s']:>8.2f}"
            + (f" {_latency_cell(p):>12}" if alloc.latency is not None else "")
        )
    return "\n".join(lines)
