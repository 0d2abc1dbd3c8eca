"""``gac report``: the paper's tables and figures from a results store."""

from __future__ import annotations

NAME = "report"
HELP = "write Table 5, ratio sweeps, proxy comparison and latency figures from a results store"
DESCRIPTION = """\
Read every completed record under RESULTS_DIR (the results_dir jobs wrote to) and write into OUT_DIR the
tables (markdown and/or LaTeX) and figures (PNG and PDF) the results support: Table 5 per model/GPU/ratio,
ratio sweeps, latency across sequence lengths, the proxy comparison, and kernel staircases for each
--profile. OUT_DIR/index.md lists what was written and what was skipped. A non-empty OUT_DIR is refused
unless --force. Exit code 2 on bad input (missing or empty store, a corrupt record).
"""


def add_arguments(p):
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="results store directory (holds records/)")
    p.add_argument("-o", "--out", "--output", dest="out", metavar="OUT_DIR", required=True,
                   help="directory for the tables and figures")
    p.add_argument("--format", default="md,tex", help="table formats, comma-separated: md, tex (default: md,tex)")
    p.add_argument("--figures", default="png,pdf", help="figure formats, comma-separated (default: png,pdf)")
    p.add_argument("--profile", action="append", default=[], metavar="PROFILE_DIR",
                   help="a hardware profile directory: also plot its kernel staircases (repeatable)")
    p.add_argument("--force", action="store_true", help="write into a non-empty OUT_DIR, replacing same-named files")


def _split(text: str) -> list[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def run(args) -> int:
    from gac.analysis import load_results, write_report

    df = load_results(args.results_dir)
    rep = write_report(df, args.out, table_formats=_split(args.format), figure_formats=_split(args.figures),
                       profiles=args.profile, force=args.force)
    print(f"gac report: {len(df)} records -> {len(rep.written)} files in {rep.out_dir} "
          f"({len(rep.skipped)} artefacts skipped; see index.md)")
    for p in rep.written:
        print(f"  {p.name}")
    return 0
