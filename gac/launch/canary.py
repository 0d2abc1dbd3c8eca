"""The canary: a two-point sweep through the real Slurm launcher that proves a site before a 4-hour queue.

``gac launch canary hydra/launcher=slurm_h100 model=llama3_8b gpu=h100`` runs, in order, what a Table 5 sweep
needs, cut small (``conf/experiment/canary.yaml``: calibration, a short sensitivity search, perplexity, lm-eval's
PiQA and HellaSwag, prefill latency, the end-of-sweep bench), and prints one verdict per step, each failure with
its fix:

=================  ============================================================================================
step               what passes
=================  ============================================================================================
site files         ``conf/local/slurm.yaml`` and ``default.yaml`` read as settings
fetch              ``gac fetch`` brings every input of the two points into the caches
offline            ``gac fetch --check`` with ``HF_HUB_OFFLINE=1`` finds all of them there
submit             the installed ``gac-run`` app, ``-m experiment=canary`` (``wait=false``, the hub offline), passes
                   the sweep check, the site checks against ``sinfo`` and the offline check, and submits the array
                   and the end-of-sweep job
preflight          every job got past its preflight (a record or a failure record; a refusal leaves neither)
points             both points finished (perplexity, the two tasks, latency)
lm-eval data       every task scored all its items, from the data it names
env file           every job read the launch's private environment file (its record names it), and the
                   end-of-sweep job removed it
GPU request        the array asked for the GPU ``gpu=`` names (typed GRES, or a constraint) and the jobs got one
end of sweep       the end-of-sweep job ran after the array, benched and wrote its report
time               all of it within ``--timeout-min`` (default 30)
=================  ============================================================================================

It waits with a progress line whenever a point or the end-of-sweep job changes state; exit 0 only when every step
passed. A step that runs past its limit (:data:`FETCH_LIMIT_S`, :data:`SUBMIT_LIMIT_S`) is a ``FAIL`` naming the
limit, never a traceback; an app this Python cannot import is a ``submit`` ``FAIL`` before anything is fetched. Its
records go to its own store in the sweep directory (``<sweep dir>/results``), so the canary runs afresh each time
and never mixes with a real sweep's; the node report (:mod:`gac.jobs.doctor.report`: the estimates against what the
node measured) is written beside them (``node-report.json``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gac.errors import GacError
from gac.hub import OFFLINE_VARS
from gac.machine import file_stamp

#: where this gac is imported from (a checkout, or site-packages for a wheel): the submitting app imports it from there
ROOT = Path(__file__).resolve().parents[2]
#: the Hydra app that submits the sweep: the function the ``gac-run`` console script runs (pyproject.toml), with the
#: Slurm launcher it registers; started by this Python, so the command is the same from a checkout and from a wheel
#: (which has no experiments/ directory)
APP = ("gac.commands.hydra_apps", "run")
LAUNCHER = "hydra_plugins.gac_launcher.gac_launcher"
#: how long ``gac fetch`` (and its offline check) and the submission may take before the step is a FAIL
FETCH_LIMIT_S = 3600
SUBMIT_LIMIT_S = 1800
#: the overrides the canary sets itself: a command line that gives them is refused (the fix says why)
OWN = {"experiment": "the canary is its own experiment (conf/experiment/canary.yaml); drop it",
       "results_dir": "the canary keeps its records in its own store, <sweep dir>/results (set hydra.sweep.dir to "
                      "move it)",
       "hydra.launcher.wait": "the canary submits with wait=false and waits itself, saying where the sweep is"}
REPORT = "node-report.json"


@dataclass
class Verdict:
    step: str
    ok: bool | None  # None: not applicable here (said why)
    detail: str
    fix: str | None = None

    def line(self) -> str:
        word = {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]
        return f"  {word}  {self.step:<13} {self.detail}" + (f"\n        fix: {self.fix}" if self.fix else "")


@dataclass
class Canary:
    overrides: list[str]
    sweep_dir: Path
    config_dir: str | None = None
    timeout_min: float = 30.0
    poll_s: float = 15.0
    out: Callable[[str], None] = print
    verdicts: list[Verdict] = field(default_factory=list)
    t0: float = field(default_factory=time.time)

    @property
    def results_dir(self) -> Path:
        return self.sweep_dir / "results"

    def say(self, v: Verdict) -> Verdict:
        self.verdicts.append(v)
        self.out(v.line())
        return v

    def elapsed(self) -> str:
        s = int(time.time() - self.t0)
        return f"{s // 60:d}:{s % 60:02d}"


def check_command_line(overrides: Sequence[str]) -> None:
    """The canary's command line: a Slurm launcher named (``hydra/launcher=slurm_*``), nothing the canary sets itself,
    nothing swept (its two points are its own). Raises :class:`GacError` naming the fix."""
    from gac.jobs.config.command_line import is_swept

    launchers = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") == "hydra/launcher"]
    if not launchers:
        raise GacError("the canary proves a Slurm site: name its launcher, e.g. gac launch canary "
                       "hydra/launcher=slurm_h100 model=llama3_8b gpu=h100 (hydra/launcher=slurm_local on the "
                       "loopback cluster)")
    name = launchers[-1].split("=", 1)[1]
    if not name.startswith("slurm"):
        raise GacError(f"hydra/launcher={name} is not a Slurm launcher; the canary proves a Slurm site: "
                       f"hydra/launcher=slurm_h100, slurm_a100 or slurm_local (conf/hydra/launcher/)")
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in OWN:
            raise GacError(f"{o}: {OWN[key]}")
        if key != "hydra/launcher" and not key.startswith("hydra.") and is_swept(o):
            raise GacError(f"{o}: the canary's two points are its own (align=unaligned,gac); give one value")


def _cli(args: Sequence[str], env: dict | None = None, timeout: float = FETCH_LIMIT_S) -> subprocess.CompletedProcess:
    """``gac ARGS`` by this Python; raises :class:`subprocess.TimeoutExpired` (the child killed) past ``timeout``."""
    return subprocess.run([sys.executable, "-m", "gac.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _text(out) -> str:
    """A process's output as text: a :class:`subprocess.TimeoutExpired` holds bytes (or None) even with text=True."""
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error:" in ln]
    return (errs[-1] if errs else lines[-1] if lines else "no output")[:600]


