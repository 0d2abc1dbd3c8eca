"""``gac profile``: inspect hardware profiles (measure them with ``python experiments/profile_device.py``)."""

from __future__ import annotations

NAME = "profile"
HELP = "show a hardware profile, its cliffs and alignment rules, or redraw its figures"
DESCRIPTION = (
    "Inspect a hardware profile directory written by `python experiments/profile_device.py`.\n"
    "  gac profile show DIR      device, software stack, protocol and sweeps\n"
    "  gac profile cliffs DIR    Table 4-like constraints, kernel tiers, SDPA backends, cliff dims\n"
    "  gac profile figures DIR   redraw the figures into DIR/figures (or --out)"
)


def add_arguments(parser) -> None:
    import argparse

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("action", choices=["show", "cliffs", "figures"], help="what to do")
    parser.add_argument("profile_dir", help="a profile directory (holds profile.json)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="cliff tolerance (default 0.05 = 5%%)")
    parser.add_argument(
        "--horizon", type=int, default=64, help="how far above d a faster dim may lie (default 64)"
    )
    parser.add_argument("--out", default=None, help="figures: output directory (default PROFILE_DIR/figures)")


def run(args) -> int:
    import math
    from pathlib import Path

    from gac.errors import GacError
    from gac.profiling import HardwareProfile, analyze, sdpa_backend_table, summarize, tier_table
    from gac.profiling.figures import save_figures
    from gac.profiling.profile import is_derived_sweep

    if not (math.isfinite(args.tolerance) and 0 <= args.tolerance < 1):
        raise GacError(f"--tolerance must be a fraction in [0, 1) (the default 0.05 is 5%), got {args.tolerance}")
    if not 1 <= args.horizon < 2**31:  # past 2**31 it overflows the table's integers: no kernel is that wide
        raise GacError(f"--horizon must be a positive number of dims below 2**31 (how far above d a faster dim may "
                       f"lie; default 64), got {args.horizon}")
    prof = HardwareProfile.load(args.profile_dir)
    if args.action == "figures":
        from gac.io import check_writable
        from gac.layout import owned_directory

        out = Path(args.out or Path(args.profile_dir) / "figures")
        if out.exists() and not out.is_dir():
            raise GacError(f"--out {str(out)!r} is a file; give a directory for the figures")
        owner = owned_directory(out)
        if owner:
            raise GacError(f"--out {str(out)!r} {owner}; give the figures a directory of their own")
        check_writable(out, "figures directory", probe_bytes=1)  # before drawing anything
    if args.action == "show":
        print(prof.describe())
        return 0
    if args.action == "figures":
        for p in save_figures(prof, args.out or Path(args.profile_dir) / "figures"):
            print(p)
        return 0
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print("Alignment constraints (Table 4-like)")
        print(summarize(prof.table, args.tolerance, args.horizon).to_string(index=False))
        tiers = tier_table(prof.table)
        if len(tiers):
            print("\nGEMM/GEMV kernel tiers (Table 3-like)")
            print(tiers.to_string(index=False))
        backends = sdpa_backend_table(prof.table)
        if len(backends):
            print("\nSDPA backends")
            print(backends.to_string(index=False))
    print("\nCliff dims per sweep")
    for sweep in prof.sweeps():
        if sweep == "target":
            for ctx in prof.contexts():
                a = analyze(prof.table, "target", args.tolerance, None, context=ctx)
                print(f"  {ctx}: {a.cliffs or '-'}")
            continue
        if is_derived_sweep(sweep):
            print(f"  {sweep}: not analysed (a median-filtered curve as drawn in a figure, not measurements)")
            continue
        a = analyze(prof.table, sweep, args.tolerance, args.horizon)
        print(f"  {sweep}: {a.cliffs or '-'}")
    return 0
