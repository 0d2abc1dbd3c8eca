"""Config -> job: :func:`job_from_config` (:func:`spec_from_config` for the spec alone) turns a resolved config (a plain dict: a composed Hydra config, or one
typed by hand) into a :class:`~gac.jobs.config.spec.JobSpec`, checked once before any heavy work.

The types and keys are the schema's (:mod:`gac.jobs.config.schema`, applied first); the names (compressor, strategy,
proxy, allocation, knapsack score) are the registry's (:mod:`gac.registry`); the ranges of numbers, the devices and
the model's own data are checked here. Every error names the key and the fix.
"""

from __future__ import annotations

from pathlib import Path

from gac.errors import GacError
from gac.jobs.config.spec import EvalSpec, Job, JobSpec, RunOptions, task_files_of
from gac.registry import BASELINE
from gac.results.keys import canonical_number
from gac.results.query import MISSING, config_value

DEVICES = ("cpu", "cuda")
PROFILE_MODES = ("none", "auto", "measure")
ON_BUSY = ("wait", "skip")


def _get(d: dict, path: str, default=None):
    v = config_value(d, path)  # the one dotted-path getter (gac.results.query)
    return default if v is MISSING else v


def _require(d: dict, path: str):
    v = _get(d, path, _MISSING)
    if v is _MISSING:
        raise GacError(f"config: missing key {path!r}")
    return v


_MISSING = object()


def job_from_config(cfg: dict, overrides=(), sweep_dir: str | None = None) -> Job:
    """The :class:`Job` of a resolved config (plain dict), from one reading: checked against the schema's types and
    keys (its defaults filled in), the model's label and data worked out once (:func:`resolve_model_data`: the record
    says what ran, not ``auto``) and applied to the spec and to the config its record keeps, then the registry's
    names and the ranges; the run options from the same checked config. ``overrides``: the command line's (the
    record keeps them); ``sweep_dir``: a sweep point's directory (the spec's ``sweep`` when the config names none).
    Every error names the key and the fix."""
    from gac.jobs.config.schema import validate_config

    checked = validate_config(cfg)  # types and keys (gac.jobs.config.schema), defaults filled in
    data = _model_data(checked)  # the model's label and data: worked out once (a checkpoint's header read once)
    spec = _build_spec(_with_model_data(checked, data))
    if spec.sweep is None and sweep_dir is not None:
        spec.sweep = "/".join(Path(sweep_dir).parts[-2:])
    on_busy = checked["on_busy"]
    if on_busy not in ON_BUSY:  # a run option: checked with the others, once
        raise GacError(f"config: on_busy must be one of {', '.join(ON_BUSY)}, got {on_busy!r}")
    wandb = _get(checked, "logger.wandb")
    run = RunOptions(results_dir=str(checked["results_dir"]), force=bool(checked["force"]),
                     on_busy=str(on_busy), save_model=checked.get("save_model"),
                     wandb=wandb if isinstance(wandb, dict) else None,
                     quiet=None if cfg.get("quiet") is None else bool(checked["quiet"]),
                     verbose=bool(checked["verbose"]), overrides=tuple(str(o) for o in overrides))
    return Job(spec, run, _with_model_data(cfg, data))


def spec_from_config(cfg: dict) -> JobSpec:
    """The job of a resolved config (:func:`job_from_config`'s spec alone)."""
    return job_from_config(cfg).spec


