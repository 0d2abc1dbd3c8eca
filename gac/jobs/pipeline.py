"""One job, as a recipe: lock -> attempt -> stages (load, prepare, plan, evaluate, latency) -> record.

:func:`gac.jobs.config.job_from_config` turns a resolved config into a :class:`~gac.jobs.spec.Job` (what it
computes, how it runs, the config its record keeps); :func:`run_job` runs it against its
:class:`~gac.results.ResultsStore`. Nothing here reads Hydra objects or a config.

Resumption. Every finished stage leaves its output under ``<results_dir>/work/<key>/``
(:mod:`gac.jobs.attempts`); a job that is requeued after a timeout or preemption, or simply launched again, skips
what is there. Scores and factorizations are cached under ``<results_dir>/cache/prepared/``
(:mod:`gac.jobs.prepared_cache`) so the other points of a ratio or strategy sweep re-use them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from gac.errors import ConfigRefused, GacError
from gac.jobs.attempts import Attempt
from gac.jobs.memory_fits import check_job_fits, is_out_of_memory, out_of_memory
from gac.jobs.preflight import preflight
from gac.jobs.provenance import checkout_at_start, job_provenance, safe_provenance
from gac.jobs.spec import Job, JobSpec
from gac.jobs.stages import JobStages, model_aligned_fraction
from gac.results import ResultsStore

log = logging.getLogger(__name__)


def run_job(job: Job, store: ResultsStore | None = None, loggers: Sequence | None = None,
            lock_timeout: float | None = None) -> dict:
    """Run one job end to end and write its record. Returns the record (or the existing one if done).

    ``store``: the job's own results store (``job.run.results_dir``) unless given; ``loggers``: the job's own
    (the store's event log, and W&B when ``job.run.wandb`` says so) unless given.

    The job holds the store's lock for its key while it runs (:mod:`gac.results.lock`): an identical job started
    meanwhile waits for it (``on_busy="wait"``, then returns its record marked ``skipped``) or returns at once
    (``"skip"``). A failure is written to the store with its error (``failures/<key>/``) and re-raised; each
    attempt (completed, failed, or interrupted by a kill) is kept in the record's ``attempts`` with its own timings.
    """
    from gac.jobs.tracking import append_event, build_loggers
    from gac.results.store import results_root

    spec, run = job.spec, job.run
    if store is None:
        store = ResultsStore(results_root(run.results_dir))
    if loggers is None:
        loggers = build_loggers(store.root, run.wandb)
    key, force = spec.key, run.force
    checkout_at_start()  # the commit this process's code came from, before a long job lets the checkout move
    preflight(spec, store, run.save_model, force, run.overrides)
    lock = store.lock(key)
    if store.is_done(key) and not force:
        log.info("job %s is done (%s); skipping (force=true re-runs it)", key, store.record_path(key))
        rec = _skipped(store, key)
        if lock.try_acquire():  # breaks the stale lock of a job killed after publishing its record
            lock.release()
        return rec
    t_request = time.time()
    if not lock.try_acquire():
        from gac.results.lock import describe_holder

        holder = lock.holder()
        if run.on_busy == "skip":
            log.info("job %s is running on %s; skipping it (on_busy=skip)", key, describe_holder(holder))
            return {"key": key, "job": spec.job_fields(), "skipped": True, "skip_reason": "busy", "busy": holder}

        def waiting(h):
            log.info("job %s is running on %s; waiting for it to finish", key, describe_holder(h))
            append_event(store.root, key, "waiting", what="job", holder=describe_holder(h))

        lock.acquire(timeout=lock_timeout, on_wait=waiting)
    try:
        if not force and store.is_done(key):  # the identical job we waited for finished it
            log.info("job %s was finished by the job this one waited for; skipping", key)
            return _skipped(store, key, why="finished by an identical job")
        if force:
            fresh = [p for p in store.record_paths(key) if p.stat().st_mtime >= t_request]
            if fresh:
                return _skipped(store, key, path=fresh[-1], why="re-run by an identical forced job")
        store.clean_leftovers(key)
        return _run_locked(job, store, lock, loggers)
    finally:
        lock.release()


def _run_locked(job: Job, store: ResultsStore, lock, loggers) -> dict:
    """The job under its lock: one attempt through the stages, then its record (or its failure record)."""
    from gac.jobs.tracking import append_event

    spec, run, key = job.spec, job.run, job.spec.key
    base = {"job": spec.job_fields(), "config": job.config, "overrides": list(run.overrides)}
    with Attempt(store, key, fresh=run.force) as attempt, _finishing(loggers, key):
        stages = JobStages(spec, store, attempt, loggers)
        estimate = None  # the memory estimate, named by an out-of-memory error
        try:
            for lg in loggers:
                lg.start(key, spec, base["config"], base["overrides"])
            estimate = check_job_fits(spec)  # before anything is loaded: weights + working set against the device
            model, tokenizer = stages.load(estimate)
            compressed = None
            if not spec.is_baseline:
                compressed = stages.compress(
                    model, tokenizer, refresh=run.force, save_model=run.save_model,
                    on_wait=lambda h: append_event(store.root, key, "waiting", what="scoring", holder=h))
                model = compressed.model
            ev = stages.evaluate(model, tokenizer)
            stages.finish(key)
            attempt.end("completed")
            record = _record(base, spec, stages, compressed, ev, model)
            return _publish(store, key, record, attempt, lock, run.force, loggers)
        except BaseException as e:
            error = _record_failure(e, job, store, base, attempt, stages, estimate, loggers)
            if error is e:
                raise
            raise error from None


def _record(base: dict, spec: JobSpec, stages: JobStages, compressed, ev: dict, model) -> dict:
    """The record of a completed attempt (what :meth:`ResultsStore.write_record` stores)."""
    plan = compressed.plan if compressed else None
    report = compressed.report if compressed else None
    return {
        **base,
        "metrics": ev["metrics"],
        "aligned_fraction": plan["aligned_fraction"] if plan else model_aligned_fraction(model, spec.unit),
        "params": plan["params"] if plan else None,
        "budget": plan["budget"] if plan else None,
        "plan": plan,
        "compression": None if report is None else {k: report[k] for k in (
            "recipe", "dense_params", "params_counted", "n_targets", "compression_wall_s", "notes")},
        "evaluation": ev["details"],
        "profile": compressed.profile if compressed else None,
        "timings": stages.attempt.timings,
        "memory": stages.memory(),
        "attempts": stages.attempt.attempts,
        "stages": {"resumed": stages.attempt.resumed, "prepare_cached": stages.prepare_cached},
        "provenance": job_provenance(spec),
        **({"latency_budget": _latency_block(compressed.latency, ev)} if compressed and compressed.latency else {}),
    }


def _latency_block(block: dict, ev: dict) -> dict:
    """A latency-budget plan's block with the job's own prefill_ms beside its table latency. Both follow the one clock
    rule (:func:`gac.evaluation.latency.timer_for`) at their own thread counts: on a CPU the job's prefill at the job's
    threads (wall time unless it runs one thread), the tables on one thread (thread CPU time); ``gac bench`` measures
    in the tables' units."""
    from gac.metrics import PREFILL

    return {**block, "job_prefill_ms": ev["metrics"].get(PREFILL)}


def _publish(store: ResultsStore, key: str, record: dict, attempt: Attempt, lock, force: bool, loggers) -> dict:
    """Write ``record`` (checked as every reader checks it) and return it as stored."""
    from gac.results.validate import record_problem

    if lock.lost:
        log.warning("job %s lost its lock while running (it was silent longer than the stale bound); an "
                    "identical job may have taken over", key)
    problem = record_problem({"key": key, "status": "completed", "created": "2000-01-01T00:00:00Z", **record}, key)
    if problem:  # never publish a record a reader would refuse
        raise GacError(f"job {key}: its record {problem}; nothing was written (this is a bug in gac or in a "
                       f"compressor: please report it)")
    path = attempt.write_record(lambda: store.write_record(key, record, rerun=force))
    attempt.save_after_record()
    stored = store.read_record(key, path=path)  # exactly what was stored (schema, key, created added)
    mine = (stored.get("attempts") or [{}])[-1]
    ours = ("pid", "started", "host")
    if [mine.get(k) for k in ours] != [attempt.entry[k] for k in ours]:
        log.warning("an identical job wrote the record of %s meanwhile; it was kept, this run's discarded", key)
        stored["skipped"] = True
    stored["_path"] = str(path)
    for lg in loggers:
        lg.log_record(stored)
    return stored


def _record_failure(e: BaseException, job: Job, store: ResultsStore, base: dict, attempt: Attempt,
                    stages: JobStages, estimate, loggers) -> BaseException:
    """End the attempt as failed (or interrupted) and write the failure record; returns the error to raise: ``e``
    itself, or one line naming the stage, the estimate and the fix for an out-of-memory error (the traceback stays
    in the failure record)."""
    spec, key = job.spec, job.spec.key
    attempt.release_space()  # on a full disk: room for the attempt's outcome and the failure record
    if is_out_of_memory(e):
        e = out_of_memory(e, attempt.stage, spec, estimate)
    error = f"{type(e).__name__}: {e}"
    attempt.fail(error, interrupted=isinstance(e, KeyboardInterrupt))
    if isinstance(e, KeyboardInterrupt):
        return e
    if isinstance(e, ConfigRefused):  # the config must change: nothing failed, no failure record
        log.info("job %s refused its config after %s: %s", key, attempt.stage, e)
        return e
    try:
        store.write_failure(key, {**base, "error": error, "traceback": traceback.format_exc(),
                                  "timings": attempt.timings, "memory": stages.memory(),
                                  "attempt": attempt.entry, "provenance": safe_provenance(spec)})
    except Exception as e2:  # noqa: BLE001 - a full disk must not hide the job's own error
        log.error("could not record the failure of %s (%s): %s", key, error, e2)
    for lg in loggers:
        try:
            lg.log_failure(error)
        except Exception as e2:  # noqa: BLE001 - an event log on a full disk must not hide the job's own error
            log.warning("could not log the failure of %s: %s", key, e2)
    return e


@contextlib.contextmanager
def _finishing(loggers, key: str):
    """Every logger's ``finish()`` when the attempt ends, however it ends (a failing one is logged, not raised)."""
    try:
        yield
    finally:
        for lg in loggers:
            try:
                lg.finish()
            except Exception as e2:  # noqa: BLE001 - never mask the job's outcome
                log.warning("a logger of %s did not finish: %s", key, e2)


def _skipped(store: ResultsStore, key: str, path: Path | None = None, why: str = "done") -> dict:
    rec = store.read_record(key, path=path)
    rec["skipped"] = True
    rec["skip_reason"] = why
    rec["_path"] = str(path or store.record_path(key))
    return rec
