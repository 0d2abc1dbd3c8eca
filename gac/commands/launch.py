"""``gac launch``: a sweep's status from the results store, and the loopback Slurm cluster."""

from __future__ import annotations

NAME = "launch"
HELP = "the canary that proves a Slurm site, sweep status (done / failed / running / pending), the local cluster"
DESCRIPTION = """\
gac launch canary hydra/launcher=L OVERRIDES...      a two-point sweep (experiment=canary) through the Slurm
                                                     launcher L: gac fetch, the offline check, the submission,
                                                     the jobs and the end-of-sweep job, one PASS/FAIL verdict
                                                     per step with the fix; exit 0 when all pass (step one of
                                                     docs/first-run-on-your-cluster.md)
gac launch status [--results-dir DIR] OVERRIDES...   every point of the sweep the overrides describe (the same
                                                     overrides as `experiments/run.py -m ...`), with its state
                                                     and its Slurm job as squeue shows it (1_0: array 1, task 0);
                                                     for a Slurm sweep, where its end-of-sweep job is (waiting for
                                                     the array, running, or done: the report with the table)
gac launch cluster start|stop [--dir D]              the loopback single-node Slurm cluster (root); gac
                                                     uses only a directory it made; stop cancels its jobs,
                                                     then ends only the daemons it started and the
                                                     processes its jobs left, one line each
"""


def add_arguments(p):
    sub = p.add_subparsers(dest="launch_cmd", metavar="ACTION", required=True)
    k = sub.add_parser("canary", help="prove a Slurm site with a two-point sweep, one verdict per step")
    k.add_argument("overrides", nargs="*", help="hydra/launcher=slurm_h100 and the site's model and gpu, e.g. "
                                                "model=llama3_8b gpu=h100 (hydra.launcher.* settings too)")
    k.add_argument("--timeout-min", type=float, default=30.0, help="how long to wait for the sweep (default 30)")
    k.add_argument("--poll-s", type=float, default=15.0, help="how often to look at it (seconds, default 15)")
    k.add_argument("--config-dir", default=None, help="a directory of your own configs (Hydra's --config-dir)")
    s = sub.add_parser("status", help="list a sweep's points as done, failed, running or pending")
    s.add_argument("overrides", nargs="*", help="sweep overrides, e.g. experiment=table5 or ratio=0.1,0.2")
    s.add_argument("--results-dir", default=None, help="the store (default: the config's results_dir)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c = sub.add_parser("cluster", help="start or stop the loopback Slurm cluster used by the integration tests")
    c.add_argument("action", choices=["install", "start", "stop"])
    c.add_argument("--dir", default=None,
                   help="the cluster's directory (default: gac-slurm in the temp directory): a new or empty one, "
                        "which gac makes and marks, or one it made before; any other is refused")


def run(args) -> int:
    if args.launch_cmd == "canary":
        from gac.launch.canary import run_canary

        return run_canary(args.overrides, config_dir=args.config_dir, timeout_min=args.timeout_min,
                          poll_s=args.poll_s)
    if args.launch_cmd == "cluster":
        from gac.launch import local_cluster

        local_cluster.run_action(args.action, args.dir)
        return 0
    import json

    from gac.launch.status import sweep_end_status, sweep_status

    rows = sweep_status(args.overrides, results_dir=args.results_dir)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    end = sweep_end_status(rows)
    counts: dict[str, int] = {}
    width = max([len(" ".join(r["overrides"])) for r in rows] + [9])
    jw = max([len(r.get("slurm_job") or "") for r in rows] + [0])
    job_head = f"{'slurm':<{jw}}  " if jw else ""
    print(f"{'state':<8} {'key':<16}  {job_head}{'point':<{width}}  detail")
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
        job = f"{r.get('slurm_job') or '':<{jw}}  " if jw else ""
        print(f"{r['state']:<8} {r['key']:<16}  {job}{' '.join(r['overrides']):<{width}}  {r.get('detail') or ''}")
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f" (of {len(rows)})")
    if end is not None:
        print(f"end of sweep: Slurm job {end['end_job']} {end['state']}: {end['detail']}")
    return 0
