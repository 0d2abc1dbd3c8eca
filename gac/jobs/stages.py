"""The stages of a job: load, prepare (calibration, scores, factorization), plan and apply, evaluate (perplexity,
tasks, latency). :class:`JobStages` runs them for one :class:`~gac.jobs.attempts.Attempt`: each is announced to the
attempt and the loggers, timed, metered (wall time and peak memory) and, for the metric groups, saved as a stage
output a later attempt resumes from.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from gac.errors import GacError
from gac.jobs import loading
from gac.jobs.attempts import Attempt
from gac.jobs.config import PROFILE_MODES
from gac.jobs.spec import JobSpec, task_files_of
from gac.progress import stage_done

log = logging.getLogger(__name__)

PREPARE_STAGE_TIMINGS = ("calibration_s", "gradients_s", "score_s", "factorize_s", "sensitivity_s",
                         "sensitivity_estimate_s")


@dataclass
class Compressed:
    """What the prepare and plan stages give the record: the compressed model, its plan, the compression report and
    the hardware profile that filtered the candidates."""

    model: object
    plan: dict
    report: dict
    profile: dict | None
    latency: dict | None = None  # a latency-budget plan's block (gac.jobs.latency_plan): the record's latency_budget


class JobStages:
    """The stages of one attempt at ``spec``, in the order a job runs them."""

    def __init__(self, spec: JobSpec, store, attempt: Attempt, loggers=()):
        from gac.compression.resources import ResourceMeter

        self.spec, self.store, self.attempt, self.loggers = spec, store, attempt, loggers
        self.meter = ResourceMeter(spec.device)  # wall time and peak memory per stage -> record["memory"]
        self.sub_memory: dict = {}  # the stages inside prepare / compress (calibration, score, factorize, plan, ...)
        self.prepare_cached: bool | None = None  # whether the prepare stage re-used the cache
        self.placement: dict | None = None  # with model.device_map=auto: the units on each device
        self.estimate = None  # the memory estimate made before loading (record["memory"]["estimate"])
        self.t_start = time.perf_counter()

    def enter(self, stage: str) -> None:
        """The job enters ``stage``: the attempt records it, the loggers hear it, any injected fault runs."""
        self.attempt.enter(stage)
        stage_hook(self.loggers, stage)

    def load(self, estimate=None):
        """The model and tokenizer (:func:`gac.jobs.loading.load_job_model`); ``estimate``: the memory estimate made
        before loading (a model spread over devices keeps its working set free on each GPU)."""
        self.estimate = estimate
        self.enter("load")
        t0 = time.perf_counter()
        with self.meter.stage("load"):
            if self.spec.device_map == "auto":
                from gac.models.placement import placement_summary, working_set

                model, tokenizer = loading.load_job_model(self.spec, 0 if estimate is None else working_set(estimate))
                self.placement = placement_summary(model)
            else:
                model, tokenizer = loading.load_job_model(self.spec)
        self.attempt.timings["load_s"] = time.perf_counter() - t0
        stage_done("load", self.attempt.timings["load_s"], self.spec.model_name)
        return model, tokenizer

    def compress(self, model, tokenizer, refresh: bool = False, on_wait=None, save_model: str | None = None):
        """Prepare (calibration, scores, factorization, or the shared cache entry), then plan and apply the aligned
        dimensions in place; saves the plan as a stage output and, with ``save_model``, a checkpoint."""
        from gac.jobs.prepared_cache import prepare_cached

        spec, timings = self.spec, self.attempt.timings
        self.enter("prepare")
        t0 = time.perf_counter()
        with self.meter.stage("prepare"):
            prepared = prepare_cached(spec, model, tokenizer, self.store.cache_dir, refresh=refresh, on_wait=on_wait)
        timings["compress_prepare_s"] = time.perf_counter() - t0
        stage_done("prepare", timings["compress_prepare_s"],
                   "cached scores" if prepared.timings.get("cached") else "calibration, scores, factorization")
        self.prepare_cached = bool(prepared.timings.get("cached"))
        if not self.prepare_cached:
            timings.update({k: v for k, v in prepared.timings.items() if k in PREPARE_STAGE_TIMINGS})
            self.sub_memory.update(prepared.memory)
        self.enter("plan")
        t0 = time.perf_counter()
        with self.meter.stage("sweep", sample=False):  # the dimension sweep times kernels: no sampler thread
            targets, budget = prepared.targets(spec.ratio, spec.unit, spec.knapsack_score)
            filt, profile = candidate_filter(spec, targets, self.store.cache_dir)
        timings["sweep_s"] = time.perf_counter() - t0
        planned, latency_block, latency_s = None, None, 0.0
        if spec.latency is not None:  # a latency budget: tables timed (or predicted) now, on the uncompressed model
            from gac.jobs.latency_plan import latency_plan

            t0 = time.perf_counter()
            plan, latency_block = latency_plan(spec, model, targets, budget, filt, self.store.cache_dir)
            planned, latency_s = (plan, targets), time.perf_counter() - t0
        model, plan, report = prepared.compress(spec.ratio, spec.strategy, spec.unit, spec.window, filt,
                                                copy_model=False, knapsack_score=spec.knapsack_score, planned=planned)
        timings["dp_s"] = latency_s + report["timings"]["plan_s"]
        timings["compress_apply_s"] = report["timings"]["apply_s"]
        stage_done("plan and apply", timings["sweep_s"] + timings["dp_s"] + timings["compress_apply_s"],
                   f"{spec.strategy}, ratio {spec.ratio:g}")
        self.sub_memory.update({k: v for k, v in report["memory"].items() if k in ("plan", "apply")})
        plan_json = plan.to_json()
        plan_json["d_star"] = report["d_star"]
        if self.attempt.outputs.get("plan") is None:
            self.attempt.outputs.put("plan", plan_json)
        del prepared
        if save_model:
            from gac.compression.checkpoint import save_checkpoint
            from gac.jobs.preflight import SAVE_MODEL_REPLACE

            save_checkpoint(model, tokenizer, save_model, recipe=report["recipe"], plan=plan,
                            replace_hint=SAVE_MODEL_REPLACE)
        return Compressed(model, plan_json, report, None if profile is None else dict(profile.meta), latency_block)

    def evaluate(self, model, tokenizer) -> dict:
        """Perplexity, tasks and latency as the spec asks: ``{"metrics", "details"}``."""
        t0 = time.perf_counter()
        with self.meter.stage("evaluate"):
            ev = evaluate(self.spec, model, tokenizer, self.attempt, self.enter, self.meter)
        self.attempt.timings["evaluate_s"] = time.perf_counter() - t0
        return ev

    def finish(self, key: str) -> None:
        """The job's total time, in the timings and on the console."""
        self.attempt.timings["total_s"] = time.perf_counter() - self.t_start
        stage_done("job", self.attempt.timings["total_s"], key)

    def memory(self) -> dict:
        out = resources(self.meter, self.sub_memory, self.spec, self.estimate)
        if self.placement is not None:
            out["placement"] = self.placement
        return out


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