def _build_spec(cfg: dict) -> JobSpec:
    """The :class:`JobSpec` of a config already resolved and checked against the schema."""
    from gac import registry
    from gac.align.targets import check_ratio
    from gac.dtypes import job_dtype
    from gac.models import model_label

    comp = str(_require(cfg, "compressor.name"))
    if comp != BASELINE:
        comp = registry.COMPRESSORS.resolve(comp, "(config compressor=...)", extra=[BASELINE])
    strategy = str(_require(cfg, "align.strategy"))
    if strategy not in registry.LATENCY_STRATEGIES:
        strategy = registry.STRATEGIES.resolve(strategy, "(config align.strategy)", extra=registry.LATENCY_STRATEGIES)
    knapsack_score = registry.KNAPSACK_SCORES.resolve(
        str(_get(cfg, "align.knapsack_score", registry.DEFAULT_KNAPSACK_SCORE)), "(config align.knapsack_score)")
    proxy = _get(cfg, "proxy.name")
    if proxy is not None:
        proxy = registry.PROXIES.resolve(str(proxy), "(config proxy=...)")
    ratio = _require(cfg, "ratio")
    check_ratio(ratio)
    from gac.checks import check_seed

    seed = check_seed(cfg.get("seed", 0), "config: seed")
    allocation = registry.ALLOCATIONS.resolve(str(cfg.get("allocation", "default")), "(config allocation=...)")
    from gac.align.candidates import resolve_unit

    unit = _require(cfg, "align.unit")
    if isinstance(unit, int) and not isinstance(unit, bool) and unit <= 0:
        raise GacError(f"config: align.unit must be a positive integer, got {unit!r}")
    try:
        unit = resolve_unit(unit)  # a number, or an engine's named unit (llama.cpp:q4_K)
    except GacError as e:
        raise GacError(f"config: align.unit: {e}") from None
    for k in ("align.window", "seq_len"):
        v = _require(cfg, k)
        if v <= 0:
            raise GacError(f"config: {k} must be a positive integer, got {v!r}")
    device = str(_require(cfg, "gpu.device"))
    from gac.devices import parse_device

    try:
        parsed = parse_device(device)
    except GacError:
        parsed = None
    if parsed is None or parsed.type not in DEVICES:
        raise GacError(f"config: gpu.device must be one of {DEVICES} (or cuda:N), got {device!r}")
    device = str(parsed)  # as torch writes it: ' CUDA:1' is the device cuda:1
    profile = str(_get(cfg, "gpu.profile", "none"))
    p = Path(profile).expanduser()
    if profile not in PROFILE_MODES and not (p / "profile.json").is_file():
        what = ("which does not exist" if not p.exists() else "a directory without profile.json" if p.is_dir()
                else "a file")
        raise GacError(f"config: gpu.profile must be one of {PROFILE_MODES} or a profile directory (with profile.json, "
                       f"as gac profile writes it), got {profile!r}, {what}")
    ev = _eval_spec(cfg)
    device_map, max_memory = _placement(cfg)
    options = dict(_get(cfg, "compressor.options", {}) or {})
    calibration = dict(_get(cfg, "calibration", {}) or {})
    if calibration.get("seed") is None:
        calibration["seed"] = seed
    calibration["seed"] = check_seed(calibration["seed"], "config: calibration.seed")
    if comp != BASELINE:
        allocation = check_compression(comp, options, allocation, float(ratio), int(calibration.get("n_samples") or 0))
    latency = latency_settings(cfg, strategy, str(_get(cfg, "gpu.name", "cpu")))
    wandb = _get(cfg, "logger.wandb")
    if isinstance(wandb, dict):  # the job's logger, checked with its config (not once it has run)
        from gac.jobs.tracking.loggers import check_wandb_names

        check_wandb_names(wandb.get("project"), wandb.get("entity"), wandb.get("tags") or ())
    spec = JobSpec(
        model_name=model_label(_require(cfg, "model.name"), _require(cfg, "model.spec")),
        model_spec=str(_require(cfg, "model.spec")),
        compressor=comp,
        strategy=strategy,
        ratio=float(canonical_number(float(ratio))),  # 0.30000000000000004 (float drift) is the point 0.3
        unit=unit,
        window=int(_require(cfg, "align.window")),
        use_profile=bool(_get(cfg, "align.use_profile", True)),
        knapsack_score=knapsack_score,
        proxy=proxy,
        compressor_options=options,
        allocation=allocation,
        calibration=calibration,
        dtype=job_dtype(_get(cfg, "gpu.dtype"), _get(cfg, "model.dtype"), device),  # gpu.dtype > model.dtype > auto
        random_weights=bool(_get(cfg, "model.random_weights", False)),
        arch=_get(cfg, "model.arch"),
        ppl_source=_get(cfg, "model.ppl_source"),
        task_files=_get(cfg, "model.task_files"),
        gpu=str(_get(cfg, "gpu.name", "cpu")),
        device=device,
        profile=profile,
        allow_profile_mismatch=bool(_get(cfg, "gpu.allow_profile_mismatch", False)),
        eval=ev,
        seq_len=int(cfg["seq_len"]),
        seed=seed,
        device_map=device_map,
        max_memory=max_memory,
        offload_dir=_get(cfg, "model.offload_dir"),
        experiment=str(cfg.get("experiment_name", "default")),
        sweep=cfg.get("sweep"),
        latency=None if comp == BASELINE else latency,
    )
    _check_random_weights(spec)
    _check_engine(spec)
    return spec