def _fix_of(line: str) -> str:
    """The fix a one-line error names (what follows its last ';'), else the line itself."""
    return line.rsplit("; ", 1)[-1] if "; " in line else line


def step_site_files(c: Canary) -> Verdict:
    from gac.jobs.config.compose import CONF_DIR
    from gac.jobs.sweep.site_files import check_site_files

    dirs = [CONF_DIR] + ([c.config_dir] if c.config_dir else [])
    try:
        for d in dirs:
            check_site_files(d)
    except GacError as e:
        return Verdict("site files", False, str(e), _fix_of(str(e)))
    have = [str(p) for d in dirs for p in (Path(d) / "local" / "slurm.yaml", Path(d) / "local" / "default.yaml")
            if p.exists()]
    return Verdict("site files", True, ", ".join(have) + " read" if have else
                   "none (the launcher's shipped settings; your site's go in conf/local/slurm.yaml)")


def app_command() -> list[str]:
    """The ``gac-run`` app (:data:`APP`) run by this Python with this gac (:data:`ROOT` first on its path)."""
    module, function = APP
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.argv[0] = 'gac-run'; "
                                  f"from {module} import {function}; {function}()"]


def check_app() -> Verdict | None:
    """The submitting app and its Slurm launcher importable from :data:`ROOT` by this Python, before anything is
    fetched: else a ``submit`` FAIL naming the fix (None when both are there)."""
    import importlib.util

    for module, what in ((APP[0], "gac's Hydra app (gac-run)"), (LAUNCHER, "gac's Slurm launcher for Hydra")):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return Verdict("submit", False, f"{what}, {module}, cannot be imported by {sys.executable}",
                           f"reinstall gac into this Python (pip install gac, or pip install -e . in a checkout), "
                           f"which installs {module.split('.')[0]}; then run the canary again")
    return None


