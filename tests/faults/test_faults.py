"""Fault injection on real processes: `experiments/run.py` on tiny, SIGKILLed at each stage by a stage hook
(``GAC_FAULT=<stage>``, see gac/faults.py), two identical jobs at once, parallel points sharing one scoring pass,
and planted pickles. Deterministic: no sleeps decide anything, the hooks do.

After every kill: no finished record lost or duplicated, `gac launch status` says what happened, and the next run
removes the dead writer's temp files and resumes. Marker ``faults`` (run by .ci/run; ~2-3 min on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gac.results import ResultsStore

pytestmark = pytest.mark.faults
ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny", "gpu=cpu", "calibration.n_samples=4", "calibration.seq_len=64", "seq_len=32",
        "eval=quick", "eval.ppl_seq_len=64", "eval.ppl_max_windows=2", "eval.tasks=[piqa]", "eval.limit=4",
        "eval.latency_seq_lens=[32]", "eval.warmup=0", "eval.iters=1", "eval.trials=1"]
NO_EVAL = ["model=tiny", "gpu=cpu", "calibration.n_samples=4", "calibration.seq_len=64", "seq_len=32", "eval=none"]


def _env(fault: str | None = None, hold_dir: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("GAC_FAULT", None)
    if fault:
        env["GAC_FAULT"] = fault
    if hold_dir:
        env["GAC_FAULT_DIR"] = str(hold_dir)
    return env


def _args(results: Path, overrides) -> list[str]:
    return [sys.executable, str(ROOT / "experiments" / "run.py"), *overrides, f"results_dir={results}",
            f"hydra.run.dir={results.parent}/hydra/{time.monotonic_ns()}"]


def run(results: Path, overrides, fault: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(_args(results, overrides), env=_env(fault), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def start(results: Path, overrides, fault: str | None = None, hold_dir: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(_args(results, overrides), env=_env(fault, hold_dir), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def state(results: Path, overrides) -> dict:
    from gac.launch.status import sweep_status

    (row,) = sweep_status(overrides, results_dir=str(results))
    return row


def wait_for(pred, what: str, proc: subprocess.Popen | None = None, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended (rc {proc.returncode}) before {what}:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def temp_files(results: Path) -> list[Path]:
    """Temp files of writers (a job's disk-space reserve aside: see reserves)."""
    return sorted(p for p in results.rglob(".*") if (p.name.endswith(".tmp") or ".tmp" in p.name)
                  and not p.name.startswith(".space-reserve-"))


def reserves(results: Path) -> list[Path]:
    """The disk-space reserves of jobs (gac.io.SpaceReserve): one per running or killed job until cleaned."""
    return sorted(results.glob(".space-reserve-*.tmp"))


def events(results: Path, key: str) -> list[dict]:
    p = results / "runs" / f"{key}.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_sigkill_at_every_stage_then_resume(tmp_path):
    """One point killed at each stage in turn; each re-run resumes what finished before. Nothing lost, nothing twice."""
    res = tmp_path / "results"
    store = ResultsStore(res)
    chain = ["calibration", "scoring", "factorize", "prepared_write", "plan", "ppl", "tasks", "latency",
             "record_write"]
    previous: list[Path] = []
    for stage in chain:
        r = run(res, TINY, fault=stage)
        assert r.returncode == -signal.SIGKILL, (stage, r.stdout[-2000:], r.stderr[-2000:])
        row = state(res, TINY)
        assert row["state"] == "interrupted", (stage, row)
        assert "is gone" in row["detail"], row
        assert not list(store.iter_records()), stage  # nothing published yet
        assert not any(p.exists() for p in previous), stage  # the last kill's leftovers were cleaned by this run
        previous = temp_files(res)
        assert len(reserves(res)) == 1, stage  # the killed job's; the one killed before it was cleaned
        if stage == "prepared_write":  # the scored state was complete in its temp file (MBs), never published
            assert [p.parent.name for p in previous] == ["prepared"] and previous[0].stat().st_size > 1 << 20
        if stage == "record_write":  # the record was complete in its temp file, not yet published
            (tmp,) = previous
            assert tmp.parent.name == "records" and json.loads(tmp.read_text())["key"] == row["key"]
    key = state(res, TINY)["key"]
    attempts = json.loads((res / "work" / key / "attempts.json").read_text())["attempts"]
    assert [a["stage"] for a in attempts][-4:] == ["ppl", "tasks", "latency", "latency"]

    # killed after the record was published, before its temp file was removed: done, and one temp left behind
    r = run(res, TINY, fault="record_written")
    assert r.returncode == -signal.SIGKILL
    assert state(res, TINY)["state"] == "done"
    assert [p.parent.name for p in temp_files(res)] == ["records"]
    rec = store.read_record(key)
    assert [a["outcome"] for a in rec["attempts"]] == ["interrupted"] * len(chain) + ["completed"]
    assert set(rec["stages"]["resumed"]) == {"ppl", "tasks", "latency:prefill_ms@32"}  # the last attempt ran none
    assert all(v <= rec["timings"]["total_s"] for v in rec["timings"].values())

    r = run(res, TINY)  # skips the done point and removes the dead writer's temp file
    assert r.returncode == 0, r.stderr[-2000:]
    assert "skipped (already done)" in r.stdout
    assert temp_files(res) == [] and reserves(res) == []
    assert [p.name for p in store.record_paths(key)] == [f"{key}.json"]
    assert not list((res / "locks").glob("*.lock"))
    assert len(list((res / "cache" / "prepared").glob("*.safetensors"))) == 1


def test_two_identical_jobs_at_once_one_record_one_scoring(tmp_path):
    res, hold = tmp_path / "results", tmp_path / "hold"
    a = start(res, NO_EVAL, fault="scoring:hold", hold_dir=hold)
    wait_for(lambda: (hold / "held-scoring").exists(), "job A to reach scoring", a)
    row = state(res, NO_EVAL)
    assert row["state"] == "running" and f"pid {a.pid}" in row["detail"] and "stage prepare" in row["detail"]
    b = start(res, NO_EVAL)
    wait_for(lambda: any(e["event"] == "waiting" for e in events(res, row["key"])), "job B to wait", b)
    (hold / "held-scoring").unlink()  # let A go on
    out_a, _ = a.communicate(timeout=300)
    out_b, _ = b.communicate(timeout=300)
    assert a.returncode == 0 and b.returncode == 0, out_a[-2000:] + out_b[-2000:]
    assert "skipped (finished by an identical job" in out_b
    store = ResultsStore(res)
    assert len(store.record_paths(row["key"])) == 1
    rec = store.read_record(row["key"])
    assert rec["stages"]["prepare_cached"] is False and [a["pid"] for a in rec["attempts"]] == [a.pid]
    assert [e["event"] for e in events(res, row["key"])].count("started") == 1  # B never started its own attempt
    assert state(res, NO_EVAL)["state"] == "done"


def test_parallel_points_share_one_scoring_pass(tmp_path):
    res, hold = tmp_path / "results", tmp_path / "hold"
    gac = [*NO_EVAL, "align=gac"]
    unaligned = [*NO_EVAL, "align=unaligned"]
    a = start(res, gac, fault="factorize:hold", hold_dir=hold)
    wait_for(lambda: (hold / "held-factorize").exists(), "job A to reach factorize", a)
    b = start(res, unaligned)
    key_b = state(res, unaligned)["key"]
    wait_for(lambda: any(e["event"] == "waiting" and e.get("what") == "scoring" for e in events(res, key_b)),
             "job B to wait for A's scores", b)
    (hold / "held-factorize").unlink()
    for p in (a, b):
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-2000:]
    store = ResultsStore(res)
    recs = {r["job"]["strategy"]: r for r in store.iter_records()}
    assert recs["gac"]["stages"]["prepare_cached"] is False
    assert recs["unaligned"]["stages"]["prepare_cached"] is True  # waited and re-used, did not re-score
    assert recs["gac"]["budget"] == recs["unaligned"]["budget"]


def test_planted_pickles_are_refused_not_run(tmp_path):
    import pickle

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'PLANTED_RAN'}",))

    res = tmp_path / "results"
    r = run(res, [*NO_EVAL, "align=gac"])
    assert r.returncode == 0, r.stderr[-2000:]
    (entry,) = (res / "cache" / "prepared").glob("*.safetensors")
    entry.write_bytes(pickle.dumps(Planted()))
    entry.with_suffix(".pt").write_bytes(pickle.dumps(Planted()))
    r = run(res, [*NO_EVAL, "align=unaligned"])
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr  # Hydra sends the job's log to stdout
    assert "is not a gac prepared state" in out and "it was not loaded" in out
    assert not (tmp_path / "PLANTED_RAN").exists()
    rec = next(x for x in ResultsStore(res).iter_records() if x["job"]["strategy"] == "unaligned")
    assert rec["stages"]["prepare_cached"] is False  # recomputed, never trusted
