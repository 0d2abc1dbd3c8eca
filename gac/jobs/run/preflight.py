"""Preflight: everything that can fail on bad input, a missing device or a bad disk, checked before a second of
compute and before the store is touched."""

from __future__ import annotations

from collections.abc import Sequence

from gac.errors import GacError
from gac.jobs.run.loading import job_model_config, model_max_positions
from gac.jobs.config.spec import JobSpec, task_files_of
from gac.devices import KNOWN_GPUS, gpu_name_matches
from gac.results import ResultsStore

#: what a refusal to save over a checkpoint says: a job never replaces one (it has no --force)
SAVE_MODEL_REPLACE = "experiments/run.py never replaces one: move it aside (mv DIR DIR.old)"


def preflight(spec: JobSpec, store: ResultsStore, save_model: str | None, force: bool = False,
              overrides: Sequence[str] = ()) -> None:
    """Everything that can fail on bad input or a bad disk, checked before a second of compute (and before the store
    is touched): the job's device, model and sequence lengths (check_job_here), the model's files match their config,
    the store is writable with room to spare and its entries for this key are what gac makes, the task files match
    their task's schema, the checkpoint path is free. ``overrides``: the job's, for the fetch command an offline node
    names (:func:`gac.jobs.run.inputs.check_offline`)."""
    check_job_here(spec, overrides)
    check_engine_runs_model(spec)
    if not spec.random_weights and (force or not store.is_done(spec.key)):  # a done point needs no model
        from gac.models import check_model_files

        check_model_files(spec.model_spec)  # weights that match their config, a checkpoint that matches its weights
    if save_model and (force or not _saved_or_done(spec, store, save_model)):  # before the store is touched
        from gac.compression.checkpoint import check_output_dir

        check_output_dir(save_model, inputs=[spec.model_spec], flag="save_model", replace_hint=SAVE_MODEL_REPLACE)
    store.prepare_for_writing()
    store.check_layout(spec.key)
    if spec.eval.tasks:
        files = task_files_of(spec.task_files) or {}
        from gac.evaluation.tasks import check_local_file

        for t in spec.eval.tasks:
            if t in files:
                check_local_file(t, files[t])


def check_engine_runs_model(spec: JobSpec) -> None:
    """``eval.engine``: the engine can run the job's model family (llama.cpp: a GGUF architecture gac writes; its
    biases, RoPE and norms), judged on a skeleton of the model's config (meta device, no weights), before anything
    loads; the config's checks (:func:`gac.jobs.config.build.job_from_config`) judged the engine against the device,
    dtype and compressor. A model whose config cannot be read offline is judged when the engine opens."""
    from gac.align.engine_types import parse_engine

    name = parse_engine(spec.eval.engine)[0]
    if name != "llama.cpp" or not spec.eval.latency:
        return  # ONNX Runtime runs any family gac exports; torch runs the model itself
    config = job_model_config(spec)
    if config is None:
        return
    from gac.compression.discovery import skeleton
    from gac.engines import check_engine

    try:  # the job's tokenizer is loaded with the model: a GGUF file will carry it
        check_engine(spec.eval.engine, skeleton(config), tokenizer="the model's own", packages=False)
    except GacError as e:
        raise GacError(f"config: eval.engine={spec.eval.engine}: {e}; or eval.engine=torch") from None


def _saved_or_done(spec: JobSpec, store: ResultsStore, save_model: str) -> bool:
    """A done job (it is skipped) or one whose earlier attempt saved this checkpoint (it resumes and keeps it): its
    checkpoint path is its own, not refused."""
    if store.is_done(spec.key):
        return True
    from gac.jobs.run.attempts import StageOutputs, saved_by_this_job

    outputs = StageOutputs(store, spec.key)
    try:
        outputs.load()
    except GacError:
        return False  # the attempt file is damaged: the job itself says what to remove
    return saved_by_this_job(outputs, save_model)