def _check_engine(spec: JobSpec) -> None:
    """``eval.engine``: a known engine (at a type it has: ``llama.cpp:q4_K``; read by :func:`_eval_spec`) that can
    time this job's prefill, its packages installed, checked before any work (the compressed model's structure is
    known from its compressor: llama.cpp holds no low-rank factors)."""
    from gac.align.engine_types import parse_engine
    from gac.engines import check_engine

    spelled = spec.eval.engine
    name = parse_engine(spelled)[0]  # known (and its type) since _eval_spec; its packages once the job can use it
    if name == "torch" or not spec.eval.latency:
        return  # an unused eval.engine is the axes' refusal (gac.jobs.config.axes)
    why = None
    if spec.device != "cpu":
        why = f"it runs on the CPU here and the job runs on {spec.device}: give gpu=cpu"
    elif spec.eval.decode_tokens:
        why = "decode latency is timed in PyTorch only: set eval.decode_tokens=0"
    elif name == "onnxruntime" and spec.dtype != "float32":
        why = f"its CPU provider runs float32 graphs and the job runs in {spec.dtype}: set gpu.dtype=float32"
    elif name == "llama.cpp":
        from gac.compression.compressors import COMPRESSORS, canonical_name

        if not spec.is_baseline and COMPRESSORS[canonical_name(spec.compressor)].low_rank:
            why = (f"compressor {spec.compressor} leaves low-rank factors, which GGUF cannot hold: use "
                   f"eval.engine=onnxruntime (or compressor=llm_pruner)")
        elif spec.random_weights:
            why = "a GGUF file carries the tokenizer, and model.random_weights=true builds none: use eval.engine=onnxruntime"
    if why:
        raise GacError(f"config: eval.engine={spelled} cannot time this job: {why}, or eval.engine=torch")
    try:
        check_engine(spelled)  # its packages (one line naming pip install 'gac[engines]')
    except GacError as e:
        raise GacError(f"config: eval.engine={spelled}: {e}") from None


def _check_random_weights(spec: JobSpec) -> None:
    """A model built with random weights has no tokenizer: perplexity, tasks and calibration from text cannot run
    on it (they were refused after loading, or after compressing)."""
    if not spec.random_weights:
        return
    fix = "model.random_weights=true builds a model without a tokenizer (for latency studies)"
    if spec.eval.ppl and spec.ppl_source:
        raise GacError(f"config: {fix}, so eval.ppl cannot run on it; set eval.ppl=false (or eval=none)")
    if spec.eval.tasks:
        raise GacError(f"config: {fix}, so eval.tasks cannot run on it; set eval.tasks=[] (or eval=none)")
    if not spec.is_baseline and spec.calibration.get("source") != "random":
        from gac.jobs.config.axes import AXES, why_unused

        calibration = next(a for a in AXES if a.keys[0] == "calibration")
        if why_unused(calibration, spec, {}) is None:
            raise GacError(f"config: {fix}, so its calibration cannot be read from text ("
                           f"calibration.source={spec.calibration.get('source')}); set calibration.source=random "
                           f"(random tokens)")


