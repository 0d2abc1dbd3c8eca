"""The end of a sweep: what became of each point, the table of those that finished, the after-sweep bench, written
once every job of the sweep has ended, however it ended.

A sweep's *plan* (:func:`sweep_plan`) names its points (overrides and record key), its store, its sweep directory and
its bench settings. :func:`finish_sweep` reads each point's outcome from the store (done; failed, with the error of
a failure record this launch wrote; or no record at all: the job was killed, ran out of memory or time, or its node
was lost), runs the bench over the done points when the sweep asks for one, and writes the report,
``<sweep_dir>/sweep-end.md`` (the points, the table) and ``sweep-end.json`` (the same as data). A point that failed
never stops the others' table.

The local launcher runs it in the launching process when the sweep ends (:class:`gac.jobs.sweep.points.SweepCallback`).
A Slurm sweep runs it as one more Slurm job that depends on the array with ``afterany`` (:func:`end_job`, submitted by
:mod:`gac.launch.slurm`), so that nothing has to stay alive on the login node: submit, log off, and come back to the
report; ``gac launch status`` says where the array and that job are. The launcher tells the callback that the job
will do it through :func:`note_submitted`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gac.errors import GacError
from gac.machine import utc_stamp
from gac.results import ResultsStore

log = logging.getLogger(__name__)

PLAN_SCHEMA = 1
REPORT = "sweep-end"  # <sweep_dir>/sweep-end.md and sweep-end.json

_SUBMITTED: dict[str, dict] = {}  # sweep dir -> the plan of its end-of-sweep job (this process's Slurm launches)
_POINTS: dict[str, list[dict]] = {}  # sweep dir -> its points as the sweep check found them (this process's sweeps)


def sweep_plan(config, points: Sequence[Mapping]) -> dict:
    """The plan of a sweep from its Hydra ``config`` (the sweep's primary config) and its ``points``
    (``{"overrides", "key"}``; extra fields such as ``slurm_job`` and ``log`` are kept)."""
    from omegaconf import OmegaConf

    from gac.results.store import results_root

    bench = OmegaConf.to_container(config.bench, resolve=True) if config.get("bench") else {}
    return {"schema": PLAN_SCHEMA, "kind": "gac-sweep",
            "sweep_dir": str(Path(str(config.hydra.sweep.dir)).expanduser().resolve()),
            "results_dir": str(results_root(str(config.get("results_dir", "results")))),
            "experiment_name": str(config.get("experiment_name") or "default"),
            "bench": {"after_sweep": bool(bench.get("after_sweep")), "overrides": [str(o) for o in
                                                                                    bench.get("overrides") or []]},
            "points": [dict(p, overrides=list(p["overrides"]), key=str(p["key"])) for p in points],
            "created": utc_stamp(), "created_ts": time.time()}


def _dir(sweep_dir) -> str:
    return str(Path(str(sweep_dir)).expanduser().resolve())


def note_points(sweep_dir, points: Sequence[Mapping]) -> None:
    """The sweep check's points (``overrides``, ``key``) of the sweep in ``sweep_dir``, for its launcher."""
    _POINTS[_dir(sweep_dir)] = [{"overrides": list(p["overrides"]), "key": str(p["key"])} for p in points]


def noted_points(sweep_dir) -> list[dict]:
    return _POINTS.get(_dir(sweep_dir), [])


def note_submitted(plan: dict) -> None:
    """The Slurm launcher submitted ``plan``'s end-of-sweep job: the callback leaves the end of the sweep to it."""
    _SUBMITTED[_dir(plan["sweep_dir"])] = plan


def submitted(sweep_dir: str | os.PathLike) -> dict | None:
    """The plan of the end-of-sweep job this process submitted for ``sweep_dir``, or None (an in-process sweep)."""
    return _SUBMITTED.get(_dir(sweep_dir))


def unfinished(plan: Mapping) -> str | None:
    """The last line of a Slurm sweep whose report names points that did not finish, or None."""
    report = plan.get("report")
    if not report or not report.get("failed"):
        return None
    n, first = len(report["failed"]), report["failed"][0]
    return (f"{n} point(s) of the sweep did not finish, the first [{' '.join(first['overrides'])}]: {first['detail']} "
            f"(each is named above and in {report.get('report')}); the table holds the others. Fix them and "
            f"re-launch: finished points are skipped")


def outcomes(plan: Mapping, store: ResultsStore | None = None, errors: Mapping[frozenset, str] | None = None
             ) -> list[dict]:
    """Each point's outcome: ``{"overrides", "key", "state", "detail"}`` with state ``done``, ``failed`` (a failure
    record written since the plan was made, the error the launching process saw (``errors``: by the point's set of
    overrides), or the error its Slurm job returned: a refusal before the store was touched) or ``missing`` (the job
    ended without a word: killed, out of memory or time, a lost node)."""
    from gac.io import read_json
    from gac.results.store import CorruptRecord

    store = store or ResultsStore(plan["results_dir"])
    errors = errors or {}
    since = float(plan.get("created_ts") or 0) - 5  # clocks of the login and compute nodes differ a little
    out, seen = [], {}
    for p in plan["points"]:
        key = p["key"]
        row = {"overrides": list(p["overrides"]), "key": key}
        if key in seen:
            out.append({**row, "state": seen[key]["state"], "detail": "same job as an earlier point (shares its record)"})
            continue
        if store.is_done(key):
            try:
                store.read_record(key)
                row.update(state="done", detail=str(store.record_path(key)))
            except CorruptRecord as e:
                row.update(state="failed", detail=str(e))
        else:
            fresh = [f for f in store.failure_paths(key) if f.stat().st_mtime >= since]
            if fresh:
                try:
                    rec = read_json(fresh[-1], "failure record")
                    error = str(rec.get("error")) if isinstance(rec, dict) else "an unreadable failure record"
                except GacError:
                    error = "an unreadable failure record"
                row.update(state="failed", detail=f"{error} ({fresh[-1]})")
            else:
                error = errors.get(frozenset(p["overrides"])) or _slurm_error(plan, p)
                if error:
                    row.update(state="failed", detail=error)
                else:
                    where = f"; its log: {p['log']}" if p.get("log") else ""
                    job = f" (Slurm job {p['slurm_job']})" if p.get("slurm_job") else ""
                    row.update(state="missing", detail=f"the job{job} ended without a record or an error: killed, out "
                                                       f"of memory or time, or its node was lost{where}")
        seen[key] = row
        out.append(row)
    return out


def _slurm_error(plan: Mapping, point: Mapping) -> str | None:
    """The error a point's Slurm job returned (submitit's result file: Hydra's failed job return, or submitit's own
    error), or None when it left no result (it was killed) or ran elsewhere."""
    job, folder = point.get("slurm_job"), plan.get("submitit_folder")
    if not job or not folder:
        return None
    try:
        from submitit.core.utils import JobPaths, pickle_load

        path = JobPaths(folder, job_id=str(job)).result_pickle
        if not path.is_file():
            return None
        outcome, value = pickle_load(path)
    except Exception as e:  # noqa: BLE001 - an unreadable result is a job that left none that can be told
        log.debug("no readable result for Slurm job %s: %s", job, e)
        return None
    if outcome == "error":  # submitit's own: a traceback as text
        return str(value).strip().splitlines()[-1] if str(value).strip() else "an error (see the job's log)"
    status = getattr(value, "status", None)
    if status is not None and getattr(status, "name", "") == "FAILED":
        e = getattr(value, "_return_value", None)
        return f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else str(e)
    return None


def finish_sweep(plan: Mapping, errors: Mapping[frozenset, str] | None = None) -> dict:
    """The end of the sweep ``plan`` describes (module docstring): outcomes, bench, table, report files. Returns the
    report as data (``points``, ``done``, ``failed``, ``bench``, ``table``, ``text``, ``report``). ``errors``: the
    errors of points the launching process saw fail (by the point's set of overrides)."""
    store = ResultsStore(plan["results_dir"])
    points = outcomes(plan, store, errors)
    done = sorted({p["key"] for p in points if p["state"] == "done"})
    bad = [p for p in points if p["state"] != "done" and "same job as an earlier point" not in (p["detail"] or "")]
    bench, bench_text = _bench(plan, done) if (plan.get("bench") or {}).get("after_sweep") else (None, None)
    table = _table(plan, store, done)
    n = len({p["key"] for p in points})
    lines = [f"# Sweep {plan['sweep_dir']}", "",
             f"{len(done)} of {n} point(s) done" + (f", {len(bad)} not: the table holds the others" if bad else ""), ""]
    shown = _varying([p["overrides"] for p in points])
    lines += [f"- {p['state']:<7} {' '.join(shown(p['overrides'])) or '(no overrides)'}  [{p['key']}]: {p['detail']}"
              for p in points]
    if bench is not None:
        lines += ["", bench_text or f"Bench: {bench}"]
    if table:
        lines += ["", table]
    elif done:
        lines += ["", "(no table for experiment " + repr(plan.get("experiment_name")) + ": `gac report "
                  + plan["results_dir"] + "` makes the figures and tables)"]
    text = "\n".join(lines) + "\n"
    report = {"schema": PLAN_SCHEMA, "kind": "gac-sweep-end", "sweep_dir": plan["sweep_dir"],
              "results_dir": plan["results_dir"], "points": points, "done": done,
              "failed": [{"overrides": p["overrides"], "key": p["key"], "state": p["state"], "detail": p["detail"]}
                         for p in bad],
              "bench": bench, "table": table, "text": text,
              "finished": utc_stamp(),
              "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
              "report": str(Path(plan["sweep_dir"]) / f"{REPORT}.md")}
    _write_report(Path(plan["sweep_dir"]), text, report)
    return report


def _varying(overrides: Sequence[Sequence[str]]):
    """A function giving a point's overrides that differ between the points (all of them for a single point)."""
    if len(overrides) < 2:
        return list
    common = set(overrides[0]).intersection(*map(set, overrides[1:]))
    return lambda o: [x for x in o if x not in common]


def _bench(plan: Mapping, done: Sequence[str]) -> tuple[str, str | None]:
    """The after-sweep bench over the done points, here: its record's path (or what went wrong, in one line) and its
    table. A failed bench is said, never turned into a failed end of sweep (the records are safe; ``gac bench``
    re-runs it)."""
    from gac.jobs.bench.store_bench import bench_after_sweep, describe

    try:
        doc = bench_after_sweep(plan["results_dir"], done, plan["bench"].get("overrides") or [])
    except GacError as e:
        return f"did not run: {e}", None
    except Exception as e:  # noqa: BLE001 - the sweep's records are safe; say what went wrong and how to re-run it
        log.exception("the after-sweep bench failed")
        return f"failed ({type(e).__name__}: {e}); re-run it with `gac bench {plan['results_dir']}`", None
    if doc is None:
        return "nothing to bench (no compressed point is done)", None
    return str(doc.get("_path") or doc.get("key")), describe(doc)


def _table(plan: Mapping, store: ResultsStore, done: Sequence[str]) -> str | None:
    """Table 5 of the done points (markdown) for an experiment that defines one (as its report does); None otherwise
    or when nothing is done."""
    from gac.analysis.report_dir import defines

    if not defines(plan.get("experiment_name"), "table5") or not done:
        return None
    try:
        from gac.analysis import format_table, load_results, table5

        df = load_results(store)
        df = df[df["key"].astype(str).isin(set(done))]
        if not len(df):
            return None
        t = table5(df)
        return format_table(t, fmt="markdown", caption=t.attrs.get("caption"))
    except Exception as e:  # noqa: BLE001 - a report must never turn a finished sweep into a failure
        log.warning("could not make the sweep's table: %s", e)
        return f"(the table could not be made: {type(e).__name__}: {e}; `gac report {plan['results_dir']}` retries)"


def _write_report(sweep_dir: Path, text: str, report: Mapping) -> None:
    from gac.io import write_json_atomic, write_text_atomic

    try:  # a re-launched sweep's end replaces the last one's report (the records stay in the store)
        write_text_atomic(sweep_dir / f"{REPORT}.md", text, overwrite=True)
        write_json_atomic(sweep_dir / f"{REPORT}.json", {k: v for k, v in report.items() if k != "text"},
                          overwrite=True)
    except GacError as e:
        log.warning("could not write the sweep's report under %s: %s", sweep_dir, e)


def read_report(sweep_dir: str | os.PathLike) -> dict | None:
    """The end-of-sweep report ``sweep-end.json`` of ``sweep_dir``, or None when there is none yet (or unreadable)."""
    from gac.io import read_json

    p = Path(sweep_dir) / f"{REPORT}.json"
    if not p.is_file():
        return None
    try:
        doc = read_json(p, "sweep report")
    except GacError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "gac-sweep-end" else None


def end_job(plan: dict) -> dict:
    """The body of the end-of-sweep Slurm job: :func:`finish_sweep`, its report printed to the job's log; then the
    launch's private environment file (the token and proxy it passed to the sweep's jobs) is removed: every job that
    needed it has ended."""
    try:
        report = finish_sweep(plan)
        print(report["text"])
        return report
    finally:
        env_file = plan.get("env_file")
        if env_file:
            try:
                Path(env_file).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("could not remove %s: %s", env_file, e)