def check_job_here(spec: JobSpec, overrides: Sequence[str] = ()) -> None:
    """What only the machine that runs the job can check, before anything is written or loaded: the job's device is
    there, what it reads from the hub is in the caches or the hub answers (every missing input named at once, with
    the `gac fetch` command), its sequence lengths fit the model's positions, and tasks that need the hub can reach
    it."""
    if spec.dtype is None:  # its hardware profile, latency tables, memory check and bench need the dtype before loading
        raise GacError("config: model.dtype=own (the model's own dtype) is for gac compress and gac evaluate; a job "
                       "names the dtype it runs in: set model.dtype or gpu.dtype (float32, float16, bfloat16 or auto)")
    if spec.device.startswith("cuda"):
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(spec.device.split(":")[1]) if ":" in spec.device and spec.device.split(":")[1].isdigit() else 0
        if n == 0 or index >= n:
            have = f"{n} CUDA device(s)" if n else "no CUDA"
            raise GacError(f"this job runs on {spec.device} (gpu={spec.gpu}), but this machine has {have}; run it on a "
                           f"GPU node (e.g. hydra/launcher=slurm_h100), or use gpu=cpu here")
        check_gpu_name(spec.gpu, spec.device, cuda_device_name(torch.device("cuda", index)))
    from gac.jobs.run.inputs import check_offline, is_hub_model

    hub = is_hub_model(spec.model_spec)
    if not spec.random_weights and not hub:
        _check_model(spec)  # a missing directory, a file that is no model: first, whatever else is missing
    check_offline(spec, overrides)  # an offline node: every missing input named at once, not one per queue wait
    if not spec.random_weights and hub:
        _check_model(spec)  # a gated model without a granted token, the hub offline and the model not cached
    from gac.text import check_source

    if not spec.is_baseline:
        from gac.compression.compressors import get_compressor

        check_layers_here(get_compressor(spec.compressor, **spec.compressor_options), spec.model_spec,
                          "config: compressor.options.layers", spec.arch)
    if not spec.is_baseline and spec.calibration.get("source") != "random":
        check_source(str(spec.calibration.get("source")), "train", "calibration.source")
    if spec.eval.ppl and spec.ppl_source:
        check_source(str(spec.ppl_source), "test", "model.ppl_source")
    limit = _max_positions(spec)
    if limit is not None:
        ev = spec.eval
        lengths = [("calibration.seq_len", int(spec.calibration.get("seq_len") or 0))] if not spec.is_baseline else []
        if ev.ppl and spec.ppl_source and ev.ppl_seq_len is not None:
            lengths.append(("eval.ppl_seq_len", ev.ppl_seq_len))
        if ev.latency:
            lengths += [("seq_len" if s == spec.seq_len else "eval.latency_seq_lens", s) for s in ev.latency_seq_lens]
            lengths += [("eval.latency_batches", s) for _, s in ev.latency_batches]
            if ev.decode_tokens > 0:
                lengths.append(("eval.decode_prompt + eval.decode_tokens", ev.decode_prompt + ev.decode_tokens))
        for key, n in lengths:
            if n > limit:
                raise GacError(f"config: {key}={n} is above the maximum sequence length of model {spec.model_name} "
                               f"({limit}, max_position_embeddings); use at most {limit}")
        from gac.evaluation.perplexity import DEFAULT_SEQ_LEN

        window = min(DEFAULT_SEQ_LEN, limit) if ev.ppl_seq_len is None else ev.ppl_seq_len  # the window it will use
        if ev.ppl and spec.ppl_source and ev.ppl_stride is not None and ev.ppl_stride > window:
            raise GacError(f"config: eval.ppl_stride={ev.ppl_stride} is longer than the perplexity window of model "
                           f"{spec.model_name} ({window} tokens); use eval.ppl_stride <= {window}")
    if spec.eval.tasks:
        from gac.evaluation.tasks import check_hub_tasks

        local = task_files_of(spec.task_files) or {}
        check_hub_tasks([t for t in spec.eval.tasks if t not in local], via="config")


def check_layers_here(compressor, model_spec: str, where: str, arch: dict | None = None) -> None:
    """The compressor's layer selection picks layers this model has (from its config alone; nothing when the config
    cannot be had offline: loading reports that itself)."""
    from gac.jobs.run.loading import model_config_offline

    config = model_config_offline(model_spec, arch)
    n = getattr(config, "num_hidden_layers", None)
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        try:
            compressor.layer_indices(n)
        except GacError as e:
            raise GacError(f"{where}: {e}") from None


def _check_model(spec: JobSpec) -> None:
    try:
        check_model_here(spec.model_spec)
    except GacError as e:
        raise GacError(f"config: model.spec: {e}") from None


def cuda_device_name(device) -> str:
    """The CUDA device's name as the driver reports it (``NVIDIA H100 80GB HBM3``)."""
    import torch

    return torch.cuda.get_device_name(device)


def check_gpu_name(gpu: str, device: str, device_name: str) -> None:
    """The GPU the config names is the device the job runs on: its cliffs, its published profile and the record's
    ``gpu`` would otherwise describe another GPU. ``gpu=auto`` takes whatever device this is (the record's
    ``provenance.device_name`` says which)."""
    if gpu in ("auto", "cpu") or gpu_name_matches(gpu, device_name):
        return
    fits = [g for g in KNOWN_GPUS if gpu_name_matches(g, device_name)]
    use = f"gpu={fits[0]} (this device's config) or gpu=auto" if fits else "gpu=auto"
    raise GacError(f"config: gpu={gpu}, but this job's device {device} is a {device_name!r}, so the {gpu}'s cliffs "
                   f"and profile would be used for it and the record would say gpu={gpu}; use {use} here, or run on "
                   f"a {gpu.upper()} node (hydra.launcher.constraint / partition)")


def check_model_here(model_spec: str) -> None:
    """The model can be loaded from here: a local path exists and is a model; a hub id is in the local cache, or the
    hub answers (otherwise loading retries for a minute before it fails) and this machine's token may read it (a
    gated model otherwise fails at load, after the queue)."""
    from gac.hub import check_hub_model
    from gac.models import model_kind
    from gac.untrusted import refuse_pickled_weights, refuse_remote_code

    kind = model_kind(model_spec)
    if kind != "hub":
        refuse_remote_code(model_spec)  # a directory that names its own code: before its config is read
        if kind == "local":
            refuse_pickled_weights(model_spec)  # weights that are a pickle are never unpickled
        return
    check_hub_model(str(model_spec))


def _max_positions(spec: JobSpec) -> int | None:
    if spec.random_weights:
        config = job_model_config(spec)
        n = getattr(config, "max_position_embeddings", None) if config is not None else None
        return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
    return model_max_positions(spec.model_spec)