def step_fetch(c: Canary, task: list[str]) -> Verdict:
    try:
        r = _cli(["fetch", *task])
    except subprocess.TimeoutExpired as e:
        return Verdict("fetch", False, f"gac fetch did not finish within the canary's {_minutes(e.timeout)} (stopped); "
                       f"what it fetched stays in the caches", f"run `gac fetch {' '.join(task)}` yourself where the "
                       f"hub is reachable, with the caches the jobs use, until it ends; then run the canary again")
    if r.returncode != 0:
        err = _last_error(r.stderr + r.stdout)
        return Verdict("fetch", False, err, f"{_fix_of(err)} (or run `gac fetch {' '.join(task)}` where the hub "
                                            f"is reachable, with the caches the jobs use)")
    got = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("fetching")]
    return Verdict("fetch", True, f"gac fetch: {len(got)} input(s) fetched, the rest already in the caches")


def step_offline(c: Canary, task: list[str]) -> Verdict:
    env = {**os.environ, **dict.fromkeys(OFFLINE_VARS, "1")}
    try:
        r = _cli(["fetch", "--check", "--json", *task], env=env)
    except subprocess.TimeoutExpired as e:
        return Verdict("offline", False, f"gac fetch --check did not finish within the canary's {_minutes(e.timeout)} "
                       f"(stopped): reading the caches hangs", f"check that the caches' file system answers (ls "
                       f"$HF_HOME); `HF_HUB_OFFLINE=1 gac fetch --check {' '.join(task)}` shows where it stops")
    try:
        data = json.loads(r.stdout)
    except ValueError:
        err = _last_error(r.stderr + r.stdout)
        return Verdict("offline", False, err, _fix_of(err))
    if r.returncode != 0 or data.get("missing"):
        gone = [i["input"] for i in data.get("inputs", []) if i.get("missing") and i["missing"] != "unknown"]
        return Verdict("offline", False, f"{len(gone)} input(s) missing offline: {', '.join(gone[:3])}",
                       data.get("fix") or f"gac fetch {' '.join(task)}")
    caches = ", ".join(f"{k}={v}" for k, v in (data.get("caches") or {}).items())
    return Verdict("offline", True, f"{len(data.get('inputs', []))} input(s) in the caches ({caches})")


def _status(c: Canary) -> str:
    """The command that lists the canary's points (its own store) and where its end-of-sweep job is."""
    return f"gac launch status --results-dir {c.results_dir} {' '.join(_task(c))}"


def queued_jobs(c: Canary, output: str) -> list[str]:
    """The Slurm jobs a submission that did not finish may have queued: those its output names and those with a
    folder in ``<sweep dir>/.submitit`` (``7_0``: array 7), in order."""
    ids = re.findall(r"\b(?:array job|end-of-sweep job) (\d+)", output)
    folder = c.sweep_dir / ".submitit"
    if folder.is_dir():
        ids += sorted((p.name.split("_")[0] for p in folder.iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)),
                      key=int)
    return list(dict.fromkeys(ids))


def submit(c: Canary, task: list[str], hydra: list[str]) -> tuple[Verdict, dict]:
    """The ``gac-run`` app (:func:`app_command`), ``-m experiment=canary`` with ``wait=false``, the hub offline: the
    sweep check, the site checks and the submission; ``{"array", "end"}`` the Slurm jobs."""
    args = [*app_command(), "-m", *hydra, *task, f"results_dir={c.results_dir}", f"hydra.sweep.dir={c.sweep_dir}",
            "hydra.launcher.wait=false"]
    if c.config_dir:
        args.append(f"--config-dir={c.config_dir}")
    env = {**os.environ, **dict.fromkeys(OFFLINE_VARS, "1"), "PYTHONUNBUFFERED": "1"}
    try:
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=SUBMIT_LIMIT_S)
    except subprocess.TimeoutExpired as e:  # stopped, but sbatch may have queued the array already
        jobs = queued_jobs(c, _text(e.stdout) + _text(e.stderr))
        held = (f"it may have queued Slurm job(s) {', '.join(jobs)}" if jobs else
                "no job id in its output so far, but sbatch may have queued the array")
        return Verdict("submit", False, f"the submission did not finish within the canary's {_minutes(e.timeout)} "
                       f"(stopped); {held} (sweep dir {c.sweep_dir})",
                       f"`{_status(c)}` and `squeue --me` say what is queued; "
                       + (f"scancel {' '.join(jobs)} stops it; " if jobs else "scancel the canary's jobs; ")
                       + "then run the canary again in a new sweep directory"), {}
    m = re.search(r"submitted as array job (\S+); the end-of-sweep job (\S+) ", r.stdout)
    if r.returncode != 0 or m is None:
        err = _last_error(r.stderr + r.stdout)
        return Verdict("submit", False, err, _fix_of(err)), {}
    gres = [ln.strip() for ln in r.stdout.splitlines() if ln.startswith("Slurm: asking for")]
    return (Verdict("submit", True, f"array job {m.group(1)}, end-of-sweep job {m.group(2)} (afterany)"
                    + (f"; {gres[0]}" if gres else "")), {"array": m.group(1), "end": m.group(2)})


