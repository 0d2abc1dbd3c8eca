"""The prepared-state cache: a job's scores and factorizations on disk, shared by the points of a sweep.

Entries live under ``<results_dir>/cache/prepared/`` (safetensors + JSON, :mod:`gac.compression.prepared_io`), keyed
by the model, compressor, proxy, calibration and the code that computes them; ``force=true`` recomputes them.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from gac.errors import GacError
from gac.hashing import digest
from gac.jobs.config.spec import JobSpec

log = logging.getLogger(__name__)

def prepared_cache_key(spec: JobSpec) -> str:
    from gac.compression.prepared_io import code_fingerprint
    from gac.fixtures import is_named, named_identity

    ident = {k: v for k, v in asdict(spec).items() if k in (
        "model_spec", "dtype", "random_weights", "arch", "compressor", "compressor_options", "proxy", "allocation",
        "calibration", "device", "seed")}
    ident["code"] = code_fingerprint()  # any change to the code that scores or factorises invalidates the cache
    if is_named(spec.model_spec):  # a named model's weights change with its build recipe
        ident["named_model"] = named_identity(spec.model_spec)
    return digest(json.dumps(ident, sort_keys=True, default=str), )


def prepare_cached(spec: JobSpec, model, tokenizer, cache_dir: Path | None, refresh: bool = False, on_wait=None,
                   sensitivity_limit_s: float | None | str = "env"):
    """:func:`gac.compression.preparation.prepare`, with its scores and factorizations cached by content on disk.

    The cache file is data (:mod:`gac.compression.prepared_io`: safetensors + JSON), keyed by the job's model,
    compressor, proxy, calibration and the code that produced it. ``refresh`` (``force=true``) ignores an existing
    entry and writes a fresh one. An unreadable or mismatching entry is reported and recomputed, never trusted.

    Jobs running in parallel (Slurm array tasks of one sweep) share the work: the first takes the entry's lock
    (``<key>.lock`` beside it) and computes; the others wait for it (``on_wait(holder)`` is called once) and load
    its entry. A failing computer leaves the lock to the next waiter, which computes itself. ``sensitivity_limit_s``:
    :func:`gac.compression.preparation.prepare`'s.
    """
    from gac.results.lock import FileLock, describe_holder

    if cache_dir is None:
        return _prepare(spec, model, tokenizer, sensitivity_limit_s=sensitivity_limit_s)
    path = cache_dir / "prepared" / f"{prepared_cache_key(spec)}.safetensors"
    resume = sensitivity_resume_path(path)
    t_request = time.time()
    if not refresh:
        got = _load_prepared(spec, model, path)
        if got is not None:
            return got
    lock = FileLock(path.with_suffix(".lock"), what=f"scoring {path.stem}")
    if not lock.try_acquire():
        def waiting(h):
            log.info("another job (%s) is computing the same scores; waiting for its cache entry", describe_holder(h))
            if on_wait is not None:
                on_wait(describe_holder(h))

        lock.acquire(on_wait=waiting)
    try:
        try:
            fresh = path.exists() and (not refresh or path.stat().st_mtime >= t_request)
        except FileNotFoundError:
            fresh = False
        if fresh:  # computed by the job we waited for (with force: after this job asked for a fresh one)
            got = _load_prepared(spec, model, path)
            if got is not None:
                got.timings["shared"] = True
                return got
        if refresh:  # a fresh entry: no rows of an earlier search either
            resume.unlink(missing_ok=True)
        prepared = _prepare(spec, model, tokenizer, resume, sensitivity_limit_s)
        try:
            prepared.save(path)
        except (GacError, OSError) as e:  # the cache is an optimisation: a full disk must not fail the job
            log.warning("could not cache the scores and factorizations at %s: %s", path, e)
        else:
            resume.unlink(missing_ok=True)  # the entry holds the finished table now
        return prepared
    finally:
        lock.release()


def sensitivity_resume_path(entry: Path) -> Path:
    """Where the sensitivity search of the cache entry ``entry`` keeps its finished rows until the entry is written
    (a requeued or restarted job resumes the search from them; :class:`gac.compression.sensitivity.RowStore`)."""
    return entry.with_name(entry.name.removesuffix(".safetensors") + ".sensitivity-rows.json")


def _load_prepared(spec: JobSpec, model, path: Path):
    from gac.compression.prepared import Prepared

    if not path.exists():
        return None
    t0 = time.perf_counter()
    try:
        prepared = Prepared.load(path, model, spec.compressor, spec.compressor_options, device="cpu")
    except GacError as e:
        log.warning("ignoring the prepared cache entry: %s", e)
        return None
    prepared.timings["cache_load_s"] = time.perf_counter() - t0
    prepared.timings["cached"] = True
    log.info("re-using cached scores and factorizations %s", path.name)
    return prepared


def _prepare(spec: JobSpec, model, tokenizer, sensitivity_resume: Path | None = None,
             sensitivity_limit_s: float | None | str = "env"):
    import torch

    from gac.compression.calibration import Calibration
    from gac.compression.preparation import prepare

    cal = Calibration(**{k: v for k, v in spec.calibration.items() if k in Calibration.__dataclass_fields__})
    calib_ids = None
    if spec.calibration.get("source") == "random":  # random tokens: enough for latency studies on random weights
        g = torch.Generator().manual_seed(int(spec.calibration.get("seed", spec.seed)))
        vocab = int(model.config.vocab_size)
        calib_ids = torch.randint(0, vocab, (int(cal.n_samples), int(cal.seq_len)), generator=g)
    prepared = prepare(model, tokenizer, spec.compressor, spec.proxy, calibration=cal, calib_ids=calib_ids,
                       allocation=spec.allocation, compressor_options=spec.compressor_options,
                       sensitivity_resume=sensitivity_resume, sensitivity_limit_s=sensitivity_limit_s)
    prepared.timings["cached"] = False
    return prepared
