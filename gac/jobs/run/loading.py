"""Loading a job's model, and reading a model's config without loading it (no weights, no network)."""

from __future__ import annotations

from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.jobs.config.spec import JobSpec
from gac.transformers_lock import transformers_lock
from gac.untrusted import NO_REMOTE_CODE


def load_job_model(spec: JobSpec, reserve=0, verify: bool = True):
    """The model and tokenizer of a job (random weights from ``arch`` when asked: latency needs no weights), in the
    job's dtype. ``spec.dtype`` None is the model's own, as :func:`gac.models.load_model` loads it with ``dtype=None``
    (a config's ``own``: ``gac compress`` and ``gac evaluate`` without ``--dtype``; a random-weights build has no
    dtype of its own and takes ``auto``); a job run by :func:`gac.jobs.run.recipe.run_job` always names one.
    ``verify``: check a gac checkpoint's sha256 (``gac evaluate --no-verify`` skips it). Jobs may run in threads of
    one process (a notebook, a test): every transformers build and read inside holds
    :func:`gac.transformers_lock.transformers_lock`.

    With ``model.device_map=auto`` the model is loaded on the host, in the dtype of the job's device, and spread
    over the devices (:func:`gac.models.placement.place_model`), each GPU that ``model.max_memory`` does not limit
    keeping its share of ``reserve`` (the job's working set, :func:`gac.models.placement.working_set`) free of
    weights."""
    if spec.device_map != "auto":
        return _load_job_model(spec, verify)
    import tempfile
    from dataclasses import replace

    from gac.dtypes import resolve_dtype
    from gac.models.offload import OffloadFolder
    from gac.models.placement import parse_max_memory, place_model

    folder = None
    if "disk" in parse_max_memory(spec.max_memory):  # made (so checked writable) before the weights load
        folder = OffloadFolder(spec.offload_dir if spec.offload_dir is not None else tempfile.gettempdir())
    try:
        dtype = resolve_dtype(spec.dtype or "auto", spec.device)
        model, tokenizer = _load_job_model(replace(spec, device="cpu", dtype=dtype_str(dtype)), verify)
        return place_model(model, spec.device, spec.max_memory, folder, reserve=reserve), tokenizer
    except BaseException:
        if folder is not None:
            folder.remove()
        raise


def _load_job_model(spec: JobSpec, verify: bool = True):
    import torch

    if spec.random_weights:
        if not spec.arch:
            raise GacError(f"model {spec.model_name}: random_weights=true needs an `arch` block in the model config")
        from transformers import AutoModelForCausalLM

        from gac.compression.structure import architecture
        from gac.dtypes import resolve_dtype

        config = architecture(spec.model_spec, random_weights=True, arch=dict(spec.arch))
        dtype = resolve_dtype(spec.dtype or "auto", spec.device)  # built, not loaded: no dtype of its own
        with transformers_lock(), torch.device(spec.device):
            torch.manual_seed(spec.seed)  # under the lock: no other build draws from the generator in between
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        return model.eval(), None
    from gac.models import load_model

    return load_model(spec.model_spec, dtype=spec.dtype, device=spec.device, verify=verify)


@transformers_lock()
def model_config_offline(model_spec: str, arch: dict | None = None):
    """A model's config without loading weights or touching the network: tiny's, a local or cached hub model's
    ``config.json``, a gac checkpoint's base config, else one built from ``arch`` (the ``model.arch`` block of the
    model configs: so a hub model that is not downloaded yet is still checked before it is). None when none of
    these exists."""
    from gac.models import model_kind

    try:
        kind = model_kind(model_spec)
    except GacError:
        kind = None  # load_job_model reports a bad path with its own message
    if kind == "builtin":
        from gac.fixtures import named_config

        return named_config(model_spec)
    if kind in ("local", "hub"):
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(model_spec, local_files_only=True, **NO_REMOTE_CODE)
        except Exception:  # noqa: BLE001 - not cached / not readable: fall back to the arch block
            pass
    if kind == "checkpoint":
        from gac.compression.checkpoint_format import base_config, read_meta

        try:
            return base_config(read_meta(model_spec))  # an upper bound: the uncompressed model
        except Exception:  # noqa: BLE001 - loading reports a damaged checkpoint itself
            return None
    if arch:
        from transformers import AutoConfig

        a = dict(arch)
        try:
            return AutoConfig.for_model(a.pop("model_type"), **a)
        except Exception:  # noqa: BLE001 - a bad arch block fails where the model is built
            return None
    return None


def job_model_config(spec: JobSpec):
    """The job's model config without loading any weights (:func:`model_config_offline`), or None."""
    if spec.random_weights and spec.arch:
        from gac.compression.structure import architecture

        return architecture(spec.model_spec, random_weights=True, arch=dict(spec.arch))
    return model_config_offline(spec.model_spec, spec.arch)


@transformers_lock()
def model_max_positions(model_spec: str) -> int | None:
    """A model's ``max_position_embeddings`` from its config alone (no weights read): tiny's, a gac checkpoint's
    base config, a local directory's or a cached hub model's config.json; None when it cannot be had offline."""
    from gac.models import model_kind

    try:
        kind = model_kind(model_spec)
        if kind == "builtin":
            try:  # every built-in model (tiny, smollm2, ...) by name, where gac.fixtures has that registry
                from gac.fixtures import named_config

                config = named_config(model_spec)
            except ImportError:
                from gac.fixtures.tiny import tiny_config

                config = tiny_config()
            n = getattr(config, "max_position_embeddings", None)
        elif kind == "checkpoint":
            from gac.compression.checkpoint_format import read_meta

            n = (read_meta(model_spec).get("base_config") or {}).get("max_position_embeddings")
        else:
            from transformers import AutoConfig

            n = getattr(AutoConfig.from_pretrained(model_spec, local_files_only=True, **NO_REMOTE_CODE), "max_position_embeddings", None)
    except Exception:  # noqa: BLE001 - a bad path or config: loading reports it with its own message
        return None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
