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

:func:`sweep_end_status` says where a Slurm sweep's end-of-sweep job is (:mod:`gac.jobs.sweep.end`): waiting for the
array, running, or done with its report (how many points finished, which did not, where the table is).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
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


#: every state squeue (%T) and sacct (State) print; any other word (a site banner's) is not a job's state
SLURM_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "CONFIGURING", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "REVOKED",
    "RUNNING", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT"})
SLURM_ANSWER_S = 10  # how long squeue / sacct may take before Slurm is taken as not answering (said, once)


def slurm_states(text: str) -> list[str]:
    """The job states in ``squeue -o %T`` or ``sacct -o State`` output, one per line that starts with one (``CANCELLED
    by 0`` is CANCELLED); a banner or a message line around them is not a state."""
    words = [ln.split()[0].upper() for ln in text.splitlines() if ln.split()]
    return [w for w in words if w in SLURM_STATES]


class _Slurm:
    """Slurm job states from ``squeue`` (then ``sacct``), when Slurm is installed here; cached per status call. A
    tool that does not answer in :data:`SLURM_ANSWER_S` is said once and not asked again in this call."""

    def __init__(self):
        self.squeue = shutil.which("squeue")
        self.sacct = shutil.which("sacct")
        self.cache: dict[str, str | None] = {}
        self.silent: str | None = None  # the tool that did not answer

    def _ask(self, args: list[str]) -> subprocess.CompletedProcess | None:
        if self.silent is not None:
            return None
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=SLURM_ANSWER_S)
        except subprocess.TimeoutExpired:
            self.silent = Path(args[0]).name
            print(f"gac launch status: warning: {self.silent} did not answer in {SLURM_ANSWER_S} s; Slurm is not "
                  f"asked again in this call, so a point held on another node is judged by its heartbeat alone",
                  file=sys.stderr)
        except (OSError, subprocess.SubprocessError):
            pass
        return None

    def state(self, job_id: str) -> str | None:
        """The job's state (``RUNNING``, ``PENDING``, ``FAILED``...), ``GONE`` if Slurm no longer knows it, None when
        Slurm cannot be asked."""
        if job_id in self.cache:
            return self.cache[job_id]
        state = None
        r = self._ask([self.squeue, "-h", "-j", str(job_id), "-o", "%T"]) if self.squeue else None
        if r is not None:
            states = slurm_states(r.stdout) if r.returncode == 0 else []
            if states:
                state = states[0]
            else:  # not in the queue any more (or unknown): ask the accounting, else call it gone
                r2 = self._ask([self.sacct, "-n", "-X", "-P", "-j", str(job_id), "-o", "State"]) if self.sacct else None
                got = slurm_states(r2.stdout) if r2 is not None and r2.returncode == 0 else []
                if got:
                    state = got[-1]
                elif self.silent is None and (r.returncode == 0 or "invalid job id" in r.stderr.lower()):
                    state = "GONE"
        self.cache[job_id] = state
        return state


def slurm_state(job_id: str) -> str | None:
    """One Slurm job's state as :class:`_Slurm` tells it (``GONE``, or None when Slurm cannot be asked)."""
    return _Slurm().state(job_id)


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
    from gac.jobs.sweep.points import sweep_points

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
    from gac.jobs.sweep.end import read_report

    keys = {r["key"] for r in rows}
    slurm = slurm or _Slurm()
    for root in sorted({r["results_dir"] for r in rows}):
        store = ResultsStore(root)
        if not store.root.is_dir():
            continue
        for plan in filter(None, map(_launch, store.iter_sweeps())):
            if {p["key"] for p in plan["points"]} != keys:
                continue
            end, array = plan["end_job"], plan["array_job"]
            report = read_report(plan["sweep_dir"]) if plan["sweep_dir"] else None
            if report is not None and end and report.get("slurm_job_id") == end:
                done, failed = _listed(report.get("done")), _listed(report.get("failed"))
                detail = (f"{len(done)} point(s) done" + (f", {len(failed)} not" if failed else "")
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


def _launch(plan: dict) -> dict | None:
    """A recorded launch in the shape the launcher writes (points: a list of mappings with a key; job ids and the
    sweep directory as text), or None for one that is not (edited, or another tool's): it is skipped like an
    unreadable one, so that it never hides the other sweeps of the store."""
    points = plan.get("points")
    if not isinstance(points, list) or not all(isinstance(p, dict) and isinstance(p.get("key"), str) for p in points):
        return None
    fields = {k: plan.get(k) for k in ("end_job", "array_job", "sweep_dir")}
    if any(v is not None and not isinstance(v, (str, int)) or "\0" in str(v) for v in fields.values()):
        return None
    return {**plan, **{k: (str(v) if v is not None else None) for k, v in fields.items()}}


def _listed(value) -> list:
    return value if isinstance(value, list) else []