def _placement(cfg: dict) -> tuple[str, dict | None]:
    """``model.device_map`` and ``model.max_memory``, checked (:mod:`gac.models.placement`)."""
    from gac.models.placement import check_device_map, parse_max_memory

    device_map = check_device_map(_get(cfg, "model.device_map", "single") or "single")
    max_memory = _get(cfg, "model.max_memory") or None  # {} (the schema's default): no limits
    if max_memory is not None and device_map != "auto":
        raise GacError("config: model.max_memory applies to a model spread over devices; set model.device_map=auto "
                       "with it, or drop it")
    parse_max_memory(max_memory)
    offload = _get(cfg, "model.offload_dir")
    if offload is not None:
        from gac.models.offload import check_offload_dir

        check_offload_dir(offload)
    return device_map, None if max_memory is None else {str(k): v for k, v in dict(max_memory).items()}


BUDGET_KINDS = ("latency", "min_latency")
LATENCY_SOURCES = ("measured", "predicted")
LATENCY_REFERENCES = ("unaligned", "gac")
MAX_SHARE = 1000.0  # align.latency_budget: a budget past a thousand times the reference's latency budgets nothing
_LATENCY_KEYS = ("budget_kind", "latency_budget_ms", "latency_budget", "latency_source", "latency_reference")


def latency_settings(cfg: dict, strategy: str, gpu: str) -> dict | None:
    """The ``align`` keys of a latency-budget plan (``align=gac_latency``) as the job's ``latency`` settings, or None
    for a strategy that budgets parameters (which refuses them). Checked here, before any work: the budget's kind,
    exactly one budget for kind ``latency`` (none for ``min_latency``), a source the job's GPU has."""
    given = {k: _get(cfg, f"align.{k}") for k in _LATENCY_KEYS}
    if strategy != "gac_latency":
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise GacError(f"config: align.{extra[0]} applies to align=gac_latency only (this job's strategy is "
                           f"{strategy}); drop it or pick align=gac_latency")
        return None
    kind = str(given["budget_kind"] or "latency")
    if kind not in BUDGET_KINDS:
        raise GacError(f"config: align.budget_kind must be one of {', '.join(BUDGET_KINDS)}, got {kind!r}")
    source = str(given["latency_source"] or "measured")
    if source not in LATENCY_SOURCES:
        raise GacError(f"config: align.latency_source must be one of {', '.join(LATENCY_SOURCES)}, got {source!r}")
    if source == "predicted":
        from gac.predict.predictor import GPUS

        if gpu not in GPUS:
            raise GacError(f"config: align.latency_source=predicted needs a GPU the predictor knows (gpu="
                           f"{' or gpu='.join(GPUS)}), got gpu={gpu}; use align.latency_source=measured (this "
                           f"device's own kernels) or gpu={GPUS[0]}")
    reference = str(given["latency_reference"] or "gac")  # the plan every budget share of 1 holds
    if reference not in LATENCY_REFERENCES:
        raise GacError(f"config: align.latency_reference must be one of {', '.join(LATENCY_REFERENCES)} (the plan at "
                       f"the ratio's parameter budget whose latency align.latency_budget scales), got {reference!r}")
    ms, share = given["latency_budget_ms"], given["latency_budget"]
    if ms is not None:
        from gac.align.latency_budget import check_ms

        check_ms(ms, "config: align.latency_budget_ms", positive=True)
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= MAX_SHARE):
        raise GacError(f"config: align.latency_budget must be a positive number at most {MAX_SHARE:g} (a share of the "
                       f"reference plan's latency: 1.0 its own, 0.9 10% faster), got {share!r}")
    if kind == "latency":
        if ms is not None and share is not None:
            raise GacError(f"config: align.latency_budget_ms={ms:g} and align.latency_budget={share:g} are both set; "
                           f"give one (align.latency_budget=null keeps the budget in ms)")
        if ms is None and share is None:
            raise GacError(f"config: align=gac_latency needs a budget: align.latency_budget=0.9 (a share of the "
                           f"{reference} plan's latency) or align.latency_budget_ms=12.5")
    elif ms is not None or share is not None:
        raise GacError(f"config: align.budget_kind=min_latency takes no latency budget (it minimises latency at the "
                       f"ratio's parameter count); drop align.{'latency_budget_ms' if ms is not None else 'latency_budget'}")
    return {"budget_kind": kind, "budget_ms": None if ms is None else float(ms),
            "budget": None if share is None else float(share), "source": source,
            **({"reference": reference} if share is not None else {})}


