"""One job, as a recipe read top to bottom: load -> prepare -> plan -> apply -> evaluate -> record.

:func:`run_config` turns a resolved config into the :class:`~gac.jobs.config.spec.Job`
(:func:`gac.jobs.config.build.job_from_config`: what it computes, how it runs, the config its record keeps) and runs it;
:func:`run_job` runs a Job against its
:class:`~gac.results.ResultsStore`: its lock, then one :class:`~gac.jobs.run.attempts.Attempt` through the steps of
:class:`Recipe`, then its record. Every step runs in one :class:`StageContext`, which announces it (to the attempt,
the loggers, any injected fault), times it and meters it (wall time and peak memory, the record's ``memory``).

The levels, by name: a *step* of this recipe (:meth:`Recipe.load`, ``prepare``, ``plan``, ``apply``,
``evaluate``) calls the library once (:func:`gac.compression.preparation.prepare`,
:meth:`gac.compression.prepared.Prepared.compress`, :func:`gac.evaluation.suite.evaluate`). ``gac compress`` runs
``load``, ``prepare``, ``plan`` and ``apply`` and saves a checkpoint (:meth:`Recipe.save`): the recipe without
evaluate and record; ``gac evaluate`` runs ``load`` and ``evaluate``: the recipe from a checkpoint (or any model), its
flags the Job's :class:`~gac.jobs.config.spec.EvalSpec`; ``gac export`` loads through ``load``. None of them has an
attempt or a record: their :class:`StageContext` announces nothing. :func:`evaluation_arguments` is the one place an
``EvalSpec`` becomes the evaluation's arguments.

Resumption. Every finished stage leaves its output under ``<results_dir>/work/<key>/``
(:mod:`gac.jobs.run.attempts`); a job that is requeued after a timeout or preemption, or simply launched again, skips
what is there. Scores and factorizations are cached under ``<results_dir>/cache/prepared/``
(:mod:`gac.jobs.run.prepared_cache`) so the other points of a ratio or strategy sweep re-use them. Nothing here reads
Hydra objects.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gac.errors import ConfigRefused, GacError
from gac.jobs.run.attempts import Attempt
from gac.jobs.config.build import PROFILE_MODES
from gac.jobs.config.spec import Job, JobSpec, task_files_of
from gac.progress import stage_done
from gac.results import ResultsStore

log = logging.getLogger(__name__)

#: the prepare step's own timings a record keeps (a prepare re-used from the cache measured none of them)
PREPARE_STAGE_TIMINGS = ("calibration_s", "gradients_s", "score_s", "factorize_s", "sensitivity_s",
                         "sensitivity_estimate_s")


# ------------------------------------------------------------------------------------------------ the entry points
def run_config(cfg: dict, overrides: Sequence[str] = (), sweep_dir: str | None = None) -> dict:
    """Validate ``cfg`` (a resolved config as a plain dict), run the job, return its record."""
    from gac.checks import check_environment
    from gac.jobs.config.build import job_from_config
    from gac.progress import quiet_libraries, set_quiet

    check_environment()  # the environment of the node the job runs on, before any work
    job = job_from_config(cfg, overrides, sweep_dir)  # the config read once: the job, how it runs, what its record says
    if job.run.quiet is not None:
        set_quiet(job.run.quiet)
    quiet_libraries(verbose=job.run.verbose)
    if overrides and sweep_dir is None:  # a sweep's points were checked together when it started (SweepCallback)
        from gac.jobs.config.axes import check_overrides

        check_overrides(job.spec, cfg, overrides)  # a setting this job cannot use: refused before any work
    return run_job(job)


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
    from gac.jobs.run.preflight import preflight
    from gac.jobs.run.provenance import checkout_at_start
    from gac.jobs.tracking.loggers import append_event, build_loggers
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
        return _run_attempt(JobRun(job, store, lock, loggers))
    finally:
        lock.release()


@dataclass
class JobRun:
    """What one run of a job works with under its lock: the job, its store, the lock it holds, its loggers."""

    job: Job
    store: ResultsStore
    lock: object
    loggers: Sequence

    @property
    def key(self) -> str:
        return self.job.spec.key

    def base(self) -> dict:
        """What every record of this run starts with (the completed one and a failure record)."""
        return {"job": self.job.spec.job_fields(), "config": self.job.config, "overrides": list(self.job.run.overrides)}


# ------------------------------------------------------------------------------------------------------ the recipe
def _run_attempt(run: JobRun) -> dict:
    """The job under its lock, top to bottom: one attempt through the steps, then its record (or its failure
    record)."""
    from gac.jobs.run.memory_fits import check_job_fits
    from gac.jobs.tracking.loggers import append_event

    job, spec, store, key = run.job, run.job.spec, run.store, run.key
    with Attempt(store, key, fresh=job.run.force) as attempt, _finishing(run.loggers, key):
        stages = StageContext(spec.device, attempt, run.loggers)
        recipe = Recipe(spec, stages, cache_dir=store.cache_dir)
        estimate = None  # the memory estimate, named by an out-of-memory error
        try:
            for lg in run.loggers:
                lg.start(key, spec, job.config, list(job.run.overrides))
            estimate = check_job_fits(spec)  # before anything is loaded: weights + working set against the device
            model, tokenizer = recipe.load(estimate)
            compressed = None
            if not spec.is_baseline:
                prepared = recipe.prepare(model, tokenizer, refresh=job.run.force, on_wait=lambda h: append_event(
                    store.root, key, "waiting", what="scoring", holder=h))
                planned = recipe.plan(prepared, model)
                compressed = recipe.apply(prepared, planned)
                del prepared
                if job.run.save_model:
                    recipe.save_once(compressed, tokenizer, job.run.save_model)
                model = compressed.model
            measured = recipe.evaluate(model, tokenizer)
            stages.finish(key)
            attempt.end("completed")
            record = _record(run, recipe, compressed, measured, model)
            return _publish(run, record, attempt)
        except BaseException as e:
            error = _record_failure(e, run, attempt, recipe, estimate)
            if error is e:
                raise
            raise error from None


class StageContext:
    """Where every step runs: ``with stages.stage("prepare", timing="compress_prepare_s"):`` announces the stage
    (the attempt records it, the loggers hear it, any injected fault runs), meters it (wall time and peak memory,
    the record's ``memory``) and times it into ``timings``. Without an attempt (``gac compress``, ``gac evaluate``,
    ``gac export``) nothing is announced and the timings are its own."""

    def __init__(self, device: str, attempt: Attempt | None = None, loggers: Sequence = ()):
        from gac.compression.resources import ResourceMeter

        self.attempt, self.loggers = attempt, loggers
        self.timings: dict = attempt.timings if attempt is not None else {}
        self.meter = ResourceMeter(device)  # wall time and peak memory per stage -> record["memory"]
        self.sub_memory: dict = {}  # the stages inside prepare / apply (calibration, score, factorize, plan, ...)
        self.t_start = time.perf_counter()

    def enter(self, stage: str) -> None:
        """The job enters ``stage``: the attempt records it, the loggers hear it, any injected fault runs."""
        if self.attempt is not None:
            self.attempt.enter(stage)
            stage_hook(self.loggers, stage)

    @contextlib.contextmanager
    def stage(self, name: str | None, timing: str | None = None, meter: str | None = None, sample: bool = True):
        """Run a step: announced as ``name`` (None: inside the stage announced last), metered as ``meter``, its
        seconds added to ``timings[timing]``."""
        if name is not None:
            self.enter(name)
        t0 = time.perf_counter()
        with self.meter.stage(meter, sample=sample) if meter else contextlib.nullcontext():
            yield
        if timing is not None:
            self.timings[timing] = time.perf_counter() - t0

    def measure(self, name: str, sample: bool) -> contextlib.AbstractContextManager:
        """A stage inside a step, metered as ``name`` (the evaluation's groups)."""
        return self.meter.stage(name, sample=sample)

    def finish(self, key: str) -> None:
        """The job's total time, in the timings and on the console."""
        self.timings["total_s"] = time.perf_counter() - self.t_start
        stage_done("job", self.timings["total_s"], key)

    def memory(self, device: str, placement: dict | None = None, estimate=None) -> dict:
        """The record's ``memory`` block (:func:`resources`), with a spread model's placement."""
        out = resources(self.meter, self.sub_memory, device, estimate)
        if placement is not None:
            out["placement"] = placement
        return out


@dataclass
class Compressed:
    """What the prepare, plan and apply steps give the record: the compressed model, its plan, the compression
    report and the hardware profile that filtered the candidates."""

    model: object
    plan: dict
    report: dict
    profile: dict | None
    latency: dict | None = None  # a latency-budget plan's block (gac.jobs.run.latency_plan): the record's latency_budget


@dataclass
class Planned:
    """What the plan step gives the apply step: the targets and budget of the job's ratio, the candidate filter (and
    the profile behind it), and a latency budget's plan made on the uncompressed model (with its record block)."""

    targets: list
    budget: int
    candidate_filter: object
    profile: object
    plan: tuple | None = None  # (plan, targets) of a latency budget; None: Prepared.compress plans by parameters
    latency: dict | None = None
    latency_s: float = 0.0


class Recipe:
    """The steps of one job, in the order it runs them, each in ``stages``. ``cache_dir``: the store's cache (the
    shared prepared state, the profiles); None for a run without a store (``gac compress``)."""

    def __init__(self, spec: JobSpec, stages: StageContext, cache_dir: Path | None = None,
                 sensitivity_limit_s: float | None | str = "env"):
        self.spec, self.stages, self.cache_dir = spec, stages, cache_dir
        self.sensitivity_limit_s = sensitivity_limit_s
        self.prepare_cached: bool | None = None  # whether the prepare step re-used the cache
        self.placement: dict | None = None  # with model.device_map=auto: the units on each device
        self.estimate = None  # the memory estimate made before loading (record["memory"]["estimate"])

    def load(self, estimate=None, verify: bool = True):
        """The model and tokenizer (:func:`gac.jobs.run.loading.load_job_model`); ``estimate``: the memory estimate made
        before loading (a model spread over devices keeps its working set free on each GPU); ``verify``: check a gac
        checkpoint's sha256 (``gac evaluate --no-verify`` skips it)."""
        from gac.jobs.run import loading

        spec = self.spec
        self.estimate = estimate
        with self.stages.stage("load", timing="load_s", meter="load"):
            if spec.device_map == "auto":
                from gac.models.placement import placement_summary, working_set

                model, tokenizer = loading.load_job_model(spec, 0 if estimate is None else working_set(estimate),
                                                          verify=verify)
                self.placement = placement_summary(model)
            else:
                model, tokenizer = loading.load_job_model(spec, verify=verify)
        stage_done("load", self.stages.timings["load_s"], spec.model_name)
        return model, tokenizer

    def prepare(self, model, tokenizer, refresh: bool = False, on_wait=None):
        """Calibration, scores and factorization (paper Step 1), or the shared cache entry of an identical one."""
        from gac.jobs.run.prepared_cache import prepare_cached

        spec, stages = self.spec, self.stages
        with stages.stage("prepare", timing="compress_prepare_s", meter="prepare"):
            prepared = prepare_cached(spec, model, tokenizer, self.cache_dir, refresh=refresh, on_wait=on_wait,
                                      sensitivity_limit_s=self.sensitivity_limit_s)
        stage_done("prepare", stages.timings["compress_prepare_s"],
                   "cached scores" if prepared.timings.get("cached") else "calibration, scores, factorization")
        self.prepare_cached = bool(prepared.timings.get("cached"))
        if not self.prepare_cached:
            stages.timings.update({k: v for k, v in prepared.timings.items() if k in PREPARE_STAGE_TIMINGS})
            stages.sub_memory.update(prepared.memory)
        return prepared

    def plan(self, prepared, model) -> Planned:
        """The targets of the ratio and the candidate filter (paper Step 2: the dimension sweep), and a latency
        budget's plan, timed (or predicted) now on the uncompressed model."""
        spec = self.spec
        with self.stages.stage("plan", timing="sweep_s", meter="sweep", sample=False):  # kernels timed: no sampler
            targets, budget = prepared.targets(spec.ratio, spec.unit, spec.knapsack_score)
            filt, profile = candidate_filter(spec, targets, self.cache_dir)
        planned = Planned(targets, budget, filt, profile)
        if spec.latency is not None:
            from gac.jobs.run.latency_plan import latency_plan

            t0 = time.perf_counter()
            plan, planned.latency = latency_plan(spec, model, targets, budget, filt, self.cache_dir)
            planned.plan, planned.latency_s = (plan, targets), time.perf_counter() - t0
        return planned

    def apply(self, prepared, planned: Planned) -> Compressed:
        """The plan (paper Step 3, Eq. 4; unless the plan step made it) applied to the model in place; the plan saved
        as a stage output."""
        spec, timings = self.spec, self.stages.timings
        model, plan, report = prepared.compress(spec.ratio, spec.strategy, spec.unit, spec.window,
                                                planned.candidate_filter, copy_model=False,
                                                knapsack_score=spec.knapsack_score, planned=planned.plan)
        timings["dp_s"] = planned.latency_s + report["timings"]["plan_s"]
        timings["compress_apply_s"] = report["timings"]["apply_s"]
        stage_done("plan and apply", timings["sweep_s"] + timings["dp_s"] + timings["compress_apply_s"],
                   f"{spec.strategy}, ratio {spec.ratio:g}")
        self.stages.sub_memory.update({k: v for k, v in report["memory"].items() if k in ("plan", "apply")})
        plan_json = plan.to_json()
        plan_json["d_star"] = report["d_star"]
        attempt = self.stages.attempt
        if attempt is not None and attempt.outputs.get("plan") is None:
            attempt.outputs.put("plan", plan_json)
        profile = None if planned.profile is None else dict(planned.profile.meta)
        return Compressed(model, plan_json, report, profile, planned.latency)

    @staticmethod
    def save(compressed: Compressed, tokenizer, path, overwrite: bool = False, replace_hint: str | None = None):
        """The compressed model as a gac checkpoint at ``path`` (its recipe and plan with it)."""
        from gac.compression.checkpoint import save_checkpoint
        from gac.jobs.run.preflight import SAVE_MODEL_REPLACE

        return save_checkpoint(compressed.model, tokenizer, path, recipe=compressed.report["recipe"],
                               overwrite=overwrite, replace_hint=replace_hint or SAVE_MODEL_REPLACE)

    def save_once(self, compressed: Compressed, tokenizer, path) -> None:
        """The job's ``save_model``: saved and recorded as the ``saved`` stage output, or kept as it is when an
        earlier attempt of this job saved it (a requeued job neither refuses nor replaces its own checkpoint)."""
        from gac.jobs.run.attempts import saved_by_this_job, saved_output

        attempt = self.stages.attempt
        if attempt is not None and saved_by_this_job(attempt.outputs, path):
            log.info("the checkpoint at %s was saved by an earlier attempt of this job; kept", path)
            attempt.resumed.append("saved")
            return
        self.save(compressed, tokenizer, path)
        if attempt is not None:
            attempt.outputs.put("saved", saved_output(path))

    def evaluate(self, model, tokenizer) -> dict:
        """Perplexity, tasks and latency as the spec asks: ``{"metrics", "details"}``."""
        with self.stages.stage(None, timing="evaluate_s", meter="evaluate"):
            ev = evaluate_job(self.spec, model, tokenizer, self.stages)
        return ev

    def memory(self) -> dict:
        return self.stages.memory(self.spec.device, self.placement, self.estimate)


def evaluate_job(spec: JobSpec, model, tokenizer, stages: StageContext | None = None) -> dict:
    """The metric groups the spec asks for, through the one evaluation (:func:`gac.evaluation.suite.evaluate`) with
    the spec's protocol (:func:`evaluation_arguments`): ``{"metrics": flat metrics of the record, "details": each
    group's full output}``. Run in ``stages``: with its attempt, each group is resumed from an earlier attempt's stage
    output or measured now and kept; without one (``gac evaluate``), measured now and kept in memory."""
    from gac.engines import open_engine
    from gac.evaluation.suite import GROUPS
    from gac.evaluation.suite import evaluate as evaluate_model

    attempt = None if stages is None else stages.attempt
    out = evaluate_model(
        model, tokenizer, **evaluation_arguments(spec), outputs=None if attempt is None else attempt.outputs,
        timings=None if stages is None else stages.timings, resumed=None if attempt is None else attempt.resumed,
        on_stage=None if stages is None else stages.enter, measure=None if stages is None else stages.measure,
        open_engine=open_engine)
    details = {k: out[k] for k in GROUPS if out[k] is not None}
    return {"metrics": out["metrics"], "details": details}


def evaluation_arguments(spec: JobSpec) -> dict:
    """What :func:`gac.evaluation.suite.evaluate` measures for ``spec`` and by which protocol: the one place a job's
    :class:`~gac.jobs.config.spec.EvalSpec` becomes the evaluation's arguments (a job's and ``gac evaluate``'s
    alike). The latency points are ``eval.latency_seq_lens`` at ``eval.latency_batch`` and ``eval.latency_batches``;
    the job's own point, reported as ``prefill_ms``, is ``(eval.latency_batch, seq_len)``."""
    ev = spec.eval
    points = ([(ev.latency_batch, s) for s in ev.latency_seq_lens] + [tuple(p) for p in ev.latency_batches]
              if ev.latency else [])
    return dict(
        ppl_source=spec.ppl_source if ev.ppl and spec.ppl_source else None, ppl_seq_len=ev.ppl_seq_len,
        ppl_batch_size=ev.batch_size, ppl_max_windows=ev.ppl_max_windows, ppl_stride=ev.ppl_stride, tasks=ev.tasks,
        limit=ev.limit, task_files=task_files_of(spec.task_files), task_batch_size=ev.batch_size,
        latency_points=points, main_point=(ev.latency_batch, spec.seq_len),
        decode_tokens=ev.decode_tokens if ev.latency else 0, decode_prompt=ev.decode_prompt,
        decode_batch=ev.latency_batch, warmup=ev.warmup, iters=ev.iters, trials=ev.trials, seed=spec.seed,
        engine=ev.engine)


# ------------------------------------------------------------------------------------------------------ the record
def _record(run: JobRun, recipe: Recipe, compressed: Compressed | None, measured: dict, model) -> dict:
    """The record of a completed attempt (what :meth:`ResultsStore.write_record` stores)."""
    from gac.jobs.run.provenance import job_provenance

    spec, attempt = run.job.spec, recipe.stages.attempt
    plan = compressed.plan if compressed else None
    report = compressed.report if compressed else None
    return {
        **run.base(),
        "metrics": measured["metrics"],
        "aligned_fraction": plan["aligned_fraction"] if plan else model_aligned_fraction(model, spec.unit),
        "params": plan["params"] if plan else None,
        "budget": plan["budget"] if plan else None,
        "plan": plan,
        "compression": None if report is None else {k: report[k] for k in (
            "recipe", "dense_params", "params_counted", "n_targets", "compression_wall_s", "notes")},
        "evaluation": measured["details"],
        "profile": compressed.profile if compressed else None,
        "timings": attempt.timings,
        "memory": recipe.memory(),
        "attempts": attempt.attempts,
        "stages": {"resumed": attempt.resumed, "prepare_cached": recipe.prepare_cached},
        "provenance": job_provenance(spec),
        **({"latency_budget": _latency_block(compressed.latency, measured)}
           if compressed and compressed.latency else {}),
    }


def _latency_block(block: dict, measured: dict) -> dict:
    """A latency-budget plan's block with the job's own prefill_ms beside its table latency. Both follow the one clock
    rule (:func:`gac.evaluation.latency.timer_for`) at their own thread counts: on a CPU the job's prefill at the job's
    threads (wall time unless it runs one thread), the tables on one thread (thread CPU time); ``gac bench`` measures
    in the tables' units."""
    from gac.metrics import PREFILL

    return {**block, "job_prefill_ms": measured["metrics"].get(PREFILL)}


def _publish(run: JobRun, record: dict, attempt: Attempt) -> dict:
    """Write ``record`` (checked as every reader checks it) and return it as stored."""
    from gac.results.validate import record_problem

    store, key = run.store, run.key
    if run.lock.lost:
        log.warning("job %s lost its lock while running (it was silent longer than the stale bound); an "
                    "identical job may have taken over", key)
    problem = record_problem({"key": key, "status": "completed", "created": "2000-01-01T00:00:00Z", **record}, key)
    if problem:  # never publish a record a reader would refuse
        raise GacError(f"job {key}: its record {problem}; nothing was written (this is a bug in gac or in a "
                       f"compressor: please report it)")
    path = attempt.write_record(lambda: store.write_record(key, record, rerun=run.job.run.force))
    attempt.save_after_record()
    stored = store.read_record(key, path=path)  # exactly what was stored (schema, key, created added)
    mine = (stored.get("attempts") or [{}])[-1]
    ours = ("pid", "started", "host")
    if [mine.get(k) for k in ours] != [attempt.entry[k] for k in ours]:
        log.warning("an identical job wrote the record of %s meanwhile; it was kept, this run's discarded", key)
        stored["skipped"] = True
    stored["_path"] = str(path)
    for lg in run.loggers:
        lg.log_record(stored)
    return stored


def _record_failure(e: BaseException, run: JobRun, attempt: Attempt, recipe: Recipe, estimate) -> BaseException:
    """End the attempt as failed (or interrupted) and write the failure record; returns the error to raise: ``e``
    itself, or one line naming the stage, the estimate and the fix for an out-of-memory error (the traceback stays
    in the failure record)."""
    from gac.jobs.run.memory_fits import is_out_of_memory, out_of_memory
    from gac.jobs.run.provenance import safe_provenance

    spec, key = run.job.spec, run.key
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
        run.store.write_failure(key, {**run.base(), "error": error, "traceback": traceback.format_exc(),
                                      "timings": attempt.timings, "memory": recipe.memory(),
                                      "attempt": attempt.entry, "provenance": safe_provenance(spec)})
    except Exception as e2:  # noqa: BLE001 - a full disk must not hide the job's own error
        log.error("could not record the failure of %s (%s): %s", key, error, e2)
    for lg in run.loggers:
        try:
            lg.log_failure(error)
        except Exception as e2:  # noqa: BLE001 - an event log on a full disk must not hide the job's own error
            log.warning("could not log the failure of %s: %s", key, e2)
    return e


# ------------------------------------------------------------------------------------------- what the steps use
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


def stage_hook(loggers, stage: str) -> None:
    """A job enters ``stage``: tell the loggers (``gac launch status`` shows it) and run any injected fault."""
    from gac.faults import fault_point

    for lg in loggers:
        if hasattr(lg, "log_stage"):
            lg.log_stage(stage)
    fault_point(stage)


def candidate_filter(spec: JobSpec, targets, cache_dir: Path | None):
    """Paper Step 2: a hardware profile of the job's device for the targets' kernels, as a candidate filter."""
    if not spec.use_profile or spec.profile == "none":
        return None, None
    from gac.profiling import ProfileFilter, dimension_sweep

    explicit = spec.profile not in PROFILE_MODES
    from gac.profiling.published import PUBLISHED_GPUS

    if spec.profile == "auto" and spec.gpu in PUBLISHED_GPUS:
        # a profile measured on this node (cached) or shipped for this device wins; else the published one of the GPU
        try:
            profile = dimension_sweep(
                targets, device=spec.device, dtype=spec.dtype or "auto", seq_len=spec.seq_len, unit=spec.unit,
                window=spec.window, cache_dir=None if cache_dir is None else cache_dir / "profiles", measure=False)
            profile.meta["used"] = "measured on this node (cached) or shipped for this device"
            return ProfileFilter(profile, device=spec.device, allow_device_mismatch=spec.allow_profile_mismatch), profile
        except GacError:
            from gac.profiling.published import published_profile

            profile = published_profile(spec.gpu)
            profile.meta["used"] = (f"published {spec.gpu} kernel data (no profile measured on this node): "
                                    f"{profile.device_name}")
            log.info("candidate filter: %s", profile.meta["used"])
            return ProfileFilter(profile), profile  # a GPU model's published data: no device-name check
    profile = dimension_sweep(
        targets, device=spec.device, dtype=spec.dtype or "auto", seq_len=spec.seq_len, unit=spec.unit,
        window=spec.window, cache_dir=None if cache_dir is None else cache_dir / "profiles",
        profile_dir=spec.profile if explicit else None, allow_device_mismatch=spec.allow_profile_mismatch,
    )
    filt = ProfileFilter(profile, device=spec.device, allow_device_mismatch=spec.allow_profile_mismatch)
    return filt, profile


def resources(meter, sub_memory: dict, device: str, estimate=None) -> dict:
    """The record's ``memory`` block: peak host RSS (and GPU memory on CUDA) per stage, in MiB.

    ``stages`` holds the job's own stages (load, prepare, sweep, evaluate, ppl, tasks, latency) and those measured
    inside prepare / compress (calibration, gradients, score, factorize, sensitivity, plan, apply); each has
    ``peak_rss_mb`` (the highest resident set size while it ran), ``start_rss_mb``, ``end_rss_mb`` and, on a CUDA
    device, ``gpu_peak_mb`` (``torch.cuda.max_memory_allocated`` since the stage's start; a stage's peak is the maximum
    over every stage inside it, :mod:`gac.compression.resources`); ``gpu_peaks_mb``: the job's peak on each GPU it
    metered (the job's own and every other visible one); ``estimate``: what the memory check estimated before loading
    (:func:`gac.compression.footprint.estimate_footprint`, in MiB), to hold against the peaks."""
    from gac.compression.resources import MB, device_label

    stages = {**meter.memory(), **sub_memory}
    out = {"device": device, "peak_rss_mb": meter.peak_mb(), "stages": stages}
    gpu = [v["gpu_peak_mb"] for v in stages.values() if "gpu_peak_mb" in v]
    if gpu:
        out["gpu_peak_mb"] = max(gpu)
        own = device_label(meter.gpu.key) if meter.gpu is not None else device
        peaks: dict[str, float] = {}
        for v in stages.values():
            for dev, mb in (v.get("gpu_peaks_mb") or {own: v.get("gpu_peak_mb", 0.0)}).items():
                peaks[dev] = max(peaks.get(dev, 0.0), mb)
        out["gpu_peaks_mb"] = peaks
    if estimate is not None:
        out["estimate"] = {"device_mb": round(estimate.device_bytes / MB, 1),
                           "host_mb": round(estimate.host_bytes / MB, 1), "weights_mb": round(estimate.weights / MB, 1),
                           "dtype": estimate.dtype, "params": int(estimate.params)}
    return out


def model_aligned_fraction(model, unit: int) -> float | None:
    """Aligned fraction of an uncompressed model's Linear dims (the baseline row)."""
    from torch import nn

    dims = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            dims += [m.in_features, m.out_features]
    return None if not dims else sum(d % unit == 0 for d in dims) / len(dims)
