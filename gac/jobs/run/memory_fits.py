"""Memory-fit checks before loading (a job, ``gac compress``, ``gac evaluate``) and the one-line out-of-memory error.

The estimate comes from the model's config alone (:mod:`gac.compression.footprint`); ``GAC_SKIP_MEMORY_CHECK=1``
skips it when it is known to be wrong.
"""

from __future__ import annotations

import logging
import os

from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.jobs.run.loading import job_model_config, model_config_offline
from gac.jobs.config.spec import JobSpec
from gac.registry import BASELINE
from gac.text import CALIBRATION_SAMPLES, CALIBRATION_SEQ_LEN

log = logging.getLogger(__name__)

MEMORY_CHECK_ENV = "GAC_SKIP_MEMORY_CHECK"  # =1 skips check_job_fits (when its estimate is known to be wrong)


def eval_load(spec: JobSpec):
    """The job's evaluation as :class:`gac.compression.footprint.EvalLoad` (what the memory check adds)."""
    from gac.compression.footprint import EvalLoad

    ev = spec.eval
    points = ()
    if ev.latency:
        points = tuple((ev.latency_batch, s) for s in ev.latency_seq_lens) + tuple(ev.latency_batches)
    return EvalLoad(ppl_batch=ev.batch_size if ev.ppl and spec.ppl_source else 0,
                    ppl_seq_len=int(ev.ppl_seq_len or 2048), task_batch=ev.batch_size if ev.tasks else 0,
                    latency_points=points)


def check_job_fits(spec: JobSpec):
    """Estimate the job's peak memory from its model config (:mod:`gac.compression.footprint`: compression, when
    there is any, and the evaluation) and raise a :class:`GacError` naming the estimate and what to change when it
    exceeds what the device (and, on a GPU, the host) has free, or when the weights alone exceed the GPU (gac runs a
    model on one device). Returns the estimate (None when there is nothing to check: no config can be had offline,
    or ``GAC_SKIP_MEMORY_CHECK=1``)."""
    if os.environ.get(MEMORY_CHECK_ENV, "") not in ("", "0"):
        return None
    config = job_model_config(spec)
    if config is None:
        log.info("memory not checked before loading %s: no config offline (no arch block, not cached)",
                 spec.model_name)
        return None
    from gac.dtypes import auto_dtype

    cal = spec.calibration
    return check_fits_before_loading(
        config, spec.model_name, spec.compressor, spec.dtype or auto_dtype(spec.device), spec.device,
        n_samples=int(cal.get("n_samples", CALIBRATION_SAMPLES)),
        seq_len=int(cal.get("seq_len", CALIBRATION_SEQ_LEN)), proxy=spec.proxy,
        compressor_options=spec.compressor_options, evaluation=eval_load(spec),
        max_memory=spec.max_memory if spec.device_map == "auto" else False)


def check_fits_before_loading(config, model_name: str, compressor: str, dtype, device: str, max_memory=False,
                              **estimate):
    """:func:`gac.compression.footprint.estimate_footprint` of a model ``config`` (``compressor="none"``: no
    compression) checked against ``device`` and the host (:func:`~gac.compression.footprint.check_fits`); returns
    the estimate. Used by jobs, ``gac compress`` and ``gac evaluate`` before they load anything. ``max_memory``
    other than False (None or ``model.max_memory``): the model is spread over the devices (``model.device_map=auto``)
    and checked against all of them together (:func:`gac.models.placement.check_placed_fits`)."""
    from gac.compression.footprint import check_fits, estimate_footprint
    from gac.compression.resources import device_memory

    fp = estimate_footprint(config, compressor, dtype=dtype_str(dtype), device=device, **estimate)
    what = (f"{'the uncompressed model' if compressor == BASELINE else compressor} on {model_name} "
            f"({fp.params / 1e9:.2f}B parameters, {fp.dtype}, {device})")
    if max_memory is not False:
        from gac.models.placement import check_placed_fits

        check_placed_fits(fp, config, device, max_memory, what)
        log.info("memory estimate for %s over its devices: %s", model_name, fp.summary())
        return fp
    check_fits(fp, device_memory(device), host_available_mb=device_memory("cpu")["available_mb"], what=what)
    log.info("memory estimate for %s: %s", model_name, fp.summary())
    return fp


def check_model_fits(model_spec: str, compressor: str, dtype, device: str, **estimate):
    """The memory check of ``gac compress`` / ``gac evaluate``: :func:`check_fits_before_loading` on the model's
    offline config (``dtype`` None: the model's own, as :func:`gac.models.load_model` loads it). Returns the
    estimate, or None when no config can be had offline (then nothing is checked)."""
    from gac.dtypes import dtype_name

    if os.environ.get(MEMORY_CHECK_ENV, "") not in ("", "0"):
        return None
    config = model_config_offline(model_spec)
    if config is None:
        return None
    own = str(getattr(config, "dtype", None) or "float32")  # (transformers >= 5 reads a config's torch_dtype as dtype)
    dt = dtype_name(dtype, device) or dtype_name(own, device)
    from gac.models import BUILTIN

    if model_spec in BUILTIN and dtype is None:
        dt = "float32"  # the named fixtures (tiny, smollm2, gemma3) load in float32 unless told otherwise
    return check_fits_before_loading(config, model_spec, compressor, dt, device, **estimate)


def is_out_of_memory(e: BaseException) -> bool:
    """``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``), without importing torch for other errors."""
    import sys

    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch is not None else None
    return oom is not None and isinstance(e, oom)


def out_of_memory(e: BaseException, stage: str | None, spec, fp) -> GacError:
    """A one-line :class:`GacError` for a ``torch.OutOfMemoryError`` raised in ``stage``: what ran out, the estimate
    made before loading, and what to change (``spec``: anything with a ``device``)."""
    from gac.compression.footprint import memory_fixes

    first = (str(e).strip().splitlines() or ["out of memory"])[0]
    tried = first.split(". ")[0][:160]  # "CUDA out of memory. Tried to allocate 2.00 GiB" -> its first sentence
    if "Tried to allocate" in first:
        tried += ", " + first[first.index("Tried to allocate"):].split(". ")[0]
    est = (f"the estimate before loading was {fp.device_bytes / 2**30:.1f} GiB ({fp.summary()})" if fp is not None
           else "no estimate could be made before loading (no model config offline)")
    fixes = memory_fixes(fp) if fp is not None else ["a smaller model, dtype or evaluation batch"]
    return GacError(f"out of memory on {spec.device} in stage {stage or 'load'} ({tried}); {est}; try "
                    + ", or ".join(fixes) + ", or a GPU no other process is using (nvidia-smi)")
