"""The job under concurrency and failure, in-process and fast: one record per key, shared scoring, per-attempt
timings, busy keys, corrupt records and bad inputs refused before any work. (Real kills: tests/faults.)"""

import json
import threading
import time

import pytest

from gac.errors import GacError
from gac.jobs.config.build import spec_from_config
from gac.jobs.run.recipe import run_config
from gac.results import ResultsStore

FAST = ("compressor=asvd", "eval=none")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One store for the tests that do not need a cold cache (they share one scoring pass)."""
    return tmp_path_factory.mktemp("shared") / "results"


def _start(*cfgs):
    """``run_config`` of each config in a thread of its own: the threads, their records and their errors (each
    thread is joined by :func:`_join` before the test returns)."""
    out, errors = [None] * len(cfgs), []

    def one(i, cfg):
        try:
            out[i] = run_config(cfg)
        except BaseException as e:  # noqa: BLE001 - reported by _join
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, c), name=f"job-{i}") for i, c in enumerate(cfgs)]
    for t in threads:
        t.start()
    return threads, out, errors


def _join(threads, out, errors):
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def _run_threads(*cfgs):
    return _join(*_start(*cfgs))


@pytest.fixture
def waiting_seen(monkeypatch):
    """An event set when a job records that it waits for an identical job (its ``waiting`` event)."""
    import gac.jobs.tracking.loggers as tracking

    seen, real = threading.Event(), tracking.append_event

    def append_event(root, key, event, **fields):
        real(root, key, event, **fields)
        if event == "waiting" and fields.get("what") == "job":
            seen.set()

    monkeypatch.setattr(tracking, "append_event", append_event)
    return seen


def test_two_identical_jobs_at_once_leave_one_record_and_score_once(make_cfg, waiting_seen, monkeypatch):
    from gac.jobs.run.recipe import Recipe

    real_load = Recipe.load

    def load_once_the_other_waits(self, *a, **k):  # the job holding the key goes on once the other waits for it
        assert waiting_seen.wait(600), "the second job never waited for the first"
        return real_load(self, *a, **k)

    monkeypatch.setattr(Recipe, "load", load_once_the_other_waits)
    cfg = make_cfg(*FAST, "align=gac")
    a, b = _run_threads(cfg, dict(cfg))
    store = ResultsStore(cfg["results_dir"])
    assert len(store.record_paths(a["key"])) == 1 and len(list(store.iter_records())) == 1
    ran, waited = (a, b) if not a.get("skipped") else (b, a)
    assert not ran.get("skipped") and waited["skip_reason"] == "finished by an identical job"
    assert ran["stages"]["prepare_cached"] is False  # the one scoring pass
    assert waited["metrics"] == ran["metrics"]
    events = [json.loads(x) for x in (store.root / "runs" / f"{a['key']}.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("started") == 1 and any(e["event"] == "waiting" for e in events)
    assert not list(store.locks_dir.glob("*.lock"))


def test_parallel_points_of_a_sweep_share_one_scoring_pass(make_cfg):
    a, b = _run_threads(make_cfg(*FAST, "align=gac"), make_cfg(*FAST, "align=unaligned"))
    assert a["key"] != b["key"]
    assert sorted([a["stages"]["prepare_cached"], b["stages"]["prepare_cached"]]) == [False, True]
    store = ResultsStore(a["config"]["results_dir"])
    assert len(list((store.cache_dir / "prepared").glob("*.safetensors"))) == 1
    assert not list((store.cache_dir / "prepared").glob("*.lock"))


def test_busy_key_waits_or_skips(make_cfg, shared, waiting_seen):
    cfg = make_cfg(*FAST, "align=round_up", results_dir=shared)
    store = ResultsStore(cfg["results_dir"])
    store.prepare_for_writing()
    key = spec_from_config(cfg).key
    holder = store.lock(key)
    assert holder.try_acquire()  # an identical job is "running" (this live process holds its lock)
    busy = run_config({**cfg, "on_busy": "skip"})
    assert busy["skipped"] and busy["skip_reason"] == "busy" and busy["busy"]["token"] == holder.info["token"]
    assert not store.is_done(key)
    waiter = _start(cfg)
    try:
        waited = waiting_seen.wait(600)
        done_while_held = store.is_done(key)
    finally:
        holder.release()  # the holder fails (no record): the waiter runs the job itself
        (rec,) = _join(*waiter)
    assert waited and not done_while_held
    assert not rec.get("skipped") and store.is_done(key)
    events = [json.loads(x)["event"] for x in (store.root / "runs" / f"{key}.jsonl").read_text().splitlines()]
    assert events.index("waiting") < events.index("started")


def test_a_resumed_record_keeps_per_attempt_timings(make_cfg, monkeypatch):
    import gac.evaluation as ev

    cfg = make_cfg("compressor=llm_pruner", "align=gac", "eval.tasks=[]")
    real = ev.prefill_latency

    def slow_then_boom(*a, **k):
        time.sleep(0.3)
        raise RuntimeError("node lost during latency")

    monkeypatch.setattr(ev, "prefill_latency", slow_then_boom)
    with pytest.raises(RuntimeError, match="node lost"):
        run_config(cfg)
    monkeypatch.setattr(ev, "prefill_latency", real)
    rec = run_config(cfg)
    t = rec["timings"]
    assert "ppl" in rec["stages"]["resumed"] and "ppl_s" not in t  # not measured by this attempt
    assert all(v <= t["total_s"] for k, v in t.items() if k != "total_s"), t
    first, second = rec["attempts"]
    assert (first["outcome"], second["outcome"]) == ("failed", "completed")
    assert "node lost" in first["error"] and first["timings"]["ppl_s"] > 0 and first["stage"] == "latency"
    assert second["resumed"] == rec["stages"]["resumed"] and second["timings"] == t


def test_a_corrupt_record_is_named_not_a_traceback(make_cfg, shared):
    cfg = make_cfg(*FAST, "align=gac", results_dir=shared)
    rec = run_config(cfg)
    path = ResultsStore(cfg["results_dir"]).record_path(rec["key"])
    path.write_text(path.read_text()[:100])
    with pytest.raises(GacError, match="is not valid JSON.*move it aside"):
        run_config(cfg)
    assert path.read_text()  # never replaced


def test_bad_task_file_fails_before_the_model_loads(make_cfg, tmp_path, monkeypatch):
    import gac.jobs.run.loading as loading

    bad = tmp_path / "piqa.jsonl"
    bad.write_text(json.dumps({"goal": "g", "sol1": "a", "sol2": "b", "label": "x"}) + "\n")
    monkeypatch.setattr(loading, "load_job_model", lambda spec, **_: (_ for _ in ()).throw(AssertionError("loaded")))
    cfg = make_cfg(*FAST)
    cfg["eval"] = {**cfg["eval"], "tasks": ["piqa"]} if cfg["eval"] else {"tasks": ["piqa"]}
    cfg["model"]["task_files"] = {"piqa": str(bad)}
    with pytest.raises(GacError, match=r"piqa.jsonl:1: label must be the integer 0 or 1"):
        run_config(cfg)
    assert not ResultsStore(cfg["results_dir"]).failure_paths(spec_from_config(cfg).key)  # nothing ran


def test_unit_must_be_a_multiple_of_8_and_plans_report_8_16_32(make_cfg, shared):
    with pytest.raises(GacError, match="multiple of 8"):
        run_config(make_cfg(*FAST, "align.unit=7", results_dir=shared))
    rec = run_config(make_cfg(*FAST, "align.unit=16", "align=gac", results_dir=shared))
    assert set(rec["plan"]["aligned_by_unit"]) >= {"8", "16", "32"}
    assert rec["plan"]["aligned_by_unit"]["16"] == 1.0 and rec["plan"]["aligned_by_unit"]["8"] == 1.0