def wait(c: Canary, points: list[dict], jobs: dict) -> bool:
    """Poll the points' states and the end-of-sweep job until its report is written (True) or the time is up."""
    from gac.jobs.sweep.end import REPORT as END_REPORT
    from gac.launch.status import SLURM_ALIVE, point_state, slurm_state
    from gac.results import ResultsStore

    deadline = c.t0 + c.timeout_min * 60
    last = None
    report = c.sweep_dir / f"{END_REPORT}.json"
    while True:
        if report.exists():
            return True
        store = ResultsStore(c.results_dir)
        states: dict[str, int] = {}
        stages = []
        for p in points:
            st = point_state(store, p["key"]) if store.root.is_dir() else {"state": "pending"}
            states[st["state"]] = states.get(st["state"], 0) + 1
            if st.get("stage"):
                stages.append(st["stage"])
        end = slurm_state(jobs["end"]) or "unknown"
        line = (", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                + (f" (stage {', '.join(stages)})" if stages else "") + f"; end-of-sweep job {jobs['end']}: "
                + end.lower())
        if line != last:
            c.out(f"  [{c.elapsed():>6}] {line}")
            last = line
        if end not in SLURM_ALIVE and end not in ("PENDING", "unknown") and not report.exists():
            time.sleep(2)  # its report is written before it ends: a last look
            return report.exists()
        if time.time() > deadline:
            return False
        time.sleep(c.poll_s)


