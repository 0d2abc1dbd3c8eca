"""``gac demo``: every strategy on a Llama-3-8B-shaped allocation, side by side."""

from __future__ import annotations

NAME = "demo"
HELP = "compare the strategies on a model-shaped allocation problem (synthetic scores, real shapes)"
DESCRIPTION = """\
Builds the low-rank allocation problem of a real model's shapes (Llama-3-8B: 224 projections) with synthetic
importance scores, then runs every strategy under the same parameter budget and prints parameters, budget,
aligned fraction, the Eq. 4 objective and solve time. Shapes are real; scores are not measurements.
"""


def add_arguments(p):
    from gac.align.candidates import DEFAULT_WINDOW
    from gac.align.synthetic import SHAPES
    from gac.checks import arg_type, check_seed

    p.add_argument("--shape", default="llama3_8b", choices=SHAPES)
    p.add_argument("--ratio", type=float, default=0.15, help="compression ratio rho (default 0.15, as Table 5)")
    p.add_argument("--unit", default=8, help="alignment unit: a multiple of 8 or an engine's, e.g. llama.cpp:q4_K")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    p.add_argument("--seed", type=arg_type(check_seed), default=0, help="seed of the synthetic scores (default 0)")
    p.add_argument("--save-allocation", metavar="PATH", help="also write the allocation JSON (input of `gac align`)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --save-allocation file")


def run(args) -> int:
    from gac.align.allocation_io import Allocation, allocation_to_json
    from gac.align.candidates import check_window, resolve_unit
    from gac.align.synthetic import lowrank_problem
    from gac.align.targets import check_ratio
    from gac.commands.align import comparison, format_comparison
    from gac.errors import GacError
    from gac.io import check_output_file, write_output

    check_ratio(args.ratio)  # before any work: a bad value would otherwise print an error on every row, exit 0
    args.unit = resolve_unit(args.unit)
    check_window(args.window)
    if args.save_allocation:
        check_output_file(args.save_allocation, "--save-allocation", args.force)
    prob = lowrank_problem(args.shape, args.ratio, seed=args.seed)
    alloc = Allocation(prob.targets, prob.budget, args.unit, args.window)
    rows = comparison(alloc, args.unit, args.window)
    refused = [(name, p) for name, p in rows if isinstance(p, GacError)]
    if refused:  # a table with error rows, exit 0, would read as a result
        name, e = refused[0]
        raise GacError(f"--unit {args.unit} --window {args.window} --ratio {args.ratio}: strategy {name} cannot plan "
                       f"this problem ({e}); give a smaller --unit (8, 16, 32 or 64) or --ratio")
    print(f"{args.shape}: {len(prob.targets)} low-rank targets, full size {prob.full_params:,} parameters, "
          f"ratio {args.ratio} -> budget {prob.budget:,} (synthetic scores, real shapes)\n")
    print(format_comparison(alloc, args.unit, args.window, rows))
    if args.save_allocation:
        write_output(args.save_allocation, allocation_to_json(alloc), "--save-allocation", args.force)
        print(f"\nallocation written to {args.save_allocation}; try: gac align {args.save_allocation} --compare")
    return 0
