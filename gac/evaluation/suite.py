"""The one evaluation: perplexity, lm-eval tasks and latency of a model, as a job and ``gac evaluate`` both run it.

:func:`evaluate` runs the groups asked for, in that order, and returns ``{"metrics", "perplexity", "tasks",
"lm_eval", "latency"}``: ``metrics`` flat with the names the results store uses (:mod:`gac.metrics`: ``ppl_<text>``,
``<task>_<metric>``, ``prefill_ms`` for the main latency point and every other point under its own name,
``decode_ms_per_token``), each group's full output beside it, ``latency`` as ``{point name: timing, "decode":
timing}``.

What a caller adds is where each group's output is kept (``outputs``, anything with ``get(name)`` and
``put(name, value)``): a job keeps them in its work directory, so an attempt requeued after a timeout resumes from the
groups (and the latency points) an earlier attempt finished (:mod:`gac.jobs.run.attempts`); ``gac evaluate`` keeps them in
memory. ``timings`` receives ``<group>_s`` for the work this call did (a resumed group adds none), ``resumed`` the
names it took from ``outputs``, ``on_stage(name)`` is told before a group starts (a job's loggers and fault points),
``measure(name, sample)`` gives the context a group runs in (a job's memory meter).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

from gac.errors import GacError

log = logging.getLogger(__name__)

STAGE_NAMES = {"tasks": "lm-eval tasks"}
#: the groups :func:`evaluate` returns beside ``metrics`` (None where not measured)
GROUPS = ("perplexity", "tasks", "lm_eval", "latency")


class MemoryOutputs(dict):
    """Group outputs kept in memory (``gac evaluate``): the same ``get``/``put`` a job's work directory has."""

    def put(self, name: str, value) -> None:
        self[name] = value


def _run(name: str, compute, outputs, timings: dict, resumed: list, on_stage) -> dict:
    """A group's output from ``outputs`` if an earlier attempt finished it, else computed (timed as ``<name>_s``)
    and put there."""
    from gac.progress import stage_done

    got = outputs.get(name)
    if got is not None:
        resumed.append(name)
        return got
    if on_stage is not None:
        on_stage(name)
    t0 = time.perf_counter()
    got = compute()
    got["seconds"] = time.perf_counter() - t0
    timings[f"{name}_s"] = got["seconds"]
    if name in STAGE_NAMES:  # perplexity's own progress already closed with its time
        stage_done(STAGE_NAMES[name], got["seconds"])
    outputs.put(name, got)
    return got


#: the batch of perplexity windows and lm-eval requests, for a job (``eval.batch_size``) and ``gac evaluate`` alike
EVAL_BATCH_SIZE = 8
#: the prompt decode latency starts from, in tokens, for a job (``eval.decode_prompt``) and ``gac evaluate`` alike
DECODE_PROMPT = 128


def evaluate(model, tokenizer, *, ppl_source: str | None = None, ppl_seq_len: int | None = None,
             ppl_batch_size: int = EVAL_BATCH_SIZE, ppl_max_windows: int | None = None, ppl_stride: int | None = None,
             tasks: Iterable[str] = (), limit: int | None = 200, task_files: Mapping[str, str] | None = None,
             task_batch_size: int = EVAL_BATCH_SIZE, latency_points: Iterable = (), main_point: tuple | None = None,
             decode_tokens: int = 0, decode_prompt: int = DECODE_PROMPT, decode_batch: int = 1, warmup: int | None = None,
             iters: int | None = None, trials: int | None = None, decode_warmup: int | None = None,
             decode_iters: int | None = None, seed: int = 0, outputs=None, timings: dict | None = None,
             resumed: list | None = None, on_stage: Callable[[str], None] | None = None,
             measure: Callable | None = None, engine: str = "torch", open_engine: Callable | None = None) -> dict:
    """Evaluate ``model`` (module docstring). ``latency_points``: (batch, seq_len) prefill points, the first (or
    ``main_point``) reported as ``prefill_ms``; ``decode_tokens`` > 0 also measures decode after a ``decode_prompt``
    prefill. ``warmup/iters/trials`` are the prefill protocol (None: the device's defaults,
    :mod:`gac.evaluation.latency`). ``engine``: what runs the timed prefill (``torch``, the model itself; another is
    opened by ``open_engine``, :func:`gac.engines.open_engine`, and has no decode)."""
    from gac.evaluation import (  # the package's names: what a test or a user patches
        evaluate_tasks,
        perplexity,
    )
    from gac.evaluation.perplexity import model_max_length
    from gac.evaluation.tasks import parse_tasks
    from gac.metrics import ppl_metric

    outputs = MemoryOutputs() if outputs is None else outputs
    timings = {} if timings is None else timings
    resumed = [] if resumed is None else resumed

    def measured(name, sample=True):
        return measure(name, sample) if measure is not None else contextlib.nullcontext()

    if engine != "torch" and decode_tokens > 0:
        raise GacError(f"decode latency is timed in PyTorch only; engine {engine} measures prefill: set "
                       f"eval.decode_tokens=0 or eval.engine=torch")
    if engine != "torch" and open_engine is None:
        raise GacError(f"engine {engine}: no way to open it was given (gac.engines.open_engine)")
    out: dict = {**dict.fromkeys(GROUPS), "metrics": {}}
    names = parse_tasks(tasks) if tasks else []
    if names and task_files and outputs.get("tasks") is None:  # an item longer than the context: before any work
        from gac.evaluation.tasks import check_item_lengths

        for t in names:
            if t in task_files:
                check_item_lengths(t, task_files[t], tokenizer, model_max_length(model), limit)
    if ppl_source is not None:
        if tokenizer is None and outputs.get("ppl") is None:
            raise GacError("perplexity needs a tokenizer; a random-weights model has none: set eval.ppl=false")
        with measured("ppl"):
            got = _run("ppl", lambda: perplexity(model, tokenizer, ppl_source, seq_len=ppl_seq_len,
                                                 batch_size=ppl_batch_size, max_windows=ppl_max_windows,
                                                 stride=ppl_stride), outputs, timings, resumed, on_stage)
        out["perplexity"] = got
        out["metrics"][ppl_metric(got.get("source") or ppl_source, got.get("stride"))] = got["ppl"]
    if names:
        if tokenizer is None and outputs.get("tasks") is None:
            raise GacError("lm-eval tasks need a tokenizer; a random-weights model has none: set eval.tasks=[]")
        with measured("tasks"):
            got = _run("tasks", lambda: _task_results(evaluate_tasks(
                model, tokenizer, names, limit=limit, local_files=task_files, batch_size=task_batch_size,
                layout=True)), outputs, timings, resumed, on_stage)
        out["tasks"], out["lm_eval"] = got["results"], got.get("lm_eval")
        out["metrics"].update(got["metrics"])
    points = [(int(b), int(s)) for b, s in latency_points]
    if points or decode_tokens > 0:
        if _spread(model):  # a single-GPU measurement: a model over several devices has none
            from gac.models.placement import latency_note

            note = latency_note(model)
            log.warning("%s", note)
            out["latency"] = {"skipped": note}
        else:
            with measured("latency", sample=False):  # no sampler thread while latency is timed
                lat = latency(model, points, decode_tokens, decode_prompt, decode_batch, warmup, iters, trials,
                              decode_warmup, decode_iters, seed, outputs, timings, resumed, on_stage,
                              engine=engine, open_engine=open_engine, tokenizer=tokenizer)
            out["latency"] = lat
            out["metrics"].update(latency_metrics(lat, main_point or (points[0] if points else None)))
    for k, v in out["metrics"].items():
        if v is not None and isinstance(v, float) and not math.isfinite(v):
            raise GacError(f"metric {k} is {v}: the model produced non-finite outputs")
    return out