def _eval_spec(cfg: dict) -> EvalSpec:
    """The ``eval`` group as the job's :class:`EvalSpec`: known task names, numbers in range, tuples."""
    from gac.evaluation.tasks import check_task_names

    ev = dict(_get(cfg, "eval", {}) or {})
    tasks = tuple(str(t) for t in ev.get("tasks") or ())
    if tasks:
        tf = _get(cfg, "model.task_files")  # a named set's tasks, without building its files (enwiki needs PyPI once)
        local = dict.fromkeys(("piqa", "hellaswag"), "") if tf in ("tiny", "enwiki") else (task_files_of(tf) or {})
        try:
            check_task_names(tasks, local)
        except GacError as e:
            raise GacError(f"config eval.tasks: {e}") from None
    ev["tasks"] = tasks
    _check_numbers(cfg, ev)
    ev["latency_seq_lens"] = tuple(int(s) for s in ev.get("latency_seq_lens") or ())
    ev["latency_batches"] = tuple((int(b), int(s)) for b, s in ev.get("latency_batches") or ())
    if "engine" in ev:
        from gac.align.engine_types import canonical_engine

        try:  # spelled as results name it: llama.cpp:f32 is llama.cpp, the same computation and key
            ev["engine"] = canonical_engine(ev["engine"])
        except GacError as e:
            raise GacError(f"config: eval.engine: {e}") from None
    return EvalSpec(**ev)


def check_compression(comp: str, options: dict, allocation: str, ratio: float, n_samples: int,
                      where: str = "config allocation, compressor.options") -> str:
    """Is this compression request valid: the compressor built with its options, the allocation rule it runs
    (``default`` resolved to the compressor's own), that rule's reach and probe samples, and a sensitivity search's
    time limit. The one check of a job's config and of ``gac compress`` (``where``: how the caller names the
    settings); every one of these fails now, not after calibration. Returns the resolved allocation."""
    from gac.compression.allocation import resolve_allocation
    from gac.compression.compressors import get_compressor
    from gac.compression.preparation import check_allocation

    built = get_compressor(comp, **options)  # unknown options (and a bad sensitivity grid) fail now
    allocation = resolve_allocation(allocation, built)
    try:
        check_allocation(allocation, built, ratio, n_samples)
    except GacError as e:
        raise GacError(f"{where}: {e}") from None
    if allocation == "sensitivity":
        from gac.compression.sensitivity import sensitivity_limit

        sensitivity_limit()  # a bad $GAC_SENSITIVITY_LIMIT fails with the request, not after calibration
    return allocation


def command_config(model: str, *, device: str = "cpu", dtype: str | None = None, compressor: str = BASELINE,
                   options: dict | None = None, proxy: str | None = None, strategy: str = "gac",
                   ratio: float | None = None, unit: int | None = None, window: int | None = None,
                   knapsack_score: str | None = None, allocation: str = "default", calibration: dict | None = None,
                   seed: int = 0, ppl_source: str | None = None, task_files: dict | None = None,
                   evaluation: dict | None = None, seq_len: int | None = None) -> dict:
    """The config a command's flags give (``gac compress``, ``gac evaluate``, ``gac export``), for
    :func:`job_from_config`: every entry point builds its :class:`Job` from a config, checked by the same schema and
    rules; what a flag leaves out is the schema's default. ``dtype`` None: the model's own
    (:data:`gac.dtypes.OWN`, as :func:`gac.models.load_model` loads it), not a job's ``auto``. ``evaluation``: the
    ``eval`` group (None: nothing is measured); ``seq_len``: the job's own latency point (``prefill_ms``)."""
    from gac.dtypes import OWN

    align = {"strategy": strategy, "use_profile": False}  # a command runs no hardware profile
    for k, v in (("unit", unit), ("window", window), ("knapsack_score", knapsack_score)):
        if v is not None:
            align[k] = v
    cfg = {"model": {"name": model_label(model), "spec": str(model), "dtype": OWN if dtype is None else dtype,
                     "ppl_source": ppl_source, "task_files": task_files},
           "compressor": {"name": compressor, "options": dict(options or {})}, "proxy": {"name": proxy},
           "align": align, "gpu": {"device": device, "profile": "none"}, "allocation": allocation, "seed": seed,
           "eval": evaluation if evaluation is not None else {"ppl": False, "tasks": [], "latency": False}}
    if ratio is not None:
        cfg["ratio"] = ratio
    if seq_len is not None:
        cfg["seq_len"] = seq_len
    if calibration is not None:
        cfg["calibration"] = dict(calibration)
    return cfg


