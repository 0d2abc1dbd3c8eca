"""``gac wandb backfill``: W&B runs for the store's records that have none (skipped points, disk-logger runs)."""

from __future__ import annotations

NAME = "wandb"
RESUMES = True  # Ctrl-C: a re-run logs only the records still without a run
HELP = "create W&B runs from the results store (points skipped or run with the disk logger)"
DESCRIPTION = """\
gac wandb backfill RESULTS_DIR [--where KEY=VALUE ...] [--experiment E] [--sweep S] [--mode offline|online]
  One W&B run per completed record (the latest per key) that no W&B run has logged yet: the same name (the point's
  overrides), tags, config and quality/ latency/ plan/ time/ metrics a live logger=wandb job writes, grouped by the
  record's sweep. Offline by default: runs land under RESULTS_DIR/wandb; `wandb sync RESULTS_DIR/wandb/offline-run-*`
  uploads them. A record already logged (live or by an earlier backfill; see RESULTS_DIR/runs/<key>.jsonl) is left
  alone unless --force. --dry-run lists what would be logged.
Examples:
  gac wandb backfill results/ --experiment table5
  gac wandb backfill results/ --where compressor=asvd --mode online --project my-gac
"""


def add_arguments(p):
    sub = p.add_subparsers(dest="wandb_cmd", metavar="ACTION", required=True)
    b = sub.add_parser("backfill", help="a W&B run for every record that has none yet")
    b.add_argument("results_dir", metavar="RESULTS_DIR")
    b.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep records whose job field, key or config path equals VALUE (repeatable; as gac bench)")
    b.add_argument("--experiment", help="keep records of this experiment")
    b.add_argument("--sweep", help="keep records of this sweep label")
    b.add_argument("--project", default="gac", help="W&B project (default gac)")
    b.add_argument("--entity", default=None, help="W&B entity (default: yours)")
    b.add_argument("--mode", default="offline", choices=["offline", "online"], help="default offline")
    b.add_argument("--tag", action="append", default=[], help="an extra tag (repeatable)")
    b.add_argument("--force", action="store_true", help="log records that already have a W&B run again")
    b.add_argument("--dry-run", action="store_true", help="list what would be logged, log nothing")


def run(args) -> int:
    import os

    from gac.jobs.tracking.loggers import backfill_wandb, check_wandb_names
    from gac.results import ResultsStore
    from gac.results.query import parse_where, select_records

    check_wandb_names(args.project, args.entity, args.tag, "--")  # before the store is read
    store = ResultsStore(args.results_dir).require()
    records = select_records(list(store.iter_records()), parse_where(args.where), args.sweep, args.experiment)
    os.environ.setdefault("WANDB_SILENT", "true")
    rows = backfill_wandb(store.root, sorted(records, key=lambda r: r["key"]), project=args.project,
                          entity=args.entity, mode=args.mode, tags=args.tag, force=args.force, dry_run=args.dry_run)
    for r in rows:
        print(f"{r['action']:<9} {r['key']}  {r['name']}" + (f"  (run {r['run_id']})" if r.get("run_id") else ""))
    n = sum(r["action"] == "logged" for r in rows)
    if n and args.mode == "offline":
        print(f"{n} offline run(s) under {store.root / 'wandb'}; upload: wandb sync {store.root / 'wandb'}/offline-run-*")
    return 0
