"""A sweep's points and their state in the results store, told truthfully.

=============  =====================================================================================================
state          meaning
=============  =====================================================================================================
done           its record exists and reads as a completed gac record
corrupt        its record exists but cannot be read (damaged or edited): the detail says which file and the fix
running        a live job holds the point's lock (same machine: its process is alive; elsewhere: Slurm says it runs,
               or its heartbeat is fresh); the detail gives host, pid, Slurm job, stage and "retry" after failures
interrupted    a job started it and is gone without finishing (kill -9, OOM, a lost node, a preempted Slurm job):
               its lock is stale, or its events end without an outcome; re-launching resumes its finished stages
failed         its last attempt failed (the error is in ``failures/<key>/``)
pending        nothing ran yet
=============  =====================================================================================================

A ``--results-dir`` that is not a store (a typo) is an error, not a sweep of pending points.

:func:`sweep_end_status` says where a Slurm sweep's end-of-sweep job is (:mod:`gac.jobs.sweep_end`): waiting for the
array, running, or done with its report (how many points finished, which did not, where the table is).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from gac.results import ResultsStore
from gac.results.lock import describe_holder, read_holder, same_machine, slurm_display_id, stale_reason
from gac.results.store import CorruptRecord, results_root

SLURM_ALIVE = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING",
               "STAGE_OUT"}
_OUTCOMES = ("completed", "failed")


def _events(store: ResultsStore, key: str) -> list[dict]:
    p = store.root / "runs" / f"{key}.jsonl"
    out = []
    try:
        lines = p.read_bytes().splitlines()
    except OSError:
        return out
    for ln in lines:
        try:
            ev = json.loads(ln.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError included: a line cut by a kill mid-append, or bytes not gac's
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def _last_attempt_events(events: list[dict]) -> list[dict]:
    starts = [i for i, ev in enumerate(events) if ev.get("event") == "started"]
    return events[starts[-1]:] if starts else []


def _stage(events: list[dict]) -> str | None:
    stages = [ev.get("stage") for ev in _last_attempt_events(events) if ev.get("event") == "stage"]
    return stages[-1] if stages else None


class _Slurm:
    """Slurm job states from ``squeue`` (then ``sacct``), when Slurm is installed here; cached per status call."""

    def __init__(self):
        self.squeue = shutil.which("squeue")
        self.sacct = shutil.which("sacct")
        self.cache: dict[str, str | None] = {}

    def state(self, job_id: str) -> str | None:
        """The job's state (``RUNNING``, ``PENDING``, ``FAILED``...), ``GONE`` if Slurm no longer knows it, None when
        Slurm cannot be asked."""
        if job_id in self.cache:
            return self.cache[job_id]
        state = None
        try:
            if self.squeue:
                r = subprocess.run([self.squeue, "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                                   timeout=20)
                if r.returncode == 0 and r.stdout.strip():
                    state = r.stdout.split()[0].upper()
                else:  # not in the queue any more (or unknown): ask the accounting, else call it gone
                    if self.sacct:
                        r2 = subprocess.run([self.sacct, "-n", "-X", "-P", "-j", str(job_id), "-o", "State"],
                                            capture_output=True, text=True, timeout=20)
                        got = r2.stdout.split()
                        if r2.returncode == 0 and got:
                            state = got[-1].upper()
                    if state is None and (r.returncode == 0 or "invalid job id" in r.stderr.lower()):
                        state = "GONE"
        except (OSError, subprocess.SubprocessError):
            state = None
        self.cache[job_id] = state
        return state


def point_state(store: ResultsStore, key: str, slurm: _Slurm | None = None, now: float | None = None) -> dict:
    """``{"state", "detail", "stage", "holder"}`` of one key in ``store`` (see the module docstring)."""
    now = time.time() if now is None else now
    if store.is_done(key):
        try:
            rec = store.read_record(key)
        except CorruptRecord as e:
            return {"state": "corrupt", "detail": str(e)}
        reruns = len(store.record_paths(key)) - 1
        prov = rec.get("provenance") if isinstance(rec.get("provenance"), dict) else {}
        return {"state": "done", "detail": str(store.record_path(key)) + (f" (+{reruns} re-run)" if reruns else ""),
                "slurm_job": slurm_display_id(prov)}
    events = _events(store, key)
    failures = store.failure_paths(key)
    holder = read_holder(store.lock_path(key))
    stage = _stage(events)
    at = f", stage {stage}" if stage else ""
    if holder is not None:
        reason = stale_reason(holder, now=now)
        job = holder.get("slurm_job_id")
        if reason is None and job and not same_machine(holder) and slurm is not None:
            st = slurm.state(job)
            if st is not None and st not in SLURM_ALIVE:
                reason = f"Slurm job {slurm_display_id(holder)} is {st.lower()}"
        if reason is None:
            detail = f"on {describe_holder(holder)}{at}"
            if failures:
                detail = f"retry after {len(failures)} failure(s) ({_error(failures[-1])}); {detail}"
            return {"state": "running", "detail": detail, "stage": stage, "holder": holder,
                    "slurm_job": slurm_display_id(holder)}
        return {"state": "interrupted", "detail": f"{reason} (was {describe_holder(holder)}{at}); re-launch to resume",
                "stage": stage, "holder": holder, "slurm_job": slurm_display_id(holder)}
    last = _last_attempt_events(events)
    if last and not any(ev.get("event") in _OUTCOMES for ev in last):
        ev = last[0]
        sid = slurm_display_id(ev)
        job = f" (Slurm job {sid})" if sid else ""
        return {"state": "interrupted", "stage": stage, "slurm_job": sid,
                "detail": f"started on {ev.get('host')} pid {ev.get('pid')}{job} at {ev.get('time')}{at} and never "
                          f"finished; re-launch to resume"}
    if failures:
        return {"state": "failed", "detail": _error(failures[-1])}
    return {"state": "pending", "detail": None}


def _error(path: Path) -> str:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        return str(rec.get("error")) if isinstance(rec, dict) else f"unreadable failure record {path}"
    except (OSError, ValueError):
        return f"unreadable failure record {path}"


def sweep_status(overrides: Sequence[str], results_dir: str | None = None) -> list[dict]:
    """One row per point of the sweep: its overrides, key and state (with the failure's error or the host)."""
    from gac.jobs.sweep import sweep_points

    points = sweep_points(overrides)
    rows, seen, stores = [], set(), {}
    slurm = _Slurm()
    for pt in points:
        root = results_root(results_dir or pt["config"].get("results_dir", "results"))
        if root not in stores:
            stores[root] = ResultsStore(root).require()
        store = stores[root]
        key = pt["key"]
        st = point_state(store, key, slurm)
        detail = st.get("detail")
        if key in seen:
            detail = "same job as an earlier point (shares its record)"
        seen.add(key)
        rows.append({"overrides": pt["overrides"], "key": key, "state": st["state"], "detail": detail,
                     "stage": st.get("stage"), "slurm_job": st.get("slurm_job"), "results_dir": str(root)})
    return rows



def sweep_end_status(rows: Sequence[dict], slurm: _Slurm | None = None) -> dict | None:
    """The newest Slurm launch of the sweep whose points are ``rows`` (:func:`sweep_status`), from the launches its
    store recorded: ``{"end_job", "array_job", "state", "detail", "report"}``, or None when this sweep was never
    launched on Slurm."""
    from gac.jobs.sweep_end import read_report

    keys = {r["key"] for r in rows}
    slurm = slurm or _Slurm()
    for root in sorted({r["results_dir"] for r in rows}):
        store = ResultsStore(root)
        if not store.root.is_dir():
            continue
        for plan in store.iter_sweeps():
            if {str(p.get("key")) for p in plan.get("points") or []} != keys:
                continue
            end, array = plan.get("end_job"), plan.get("array_job")
            report = read_report(plan.get("sweep_dir") or "")
            if report is not None and end and report.get("slurm_job_id") == end:
                failed = report.get("failed") or []
                detail = (f"{len(report.get('done') or [])} point(s) done" + (f", {len(failed)} not" if failed else "")
                          + f"; report: {report.get('report')}")
                return {"end_job": end, "array_job": array, "state": "done", "detail": detail,
                        "report": report.get("report")}
            st = slurm.state(str(end)) if end else None
            if st is None:
                detail = "Slurm cannot be asked from here"
            elif st == "PENDING":
                detail = f"waits for array job {array} (afterany): it starts when every point has ended"
            elif st in SLURM_ALIVE:
                detail = "running: the bench, the table and the report"
            else:
                detail = f"ended ({st.lower()}) without a report; its log: {plan.get('sweep_dir')}/.submitit/{end}"
            return {"end_job": end, "array_job": array, "state": (st or "unknown").lower(), "detail": detail,
                    "report": plan.get("report_path")}
    return None