def judge(c: Canary, points: list[dict], jobs: dict, ended: bool) -> list[dict]:
    """The verdicts of what the jobs left: records, failures, the env file, the GPU request, the end's report."""
    from gac.jobs.sweep.end import read_report
    from gac.results import ResultsStore

    store = ResultsStore(c.results_dir)
    records, failures = {}, {}
    try:
        for r in store.iter_records(include_failures=True) if store.root.is_dir() else ():
            (records if r.get("status") == "completed" else failures)[r["key"]] = r
    except GacError as e:  # a record that cannot be read: said, and judged on the others
        c.say(Verdict("records", False, str(e), _fix_of(str(e))))
    report = read_report(c.sweep_dir) or {}
    failed = {str(f.get("key")): f for f in report.get("failed") or [] if isinstance(f, dict)}
    logs = f"{c.sweep_dir}/.submitit/{jobs['array']}_*/*.err"

    ran = [p for p in points if p["key"] in records or p["key"] in failures]
    if len(ran) == len(points):
        c.say(Verdict("preflight", True, f"{len(points)} job(s) got past their preflight"))
    else:
        p = next(p for p in points if p not in ran)
        why = (failed.get(p["key"]) or {}).get("detail") or f"no record and no failure record; its log: {logs}"
        c.say(Verdict("preflight", False, f"[{' '.join(p['overrides'])}]: {why}", _fix_of(str(why))))

    done = [p for p in points if p["key"] in records]
    if len(done) == len(points):
        c.say(Verdict("points", True, ", ".join(
            f"[{' '.join(o for o in p['overrides'] if o.startswith('align='))}] "
            + ", ".join(f"{k} {v:.4g}" for k, v in records[p["key"]]["metrics"].items()
                        if k.startswith("ppl_") or k == "prefill_ms") for p in points)))
    else:
        p = next(p for p in points if p not in done)
        why = (failures.get(p["key"]) or {}).get("error") or (failed.get(p["key"]) or {}).get("detail") or (
            f"no record; its log: {logs}")
        c.say(Verdict("points", False, f"{len(done)} of {len(points)} done; [{' '.join(p['overrides'])}]: {why}",
                      _fix_of(str(why))))

    limit = None
    bad_tasks, sources = [], set()
    for r in records.values():
        limit = ((r.get("config") or {}).get("eval") or {}).get("limit")
        tasks = (r.get("evaluation") or {}).get("tasks") or {}
        for name in (r.get("config") or {}).get("eval", {}).get("tasks") or []:
            t = tasks.get(name) or {}
            sources.add(f"{name}: {t.get('source')}")
            if not t.get("n") or (limit and t["n"] < limit):
                bad_tasks.append(f"{name} scored {t.get('n') or 0} of {limit} items")
    if not records:
        c.say(Verdict("lm-eval data", False, "no point finished: nothing scored", "fix the points above first"))
    elif bad_tasks:
        c.say(Verdict("lm-eval data", False, "; ".join(bad_tasks),
                      f"gac fetch {' '.join(_task(c))} (lm-eval's task data into HF_DATASETS_CACHE)"))
    else:
        c.say(Verdict("lm-eval data", True, f"{limit} items per task; " + "; ".join(sorted(sources))))

    files = {(r.get("provenance") or {}).get("launch_env_file") for r in records.values()}
    left = list(c.sweep_dir.glob(".gac-env-*.sh"))
    if not records:
        c.say(Verdict("env file", False, "no record to tell", "fix the points above first"))
    elif None in files:
        c.say(Verdict("env file", False, "a job ran without the launch's environment file (its record names none)",
                      "every node must mount the sweep directory (hydra.sweep.dir) at the same path; check "
                      "hydra.launcher.setup for a line that resets the environment"))
    elif left and ended:
        c.say(Verdict("env file", False, f"read by every job, but {left[0]} is still there after the end-of-sweep "
                      f"job", f"remove it yourself (it holds the caches and HF_TOKEN); the end-of-sweep job's log: "
                      f"{c.sweep_dir}/.submitit/{jobs['end']}/"))
    else:
        c.say(Verdict("env file", True, f"read by every job ({', '.join(sorted(map(str, files)))})"
                      + ("" if left else "; removed by the end-of-sweep job")))

    c.say(gpu_verdict(c, records))

    if not ended:
        c.say(Verdict("end of sweep", False, f"end-of-sweep job {jobs['end']} wrote no report within "
                      f"{c.timeout_min:g} min", f"`{_status(c)}` says where it is; its "
                      f"log: {c.sweep_dir}/.submitit/{jobs['end']}/"))
    elif str(report.get("slurm_job_id")) != str(jobs["end"]):
        c.say(Verdict("end of sweep", False, f"the report was written by job {report.get('slurm_job_id')}, not "
                      f"by the end-of-sweep job {jobs['end']}", "re-run the canary in a new sweep directory"))
    else:
        bench = f"benched ({report['bench']})" if report.get("bench") else "no bench"
        c.say(Verdict("end of sweep", True, f"job {jobs['end']} after the array: {len(report.get('done') or [])} "
                      f"point(s) done, {bench}; report {report.get('report')}"))
    return list(records.values())


def gpu_verdict(c: Canary, records: dict) -> Verdict:
    """What the array asked Slurm for (its submission scripts) against the GPU the jobs got (their records)."""
    scripts = [p.read_text(errors="replace") for p in c.sweep_dir.glob(".submitit/*/*_submission.sh")]
    asked = sorted({m for s in scripts for m in re.findall(r"^#SBATCH --(gres=\S+|gpus-per-node=\S+|constraint=\S+)",
                                                            s, re.M)})
    names = sorted({str((r.get("provenance") or {}).get("device_name")) for r in records.values()
                    if (r.get("provenance") or {}).get("device_name")})
    devices = sorted({str((r.get("provenance") or {}).get("device")) for r in records.values()})
    if not any(a.startswith(("gres=gpu", "gpus-per-node")) for a in asked):
        return Verdict("GPU request", None, f"the launcher asks for no GPU (jobs on {', '.join(devices) or '?'}): "
                       "nothing to type here")
    typed = [a for a in asked if re.match(r"gres=gpu:[^:]+:\d+", a) or a.startswith("constraint=")]
    if not records:
        return Verdict("GPU request", False, f"asked {', '.join(asked)}; no job finished to say what it got",
                       "fix the points above first")
    if not names:
        return Verdict("GPU request", False, f"asked {', '.join(asked)}, but the jobs ran on {', '.join(devices)}",
                       "set gpu= to the partition's GPU (gpu=h100), not gpu=cpu")
    how = "typed" if typed else "untyped (the partition lists no GPU types and no feature names it)"
    return Verdict("GPU request", True, f"asked {', '.join(asked)} ({how}); the jobs got {', '.join(names)}")


