"""Dtype names and the one rule for ``"auto"`` (model loading, hardware profiles, jobs and the bench share it).

* ``"auto"`` is **float16 on a CUDA device** (the paper measured and compressed in fp16; Tensor Cores run fp16 and
  bf16 at the same rate, so the alignment effects are the same) and **float32 on the CPU** (fp16 matmuls on a CPU
  are emulated and slow). One rule everywhere, so a job measures its kernels in the dtype it runs in.
* :func:`resolve_dtype` (a ``torch.dtype``) and :func:`dtype_name` (its name) resolve a dtype for model
  loading, hardware profiles, jobs and the doctor alike.
* A job's dtype: ``gpu.dtype`` when set (an override for every model on that GPU), else ``model.dtype`` (the model
  configs say float16 for the 7-8B models; ``tiny`` leaves it null), else ``"auto"``; the GPU configs leave
  ``gpu.dtype`` null, so ``model.dtype=bfloat16 gpu=h100`` runs in bf16 (:func:`job_dtype`).
* ``None`` in :func:`gac.models.load_model` keeps the model's own dtype (tiny: float32; a gac checkpoint: the one it
  was saved in; a Hugging Face model: its config's). A config says so with :data:`OWN` (``model.dtype=own``: what
  ``gac compress`` and ``gac evaluate`` give without ``--dtype``); the job's dtype is then None, and its model is
  loaded as :func:`gac.models.load_model` loads it with ``dtype=None``.
"""

from __future__ import annotations

from gac.errors import GacError, unknown_name

ALIASES = {
    "fp32": "float32", "float32": "float32", "float": "float32",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
}
AUTO = {"cuda": "float16", "cpu": "float32"}
#: a config's dtype meaning "the model's own" (a job's dtype None: gac.models.load_model's dtype=None)
OWN = "own"


def _device_type(device) -> str:
    return str(getattr(device, "type", None) or str(device or "cpu")).split(":")[0].lower()


def auto_dtype(device) -> str:
    """What ``"auto"`` means on ``device`` (module docstring): float16 on CUDA, float32 elsewhere."""
    return AUTO.get(_device_type(device), "float32")


def dtype_str(dtype) -> str:
    """The name gac writes for any dtype: ``torch.float16`` (or ``"torch.float16"``) -> ``"float16"``, ``torch.int64``
    -> ``"int64"``; unlike :func:`dtype_name` it resolves no alias and refuses no name."""
    return str(dtype).removeprefix("torch.")


def dtype_name(dtype, device="cpu") -> str | None:
    """The canonical name (``float16``, ``bfloat16``, ``float32``) of a name, alias, ``torch.dtype`` or ``"auto"``
    (resolved for ``device``); None stays None. An unknown name is a :class:`GacError` with suggestions."""
    if dtype is None:
        return None
    s = dtype_str(dtype).strip().lower()
    if s == "auto":
        return auto_dtype(device)
    if s not in ALIASES:
        raise unknown_name("dtype", str(dtype), [*ALIASES, "auto"])
    return ALIASES[s]


def resolve_dtype(dtype, device="cpu"):
    """A ``torch.dtype`` for a name, alias, ``torch.dtype`` or ``"auto"`` on ``device``; None stays None."""
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise GacError(f"dtype must be a torch.dtype or a name like 'fp16', not {type(dtype).__name__}")
    return getattr(torch, dtype_name(dtype, device))


def job_dtype(gpu_dtype, model_dtype, device) -> str | None:
    """The dtype a job runs in: ``gpu.dtype`` if set, else ``model.dtype``, else ``"auto"`` for ``device``; None for
    :data:`OWN` (the model's own)."""
    for d in (gpu_dtype, model_dtype):
        if d not in (None, ""):
            return None if str(d).strip().lower() == OWN else dtype_name(d, device)
    return auto_dtype(device)