#: a data key's value meaning "the model's own data" (conf/model/tiny.yaml, smollm2.yaml): a named fixture's files for
#: it and for gac checkpoints built from it; for any other model the key must be given (exit 2 naming it)
AUTO_DATA = "auto"
_DATA_KEYS = (  # (where the job reads it, the model key that sets it, the example fix)
    ("calibration.source", "model.calibration_source", "a local .txt/.jsonl file, or wikitext2 from the hub"),
    ("model.ppl_source", "model.ppl_source", "a local .txt/.jsonl file, or wikitext2 from the hub"),
    ("model.task_files", "model.task_files", "'{piqa: FILE.jsonl}', or null for the hub's datasets"),
)


def model_label(spec: str) -> str:
    """The name a model given only by ``model.spec`` is recorded under: a named fixture's name, a directory's name
    (a gac checkpoint's or a Hugging Face model's), else the hub id."""
    from gac.fixtures import NAMED_MODELS

    s = str(spec)
    if s in NAMED_MODELS:
        return s
    p = Path(s).expanduser()
    if p.is_dir() or s.startswith((".", "/", "~")):
        return p.resolve().name or s
    return s


def resolve_model_data(cfg: dict) -> dict:
    """``cfg`` with the model's label and data resolved (a new dict; ``cfg`` is not changed).

    * ``model.spec`` replacing a named fixture's (``model=tiny model.spec=DIR``): the job is named by what is loaded
      (:func:`model_label`), not ``tiny``; ``model.name=NAME`` set to anything else keeps NAME.
    * a data key set to ``auto`` (tiny's and smollm2's configs): the loaded model's own data (a named fixture's, or
      the fixture a gac checkpoint was built from); a model without data of its own needs the key set, else
      :class:`GacError` naming each key the job would read (calibration only when it compresses, perplexity text
      only with ``eval.ppl``, task files only with ``eval.tasks``): tiny's data never score another model unasked.
    """
    return _with_model_data(cfg, _model_data(cfg))


def _model_data(cfg: dict) -> dict | None:
    """What :func:`resolve_model_data` changes: ``{"name": label or None, "data": {path: value}}`` for every data
    path set to ``auto``; None when nothing changes."""
    from gac.fixtures import NAMED_MODELS, default_data
    from gac.models import base_model_of

    model = cfg.get("model")
    if not isinstance(model, dict):
        return None
    spec = str(model.get("spec"))
    if not any(_get(cfg, where) == AUTO_DATA for where, _, _ in _DATA_KEYS) and not (
            model.get("name") in NAMED_MODELS and spec != model.get("name")):
        return None
    group = model.get("name") if model.get("name") in NAMED_MODELS else None
    name = model_label(spec) if model.get("name") in NAMED_MODELS and spec != model.get("name") else None
    own = default_data(base_model_of(spec))
    ev = cfg.get("eval") or {}
    used = {"calibration.source": str(_get(cfg, "compressor.name")) != BASELINE,
            "model.ppl_source": bool(ev.get("ppl")), "model.task_files": bool(ev.get("tasks"))}
    missing, data = [], {}
    for where, key, example in _DATA_KEYS:
        value = own[key.split(".")[1]] if own else None
        for path in {where, key}:
            if _get(cfg, path) == AUTO_DATA:
                data[path] = value
                if own is None and used[where] and path == where:
                    missing.append(f"{key} ({example})")
    p = Path(spec).expanduser()
    not_a_model_dir = (p.exists() or spec.startswith((".", "/", "~"))) and not p.is_dir()
    if missing and not not_a_model_dir:  # a missing or wrong path: check_job_here names that, the first thing to fix
        mine = default_data(group) if group else None
        on_purpose = f"; ={mine['ppl_source']} uses {group}'s data on purpose" if mine else ""
        raise GacError(f"config: model.spec={spec} has no calibration/evaluation data of its own (only "
                       f"{', '.join(NAMED_MODELS)} and gac checkpoints built from them do) and another model's are not "
                       f"used unasked: set {'; '.join(missing)}{on_purpose}")
    return {"name": name, "data": data}