def evaluate(spec: JobSpec, model, tokenizer, attempt: Attempt, hook=None, meter=None) -> dict:
    """The metric groups the spec asks for, through the one evaluation (:func:`gac.evaluation.suite.evaluate`), each
    resumed from an earlier attempt's stage output or measured now: ``{"metrics": flat metrics of the record,
    "details": each group's full output}``."""
    from gac.engines import open_engine
    from gac.evaluation.suite import evaluate as evaluate_model

    ev = spec.eval
    main = (ev.latency_batch, spec.seq_len)  # the job's own point: `prefill_ms`, named once
    points = ([(ev.latency_batch, s) for s in ev.latency_seq_lens] + [tuple(p) for p in ev.latency_batches]
              if ev.latency else [])
    out = evaluate_model(
        model, tokenizer, ppl_source=spec.ppl_source if ev.ppl and spec.ppl_source else None,
        ppl_seq_len=ev.ppl_seq_len, ppl_batch_size=ev.batch_size, ppl_max_windows=ev.ppl_max_windows,
        ppl_stride=ev.ppl_stride, tasks=ev.tasks, limit=ev.limit, task_files=task_files_of(spec.task_files),
        task_batch_size=ev.batch_size, latency_points=points, main_point=main,
        decode_tokens=ev.decode_tokens if ev.latency else 0, decode_batch=ev.latency_batch, warmup=ev.warmup,
        iters=ev.iters, trials=ev.trials, seed=spec.seed, outputs=attempt.outputs, timings=attempt.timings,
        resumed=attempt.resumed, on_stage=hook,
        measure=None if meter is None else (lambda name, sample: meter.stage(name, sample=sample)),
        engine=ev.engine, open_engine=open_engine)
    details = {k: out[k] for k in ("perplexity", "tasks", "lm_eval", "latency") if out[k] is not None}
    return {"metrics": out["metrics"], "details": details}


def resources(meter, sub_memory: dict, spec: JobSpec, estimate=None) -> dict:
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
    out = {"device": spec.device, "peak_rss_mb": meter.peak_mb(), "stages": stages}
    gpu = [v["gpu_peak_mb"] for v in stages.values() if "gpu_peak_mb" in v]
    if gpu:
        out["gpu_peak_mb"] = max(gpu)
        own = device_label(meter.gpu.key) if meter.gpu is not None else spec.device
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