def _task(c: Canary) -> list[str]:
    return ["experiment=canary", *(o for o in c.overrides if not o.split("=", 1)[0].lstrip("+~").startswith("hydra"))]


def run_canary(overrides: Sequence[str], sweep_dir: str | os.PathLike | None = None, config_dir: str | None = None,
               timeout_min: float = 30.0, poll_s: float = 15.0, out: Callable[[str], None] = print) -> int:
    """The canary (module docstring): 0 when every step passed, 1 otherwise. Raises :class:`GacError` for a command
    line it cannot run (exit 2)."""
    overrides = list(overrides)
    check_command_line(overrides)
    if not timeout_min > 0 or not poll_s > 0:
        raise GacError(f"--timeout-min {timeout_min:g} / --poll-s {poll_s:g}: give numbers above 0 (the canary "
                       f"waits that long for the sweep, and looks that often)")
    given = [o for o in overrides if o.split("=", 1)[0] == "hydra.sweep.dir"]
    d = Path(given[-1].split("=", 1)[1] if given else sweep_dir or Path("multirun") / f"canary-{file_stamp()}")
    d = d.expanduser().resolve()
    if d.exists() and any(d.iterdir()):
        raise GacError(f"{d}: the canary's sweep directory must be new or empty (its records, report and the "
                       f"launch's environment file go there); give another hydra.sweep.dir or remove it")
    overrides = [o for o in overrides if o.split("=", 1)[0] != "hydra.sweep.dir"]
    c = Canary(overrides, d, config_dir, float(timeout_min), float(poll_s), out)
    hydra = [o for o in overrides if o.split("=", 1)[0].lstrip("+~").startswith("hydra")]
    task = _task(c)
    out(f"canary: {' '.join(overrides)} -> {d}")
    missing = check_app()  # before the first step: nothing is fetched for a sweep that cannot be submitted
    if missing is not None:
        c.say(missing)
        return _end(c, [])
    steps = [step_site_files, lambda c: step_fetch(c, task), lambda c: step_offline(c, task)]
    for step in steps:
        if not c.say(step(c)).ok:
            return _end(c, [])
    from gac.jobs.sweep.points import sweep_points

    points = sweep_points(task)
    v, jobs = submit(c, task, hydra)
    if not c.say(v).ok:
        return _end(c, [])
    out(f"  waiting for {len(points)} point(s) and the end-of-sweep job (up to {c.timeout_min:g} min; Ctrl-C stops "
        f"only the waiting: scancel {jobs['array']} {jobs['end']} stops the jobs)")
    try:
        ended = wait(c, points, jobs)
    except KeyboardInterrupt:
        out(f"stopped waiting; the jobs go on in Slurm (scancel {jobs['array']} {jobs['end']} stops them)")
        return 130
    records = judge(c, points, jobs, ended)
    return _end(c, records)


def _end(c: Canary, records: list) -> int:
    from gac.jobs.doctor.report import nodes_of, write_node_report

    minutes = (time.time() - c.t0) / 60
    ok = minutes <= c.timeout_min
    c.say(Verdict("time", ok, f"{minutes:.1f} min (limit {c.timeout_min:g})", None if ok else
                  "a slow queue or node: run the canary again when the partition is idle, or give --timeout-min"))
    if records:
        c.sweep_dir.mkdir(parents=True, exist_ok=True)
        write_node_report(c.sweep_dir / REPORT, records, "canary", node={"nodes": nodes_of(records)},
                          extra={"verdicts": [vars(v) for v in c.verdicts]})
        c.out(f"  node report (estimates against what the node measured): {c.sweep_dir / REPORT}")
    failed = [v for v in c.verdicts if v.ok is False]
    c.out(f"canary: {'FAIL' if failed else 'PASS'}: {len(c.verdicts) - len(failed)} of {len(c.verdicts)} step(s) "
          f"passed or do not apply" + (f"; first failure: {failed[0].step}" if failed else ""))
    return 1 if failed else 0