def _with_model_data(cfg: dict, data: dict | None) -> dict:
    """``cfg`` (not changed) with :func:`_model_data`'s label and data: each data path that is ``auto`` there."""
    import copy

    if data is None:
        return cfg
    cfg = copy.deepcopy(cfg)
    if data["name"] is not None:
        cfg["model"]["name"] = data["name"]
    for path, value in data["data"].items():
        if _get(cfg, path) == AUTO_DATA:
            parent, leaf = path.rsplit(".", 1)
            cfg[parent][leaf] = value
    return cfg


def _check_numbers(cfg: dict, ev: dict) -> None:
    """The ranges of the numbers the schema only types: checked with the rest, before any work (not after loading
    or compressing, leaving a failures/ entry)."""

    def need(key: str, v, lo: int, none_ok: bool = False, what: str = "") -> None:
        if v is None and none_ok:
            return
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise GacError(f"config: {key} must be an integer >= {lo}{' or null' if none_ok else ''}{what}, got {v!r}")

    cal = _get(cfg, "calibration", {}) or {}
    need("calibration.n_samples", cal.get("n_samples"), 1)
    need("calibration.seq_len", cal.get("seq_len"), 2, what=" (tokens per calibration sample)")
    for key, example in (("results_dir", "results"), ("experiment_name", "default")):
        if key in cfg and not str(cfg[key] or "").strip():
            raise GacError(f"config: {key} is empty; give it a value (e.g. {key}={example}) or leave it out")
    need("eval.ppl_seq_len", ev.get("ppl_seq_len"), 2, none_ok=True)
    need("eval.ppl_max_windows", ev.get("ppl_max_windows"), 1, none_ok=True, what=" (null scores the whole text)")
    need("eval.ppl_stride", ev.get("ppl_stride"), 1, none_ok=True,
         what=" (null: non-overlapping windows; the GAC authors' sliding window: half of eval.ppl_seq_len)")
    stride, window = ev.get("ppl_stride"), ev.get("ppl_seq_len")
    if stride is not None and window is not None and stride > window:
        raise GacError(f"config: eval.ppl_stride={stride} is longer than eval.ppl_seq_len={window}; a window may not "
                       f"start past the previous one's end: use eval.ppl_stride <= {window}")
    if ev.get("tasks"):  # eval=none sets limit 0 beside no tasks: only a limit that will be used is checked
        need("eval.limit", ev.get("limit"), 1, none_ok=True, what=" (items per task; null: all)")
    for k in ("batch_size", "latency_batch"):
        need(f"eval.{k}", ev.get(k, 1), 1)
    need("eval.decode_tokens", ev.get("decode_tokens", 0), 0)
    need("eval.decode_prompt", ev.get("decode_prompt", 1), 1, what=" (tokens before the decode steps)")
    need("eval.warmup", ev.get("warmup"), 0, none_ok=True)
    for k in ("iters", "trials"):
        need(f"eval.{k}", ev.get(k), 1, none_ok=True)
    for i, v in enumerate(ev.get("latency_seq_lens") or ()):
        need(f"eval.latency_seq_lens[{i}]", v, 1)
    for i, pair in enumerate(ev.get("latency_batches") or ()):
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in pair)
        if not ok:
            raise GacError(f"config: eval.latency_batches[{i}] must be a pair [batch, seq_len] of positive integers, "
                           f"got {pair!r}; write eval.latency_batches='[[4,1024],[8,1024]]'")
