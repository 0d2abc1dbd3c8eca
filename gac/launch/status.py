"""A sweep's points and their state in the results store: done, failed, running or pending."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from gac.results import ResultsStore


def _last_event(store: ResultsStore, key: str) -> dict | None:
    p = store.root / "runs" / f"{key}.jsonl"
    if not p.exists():
        return None
    lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def sweep_status(overrides: Sequence[str], results_dir: str | None = None) -> list[dict]:
    """One row per point of the sweep: its overrides, key and state (with the failure's error or the host)."""
    from gac.jobs.experiment import sweep_points

    points = sweep_points(overrides)
    rows, seen = [], set()
    for pt in points:
        root = Path(results_dir or pt["config"].get("results_dir", "results")).expanduser().resolve()
        store = ResultsStore(root)
        key = pt["key"]
        state = store.status(key)
        detail = None
        if state == "failed":
            last = sorted((store.failures_dir / key).glob("*.json"))[-1]
            try:
                detail = json.loads(last.read_text()).get("error")
            except ValueError:
                detail = f"unreadable failure record {last}"
            ev = _last_event(store, key)
            if ev and ev.get("event") == "started" and ev.get("time", "") > last.name:
                state, detail = "running", f"retry on {ev.get('host')} (slurm job {ev.get('slurm_job_id')})"
        elif state == "pending":
            ev = _last_event(store, key)
            if ev and ev.get("event") == "started":
                state, detail = "running", f"on {ev.get('host')} since {ev.get('time')} (slurm job {ev.get('slurm_job_id')})"
        elif state == "done":
            detail = str(store.record_path(key))
        if key in seen:
            detail = "same job as an earlier point (shares its record)"
        seen.add(key)
        rows.append({"overrides": pt["overrides"], "key": key, "state": state, "detail": detail})
    return rows