def _task_results(res: dict) -> dict:
    return {"results": res["tasks"], "metrics": res["metrics"], "lm_eval": res["lm_eval"]}


def _spread(model) -> bool:
    from gac.models.placement import spans_devices

    return spans_devices(model)


def latency(model, points, decode_tokens: int = 0, decode_prompt: int = DECODE_PROMPT, decode_batch: int = 1,
            warmup=None, iters=None, trials=None, decode_warmup=None, decode_iters=None, seed: int = 0,
            outputs=None, timings: dict | None = None, resumed: list | None = None, on_stage=None,
            engine: str = "torch", open_engine: Callable | None = None, tokenizer=None) -> dict:
    """Prefill latency at each point (and decode when ``decode_tokens`` > 0), each point put into ``outputs`` as
    soon as it is measured: a requeued job measures only the points it lacks. ``{point name: timing}``, each
    timing naming its ``engine``. An ``engine`` other than torch is opened by ``open_engine`` (its export in a
    temporary directory) at torch's thread count, so that every engine computes on the job's threads."""
    from gac.evaluation import decode_latency, prefill_latency
    from gac.metrics import prefill_point
    from gac.progress import progress

    outputs = MemoryOutputs() if outputs is None else outputs
    timings = {} if timings is None else timings
    resumed = [] if resumed is None else resumed
    lat = dict(outputs.get("latency") or {})
    resumed.extend(f"latency:{k}" for k in lat)
    t0 = time.perf_counter()
    todo = [(b, s) for b, s in points if prefill_point(b, s) not in lat]
    decode = decode_tokens > 0 and "decode" not in lat
    if (todo or decode) and on_stage is not None:
        on_stage("latency")
    with contextlib.ExitStack() as stack:
        eng = None
        if todo and engine != "torch":
            import tempfile

            import torch

            work = stack.enter_context(tempfile.TemporaryDirectory(prefix="gac-engine-"))
            eng = stack.enter_context(open_engine(engine, model, tokenizer, work, threads=torch.get_num_threads()))
        with progress(len(todo), "latency", unit="points") as bar:
            for b, s in todo:
                lat[prefill_point(b, s)] = prefill_latency(model, batch=b, seq_len=s, warmup=warmup, iters=iters,
                                                           trials=trials, seed=seed, engine=eng)
                outputs.put("latency", lat)
                bar.update()
    if decode:
        lat["decode"] = decode_latency(model, batch=decode_batch, prompt_len=decode_prompt, new_tokens=decode_tokens,
                                       warmup=decode_warmup, iters=decode_iters, trials=trials, seed=seed)
        outputs.put("latency", lat)
    if todo or decode:
        timings["latency_s"] = time.perf_counter() - t0
    return lat


def latency_metrics(lat: dict, main_point: tuple | None) -> dict:
    """The flat latency metrics: the main point as ``prefill_ms`` (with its spread over trials), decode as
    ``decode_ms_per_token``, every other point under its own name."""
    from gac.metrics import DECODE, PREFILL, PREFILL_SPREAD, prefill_point

    main = prefill_point(*main_point) if main_point else None
    metrics = {}
    for name, r in lat.items():
        if name == "decode":
            metrics[DECODE] = r["median_ms"]
        elif name == main:
            metrics[PREFILL] = r["median_ms"]
            if (r.get("trials") or 0) > 1 and r.get("spread_pct") is not None:
                metrics[PREFILL_SPREAD] = r["spread_pct"]
        else:
            metrics[name] = r["median_ms"]
    return metrics
