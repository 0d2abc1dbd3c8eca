"""``gac report``: the paper's tables and figures from a results store."""

from __future__ import annotations

NAME = "report"
HELP = "write Table 5, ratio sweeps, proxy comparison and latency figures from a results store"
DESCRIPTION = """\
Read every completed record under RESULTS_DIR (the results_dir jobs wrote to) and write into OUT_DIR the
tables (markdown and/or LaTeX) and figures (PNG and PDF) the results support: Table 5 per model/GPU/ratio
(a latency-budget plan's row naming its budget and whether it held), ratio sweeps, latency across sequence
lengths, quality against measured latency when latency-budget plans (align=gac_latency) ran, the proxy
comparison, and kernel staircases for each --profile. OUT_DIR/index.md lists what was written and what was skipped. A non-empty OUT_DIR is refused
unless --force. Exit code 2 on bad input (missing or empty store, a corrupt record).

Records that differ in any setting (align.window, eval.limit, ...) are never merged into one row and never
hidden: a table or figure that would mix them is written once per setting, its name and caption naming the
setting; only re-runs of the same job (one record key) collapse to the latest. --sweep, --experiment and
--where KEY=VALUE (a config key such as align.window or eval.limit, repeatable) keep a subset.
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
    p.add_argument("--sweep", default=None, help="only the records of this sweep label (the baseline is shared)")
    p.add_argument("--experiment", default=None, help="only the records of this experiment label")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="only records whose config KEY (e.g. align.window, eval.limit) equals VALUE; repeatable: one key "
                        "given twice keeps either value (OR), different keys must all match (AND)")


def _split(text: str) -> list[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def _where(args) -> dict:
    from gac.results.query import parse_where

    where = parse_where(args.where)  # the one --where rule (gac.results.query), as gac bench and gac wandb backfill
    for name in ("sweep", "experiment"):
        if getattr(args, name) is not None:
            where[name] = getattr(args, name)
    return where


def run(args) -> int:
    from gac.analysis import load_results, write_report
    from gac.io import check_not_dash

    check_not_dash(args.out, "-o", "a report directory")
    where = _where(args)
    df = load_results(args.results_dir)
    rep = write_report(df, args.out, table_formats=_split(args.format), figure_formats=_split(args.figures),
                       profiles=args.profile, force=args.force, where=where or None)
    print(f"gac report: {len(df)} records -> {len(rep.written)} files in {rep.out_dir} "
          f"({len(rep.skipped)} artefacts skipped; see index.md)")
    for p in rep.written:
        print(f"  {p.name}")
    return 0
