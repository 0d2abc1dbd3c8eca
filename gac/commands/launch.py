"""``gac launch``: a sweep's status from the results store, and the loopback Slurm cluster."""

from __future__ import annotations

NAME = "launch"
HELP = "sweep status (done / failed / running / pending) and the local Slurm cluster"
DESCRIPTION = """\
gac launch status [--results-dir DIR] OVERRIDES...   every point of the sweep the overrides describe (the same
                                                     overrides as `experiments/run.py -m ...`), with its state
                                                     and its Slurm job as squeue shows it (1_0: array 1, task 0);
                                                     for a Slurm sweep, where its end-of-sweep job is (waiting for
                                                     the array, running, or done: the report with the table)
gac launch cluster start|stop [--dir D]              the loopback single-node Slurm cluster (root); gac
                                                     uses only a directory it made, and stops only the
                                                     daemons it started
"""


def add_arguments(p):
    sub = p.add_subparsers(dest="launch_cmd", metavar="ACTION", required=True)
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
