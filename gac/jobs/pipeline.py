"""One job: compress -> dimension sweep -> DP -> evaluate -> prefill latency -> record.

:func:`spec_from_config` turns a plain dict (a resolved Hydra config, or one typed by hand) into a validated
:class:`JobSpec` before any heavy work; :func:`run_job` runs it against a :class:`~gac.results.ResultsStore`.
Nothing here reads Hydra objects.

Resumption. Every finished stage leaves its output under ``<results_dir>/work/<key>/`` (the plan, each metric
group); a job that is requeued after a timeout or preemption, or simply launched again, skips what is there.
Scores and factorizations are cached under ``<results_dir>/cache/prepared/`` (safetensors + JSON, keyed by the
model, compressor, proxy, calibration and the code that computes them) so the other points of a ratio or strategy
sweep re-use them; ``force=true`` recomputes them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gac.errors import GacError, unknown_name
from gac.io import read_json, write_json_atomic
from gac.metrics import DECODE, PREFILL, PREFILL_SPREAD, ppl_metric, prefill_point
from gac.progress import progress, stage_done
from gac.results import ResultsStore, config_key
from gac.results.store import canonical_number

log = logging.getLogger(__name__)

BASELINE = "none"
DEVICES = ("cpu", "cuda")
PROFILE_MODES = ("none", "auto", "measure")


@dataclass
class EvalSpec:
    ppl: bool = True
    ppl_seq_len: int | None = None  # None: 2048 capped at the model's maximum (the papers' protocol)
    ppl_max_windows: int | None = None  # None: the whole test text
    tasks: tuple[str, ...] = ("piqa", "hellaswag")
    limit: int | None = 200
    batch_size: int = 8
    latency: bool = True
    latency_batch: int = 1
    latency_seq_lens: tuple[int, ...] = (1024,)
    latency_batches: tuple[tuple[int, int], ...] = ()
    decode_tokens: int = 0
    warmup: int | None = None
    iters: int | None = None
    trials: int | None = None


@dataclass
class JobSpec:
    model_name: str
    model_spec: str
    compressor: str
    strategy: str = "gac"
    ratio: float = 0.15
    unit: int = 8
    window: int = 8
    use_profile: bool = True
    knapsack_score: str = "marginal"  # s_i of Eq. 4: "marginal" (the compressor's error per parameter) or "proxy"
    proxy: str | None = None
    compressor_options: dict = field(default_factory=dict)
    allocation: str = "default"  # "default": the compressor's own rule (its reference's); else see gac.compression.allocation
    calibration: dict = field(default_factory=lambda: {"source": "wikitext2", "n_samples": 32, "seq_len": 2048})
    dtype: str | None = None
    random_weights: bool = False
    arch: dict | None = None
    ppl_source: str | None = "wikitext2"
    task_files: str | dict | None = None
    gpu: str = "cpu"
    device: str = "cpu"
    profile: str = "none"
    allow_profile_mismatch: bool = False
    eval: EvalSpec = field(default_factory=EvalSpec)
    seq_len: int = 1024
    seed: int = 0
    experiment: str = "default"
    sweep: str | None = None

    @property
    def is_baseline(self) -> bool:
        return self.compressor == BASELINE

    def identity(self) -> dict:
        """What determines the result (labels such as experiment/sweep excluded); the baseline ignores
        compression-only settings, so every sweep shares one baseline record per model, GPU and evaluation."""
        d = asdict(self)
        for k in ("experiment", "sweep"):
            d.pop(k)
        if self.is_baseline:
            for k in ("strategy", "ratio", "unit", "window", "use_profile", "knapsack_score", "proxy", "compressor_options",
                      "allocation", "calibration"):
                d.pop(k)
        return d

    @property
    def key(self) -> str:
        return config_key(self.identity())

    def job_fields(self) -> dict:
        return {
            "model": self.model_name, "compressor": self.compressor,
            "proxy": None if self.is_baseline else (self.proxy or _default_proxy(self.compressor)),
            "strategy": "baseline" if self.is_baseline else self.strategy,
            "ratio": None if self.is_baseline else self.ratio, "unit": None if self.is_baseline else self.unit,
            "gpu": self.gpu, "seq_len": self.seq_len, "experiment": self.experiment, "sweep": self.sweep,
        }


def _default_proxy(compressor: str) -> str:
    from gac.compression.compressors import COMPRESSORS, canonical_name

    return COMPRESSORS[canonical_name(compressor)].default_proxy


def _get(d: dict, path: str, default=None):
    cur = d
    for p in path.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return default
        cur = cur[p]
    return cur


def _require(d: dict, path: str):
    v = _get(d, path, _MISSING)
    if v is _MISSING:
        raise GacError(f"config: missing key {path!r}")
    return v


_MISSING = object()


def spec_from_config(cfg: dict) -> JobSpec:
    """Validate a resolved config (plain dict) and build the job. Every error names the key and the fix."""
    from gac.align.strategies import STRATEGIES
    from gac.align.targets import check_ratio
    from gac.compression.allocation import ALLOCATION_CHOICES, resolve_allocation
    from gac.compression.compressors import COMPRESSORS, canonical_name
    from gac.compression.importance import PROXIES
    from gac.dtypes import job_dtype
    from gac.evaluation.tasks import check_task_names
    from gac.jobs.schema import validate_config
    from gac.models import model_label

    cfg = resolve_model_data(validate_config(cfg))  # types and keys (gac.jobs.schema); the model's label and data
    comp = str(_require(cfg, "compressor.name"))
    if comp != BASELINE:
        if comp.lower() not in COMPRESSORS and comp.lower().replace("-", "_") not in COMPRESSORS:
            raise unknown_name("compressor (config compressor=...)", comp, [*COMPRESSORS, BASELINE])
        comp = canonical_name(comp)
    strategy = str(_require(cfg, "align.strategy"))
    if strategy not in STRATEGIES:
        raise unknown_name("strategy (config align.strategy)", strategy, STRATEGIES)
    from gac.compression.compress import KNAPSACK_SCORES

    knapsack_score = str(_get(cfg, "align.knapsack_score", "marginal"))
    if knapsack_score not in KNAPSACK_SCORES:
        raise unknown_name("knapsack score (config align.knapsack_score)", knapsack_score, KNAPSACK_SCORES)
    proxy = _get(cfg, "proxy.name")
    if proxy is not None and proxy not in PROXIES:
        raise unknown_name("importance proxy (config proxy=...)", str(proxy), PROXIES)
    ratio = _require(cfg, "ratio")
    check_ratio(ratio)
    allocation = str(cfg.get("allocation", "default"))
    if allocation not in ALLOCATION_CHOICES:
        raise unknown_name("allocation (config allocation=...)", allocation, ALLOCATION_CHOICES)
    for k in ("align.unit", "align.window", "seq_len"):
        v = _require(cfg, k)
        if v <= 0:
            raise GacError(f"config: {k} must be a positive integer, got {v!r}")
    from gac.align.candidates import check_unit

    try:
        check_unit(_require(cfg, "align.unit"))
    except GacError as e:
        raise GacError(f"config: align.unit: {e}") from None
    on_busy = cfg.get("on_busy", "wait")
    if on_busy not in ON_BUSY:
        raise GacError(f"config: on_busy must be one of {', '.join(ON_BUSY)}, got {on_busy!r}")
    device = str(_require(cfg, "gpu.device"))
    if device.split(":")[0] not in DEVICES:
        raise GacError(f"config: gpu.device must be one of {DEVICES} (or cuda:N), got {device!r}")
    profile = str(_get(cfg, "gpu.profile", "none"))
    if profile not in PROFILE_MODES and not Path(profile).expanduser().exists():
        raise GacError(f"config: gpu.profile must be one of {PROFILE_MODES} or an existing profile directory, got {profile!r}")
    ev = dict(_get(cfg, "eval", {}) or {})
    tasks = tuple(str(t) for t in ev.get("tasks") or ())
    if tasks:
        tf = _get(cfg, "model.task_files")  # a named set's tasks, without building its files (enwiki needs PyPI once)
        local = dict.fromkeys(("piqa", "hellaswag"), "") if tf in ("tiny", "enwiki") else (_task_files_of(tf) or {})
        try:
            check_task_names(tasks, local)
        except GacError as e:
            raise GacError(f"config eval.tasks: {e}") from None
    known_eval = set(EvalSpec.__dataclass_fields__)
    extra = set(ev) - known_eval
    if extra:
        raise GacError(f"config: unknown eval key(s) {sorted(extra)}; known: {sorted(known_eval)}")
    ev["tasks"] = tasks
    _check_numbers(cfg, ev)
    ev["latency_seq_lens"] = tuple(int(s) for s in ev.get("latency_seq_lens") or ())
    ev["latency_batches"] = tuple((int(b), int(s)) for b, s in ev.get("latency_batches") or ())
    options = dict(_get(cfg, "compressor.options", {}) or {})
    if comp != BASELINE:
        from gac.compression.compress import check_sensitivity_reach
        from gac.compression.compressors import get_compressor

        built = get_compressor(comp, **options)  # unknown options (and a bad sensitivity grid) fail now
        allocation = resolve_allocation(allocation, built)
        if allocation == "sensitivity" and not built.supports_sensitivity:
            raise GacError(f"config: allocation=sensitivity is not available for {comp}; use proportional or uniform")
        check_sensitivity_reach(allocation, built, float(ratio))
        if allocation == "sensitivity":
            from gac.compression.sensitivity import sensitivity_limit

            sensitivity_limit()  # a bad $GAC_SENSITIVITY_LIMIT fails with the config, not after calibration
    calibration = dict(_get(cfg, "calibration", {}) or {})
    if calibration.get("seed") is None:
        calibration["seed"] = cfg.get("seed", 0)
    if comp != BASELINE:
        from gac.compression.compress import check_probe_samples

        try:
            check_probe_samples(allocation, built, int(calibration.get("n_samples") or 0))
        except GacError as e:
            raise GacError(f"config compressor.options: {e}") from None
    return JobSpec(
        model_name=model_label(_require(cfg, "model.name"), _require(cfg, "model.spec")),
        model_spec=str(_require(cfg, "model.spec")),
        compressor=comp,
        strategy=strategy,
        ratio=float(canonical_number(float(ratio))),  # 0.30000000000000004 (float drift) is the point 0.3
        unit=int(_require(cfg, "align.unit")),
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
        eval=EvalSpec(**ev),
        seq_len=int(cfg["seq_len"]),
        seed=int(cfg.get("seed", 0)),
        experiment=str(cfg.get("experiment_name", "default")),
        sweep=cfg.get("sweep"),
    )


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
    import copy

    from gac.fixtures import NAMED_MODELS, default_data
    from gac.models import base_model_of

    model = cfg.get("model")
    if not isinstance(model, dict):
        return cfg
    spec = str(model.get("spec"))
    if not any(_get(cfg, where) == AUTO_DATA for where, _, _ in _DATA_KEYS) and not (
            model.get("name") in NAMED_MODELS and spec != model.get("name")):
        return cfg
    cfg = copy.deepcopy(cfg)
    model = cfg["model"]
    group = model.get("name") if model.get("name") in NAMED_MODELS else None
    if model.get("name") in NAMED_MODELS and spec != model.get("name"):
        model["name"] = model_label(spec)
    own = default_data(base_model_of(spec))
    ev = cfg.get("eval") or {}
    used = {"calibration.source": str(_get(cfg, "compressor.name")) != BASELINE,
            "model.ppl_source": bool(ev.get("ppl")), "model.task_files": bool(ev.get("tasks"))}
    missing = []
    for where, key, example in _DATA_KEYS:
        value = own[key.split(".")[1]] if own else None
        for path in {where, key}:
            if _get(cfg, path) == AUTO_DATA:
                parent, leaf = path.rsplit(".", 1)
                cfg[parent][leaf] = value
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
    return cfg


def _check_numbers(cfg: dict, ev: dict) -> None:
    """The ranges of the numbers the schema only types: checked with the rest, before any work (each of these used
    to fail after loading or compressing, leaving a failures/ entry)."""

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
    if ev.get("tasks"):  # eval=none sets limit 0 beside no tasks: only a limit that will be used is checked
        need("eval.limit", ev.get("limit"), 1, none_ok=True, what=" (items per task; null: all)")
    for k in ("batch_size", "latency_batch"):
        need(f"eval.{k}", ev.get(k, 1), 1)
    need("eval.decode_tokens", ev.get("decode_tokens", 0), 0)
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


def check_job_here(spec: JobSpec) -> None:
    """What only the machine that runs the job can check, before anything is written or loaded: the job's device is
    there, its sequence lengths fit the model's positions, and tasks that need the hub can reach it."""
    if spec.device.startswith("cuda"):
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(spec.device.split(":")[1]) if ":" in spec.device and spec.device.split(":")[1].isdigit() else 0
        if n == 0 or index >= n:
            have = f"{n} CUDA device(s)" if n else "no CUDA"
            raise GacError(f"this job runs on {spec.device} (gpu={spec.gpu}), but this machine has {have}; run it on a "
                           f"GPU node (e.g. hydra/launcher=slurm_h100), or use gpu=cpu here")
    if not spec.random_weights:
        try:
            check_model_here(spec.model_spec)  # a missing directory, a file, the hub offline: now
        except GacError as e:
            raise GacError(f"config: model.spec: {e}") from None
    from gac.text import check_source

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
                lengths.append(("eval.decode_tokens + 128 (the decode prompt)", ev.decode_tokens + 128))
        for key, n in lengths:
            if n > limit:
                raise GacError(f"config: {key}={n} is above the maximum sequence length of model {spec.model_name} "
                               f"({limit}, max_position_embeddings); use at most {limit}")
    if spec.eval.tasks:
        from gac.evaluation.tasks import check_hub_tasks

        local = _task_files(spec) or {}
        check_hub_tasks([t for t in spec.eval.tasks if t not in local], via="config")


def check_model_here(model_spec: str) -> None:
    """The model can be loaded from here: a local path exists and is a model; a hub id is in the local cache or the
    hub answers (otherwise loading retries for a minute before it fails)."""
    from gac.models import model_kind
    from gac.text import hub_repo_cached, hub_unreachable

    if model_kind(model_spec) != "hub":
        return
    why = hub_unreachable()
    if why is not None and not hub_repo_cached(str(model_spec), "model"):
        raise GacError(f"{model_spec!r} is a Hugging Face hub id, but the hub is not reachable here ({why}) and the "
                       f"model is not in the local cache; download it where the hub is reachable (`huggingface-cli "
                       f"download {model_spec} --local-dir DIR`) and pass DIR, or use 'tiny' (offline)")


def _max_positions(spec: JobSpec) -> int | None:
    if spec.random_weights:
        config = job_model_config(spec)
        n = getattr(config, "max_position_embeddings", None) if config is not None else None
        return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
    return model_max_positions(spec.model_spec)


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
            from gac.compression.checkpoint import read_meta

            n = (read_meta(model_spec).get("base_config") or {}).get("max_position_embeddings")
        else:
            from transformers import AutoConfig

            n = getattr(AutoConfig.from_pretrained(model_spec, local_files_only=True), "max_position_embeddings", None)
    except Exception:  # noqa: BLE001 - a bad path or config: loading reports it with its own message
        return None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


# ----------------------------------------------------------------------------------------------------- stages


class _Work:
    """Stage outputs of one job under ``<results_dir>/work/<key>/`` (what a requeued job resumes from).

    ``attempts.json`` lists the job's attempts and, per stage output, the attempt that wrote it and the sha256 of
    the file it wrote; each output file names its key, stage and attempt. A job resumes only an output an attempt of
    this key wrote and nobody changed since, with the types its stage produces: a file planted or edited in the
    work directory is reported and recomputed, never trusted. A damaged ``attempts.json`` (not JSON, another shape)
    stops the job before any work with one line saying what to remove."""

    FILE_FORMAT = "gac-stage-output"

    def __init__(self, store: ResultsStore, key: str):
        self.dir = store.root / "work" / key
        self.key = key
        self.attempts: list[dict] = []
        self.outputs: dict[str, dict] = {}
        self.attempt_id: int | None = None

    @property
    def attempts_path(self) -> Path:
        return self.dir / "attempts.json"

    def _fix(self) -> str:
        return (f"remove the work directory (rm -r {self.dir}) and re-run: the point then starts again from its first "
                f"stage (nothing finished is lost: records live under records/)")

    def remove(self) -> None:
        import shutil

        if self.dir.is_symlink() or self.dir.is_file():
            self.dir.unlink()
        elif self.dir.exists():
            shutil.rmtree(self.dir)

    def load(self) -> None:
        """Read and check ``attempts.json`` and the directory's entries (before any work)."""
        if self.dir.is_symlink() or (self.dir.exists() and not self.dir.is_dir()):
            raise GacError(f"{str(self.dir)!r} is not a directory (gac keeps a job's finished stages there); "
                           f"{self._fix()}")
        if not self.dir.exists():
            return
        for entry in self.dir.iterdir():
            if entry.name.endswith(".json") and (entry.is_symlink() or not entry.is_file()):
                raise GacError(f"{str(entry)!r} is not a plain file (a link or a directory where a job writes a stage "
                               f"output); {self._fix()}")
        p = self.attempts_path
        if not p.exists():
            return
        try:
            doc = read_json(p, "attempts file", max_bytes=16 << 20)
        except GacError as e:
            raise GacError(f"{e}; {self._fix()}") from None
        problem = _attempts_problem(doc)
        if problem:
            raise GacError(f"attempts file {str(p)!r} {problem}; {self._fix()}")
        self.attempts = list(doc["attempts"])
        self.outputs = dict(doc.get("outputs") or {})

    def save(self) -> None:
        write_json_atomic(self.attempts_path, {"attempts": self.attempts, "outputs": self.outputs}, overwrite=True)

    def get(self, name: str):
        """The output of stage ``name`` if an attempt of this job wrote it and it is unchanged and well-formed."""
        p = self.dir / f"{name}.json"
        entry = self.outputs.get(name)
        if entry is None:
            if p.exists():
                log.warning("ignoring %s: no attempt of job %s wrote it (planted, copied or left by an older gac); "
                            "the stage runs again", p, self.key)
            return None
        try:
            data = p.read_bytes()
        except OSError as e:
            log.warning("cannot read the stage output %s (%s); the stage runs again", p, e.strerror or e)
            return None
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            log.warning("ignoring %s: it changed since attempt %s of job %s wrote it (sha256 differs); the stage runs "
                        "again", p, entry["attempt"], self.key)
            return None
        try:
            doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except ValueError:
            doc = None
        why = (_stage_output_problem(name, doc["output"]) if isinstance(doc, dict) and doc.get("format") ==
               self.FILE_FORMAT and (doc.get("key"), doc.get("stage"), doc.get("attempt")) ==
               (self.key, name, entry["attempt"]) and "output" in doc else "it is not this job's stage output")
        if why:
            log.warning("ignoring %s: %s; the stage runs again", p, why)
            return None
        return doc["output"]

    def put(self, name: str, obj) -> None:
        doc = {"format": self.FILE_FORMAT, "key": self.key, "stage": name, "attempt": self.attempt_id, "output": obj}
        p = write_json_atomic(self.dir / f"{name}.json", doc, overwrite=True)
        self.outputs[name] = {"attempt": self.attempt_id, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        self.save()


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _attempts_problem(doc) -> str | None:
    """What makes ``doc`` not an ``attempts.json`` a job wrote (None when nothing does)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("attempts"), list):
        return f"holds a {type(doc).__name__}, not an object with a list of attempts"
    seen = set()
    for a in doc["attempts"]:
        if not isinstance(a, dict) or not isinstance(a.get("attempt"), int) or isinstance(a["attempt"], bool) \
                or a["attempt"] < 1 or a["attempt"] in seen:
            return "lists an attempt that is not an object with its own attempt number"
        seen.add(a["attempt"])
    outputs = doc.get("outputs", {})
    if not isinstance(outputs, dict):
        return "has 'outputs' that are not an object"
    for name, e in outputs.items():
        if not isinstance(e, dict) or e.get("attempt") not in seen or not isinstance(e.get("sha256"), str) \
                or len(e["sha256"]) != 64:
            return f"has an entry for the output {name!r} that names no attempt of this job or no sha256"
    return None


def _stage_output_problem(name: str, out) -> str | None:
    """Why ``out`` is not what stage ``name`` writes (types and plausible values), or None."""
    from gac.metrics import check_metrics, metric_problem

    if not isinstance(out, dict):
        return f"it holds a {type(out).__name__}, not the stage's object"
    try:
        if name == "ppl":
            why = metric_problem("ppl_x", out.get("ppl")) if out.get("ppl") is not None else "it has no perplexity"
            return f"its perplexity {why}" if why else None
        if name == "tasks":
            if not isinstance(out.get("results"), dict) or not isinstance(out.get("metrics"), dict):
                return "it lacks the task results and metrics"
            check_metrics(out["metrics"], "tasks")
            return None
        if name == "latency":
            for point, r in out.items():
                ms = r.get("median_ms") if isinstance(r, dict) else None
                why = metric_problem(DECODE if point == "decode" else PREFILL, ms) if ms is not None else "is missing"
                if why:
                    return f"its latency at {point!r} {why}"
            return None
    except GacError as e:
        return str(e)
    return None


def _stage_hook(loggers, stage: str) -> None:
    """A job enters ``stage``: tell the loggers (``gac launch status`` shows it) and run any injected fault."""
    from gac.faults import fault_point

    for lg in loggers:
        if hasattr(lg, "log_stage"):
            lg.log_stage(stage)
    fault_point(stage)


_LOAD_LOCK = threading.Lock()  # transformers' loading patches process-wide state: one load at a time per process


def load_job_model(spec: JobSpec):
    """The model and tokenizer of a job (random weights from ``arch`` when asked: latency needs no weights).
    Loads in one process are serialised (jobs run from threads of a notebook or a test)."""
    with _LOAD_LOCK:
        return _load_job_model(spec)


def _load_job_model(spec: JobSpec):
    import torch

    if spec.random_weights:
        if not spec.arch:
            raise GacError(f"model {spec.model_name}: random_weights=true needs an `arch` block in the model config")
        from transformers import AutoConfig, AutoModelForCausalLM

        from gac.models import resolve_dtype

        arch = dict(spec.arch)
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
        dtype = resolve_dtype(spec.dtype or "auto", spec.device)
        torch.manual_seed(spec.seed)
        with torch.device(spec.device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        return model.eval(), None
    from gac.models import load_model

    return load_model(spec.model_spec, dtype=spec.dtype or "auto", device=spec.device)


MEMORY_CHECK_ENV = "GAC_SKIP_MEMORY_CHECK"  # =1 skips check_job_fits (when its estimate is known to be wrong)


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
            return AutoConfig.from_pretrained(model_spec, local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached / not readable: fall back to the arch block
            pass
    if kind == "checkpoint":
        from gac.compression.checkpoint import read_meta

        try:
            from transformers import AutoConfig

            base = dict(read_meta(model_spec)["base_config"])
            return AutoConfig.for_model(base.pop("model_type"), **base)  # an upper bound: the uncompressed model
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
        from transformers import AutoConfig

        arch = dict(spec.arch)
        return AutoConfig.for_model(arch.pop("model_type"), **arch)
    return model_config_offline(spec.model_spec, spec.arch)


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
        n_samples=int(cal.get("n_samples", 32)), seq_len=int(cal.get("seq_len", 2048)), proxy=spec.proxy,
        compressor_options=spec.compressor_options, evaluation=eval_load(spec))


def check_fits_before_loading(config, model_name: str, compressor: str, dtype, device: str, **estimate):
    """:func:`gac.compression.footprint.estimate_footprint` of a model ``config`` (``compressor="none"``: no
    compression) checked against ``device`` and the host (:func:`~gac.compression.footprint.check_fits`); returns
    the estimate. Used by jobs, ``gac compress`` and ``gac evaluate`` before they load anything."""
    from gac.compression.footprint import check_fits, estimate_footprint
    from gac.compression.resources import device_memory

    fp = estimate_footprint(config, compressor, dtype=str(dtype).removeprefix("torch."), device=device, **estimate)
    check_fits(fp, device_memory(device), host_available_mb=device_memory("cpu")["available_mb"],
               what=f"{'the uncompressed model' if compressor == BASELINE else compressor} on {model_name} "
                    f"({fp.params / 1e9:.2f}B parameters, {fp.dtype}, {device})")
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
    dt = dtype_name(dtype, device) or dtype_name(own.removeprefix("torch."), device)
    from gac.models import BUILTIN

    if model_spec in BUILTIN and dtype is None:
        dt = "float32"  # the named fixtures (tiny, smollm2) load in float32 unless told otherwise
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


def _prepared_cache_key(spec: JobSpec) -> str:
    from gac.compression.prepared_io import code_fingerprint

    ident = {k: v for k, v in asdict(spec).items() if k in (
        "model_spec", "dtype", "random_weights", "arch", "compressor", "compressor_options", "proxy", "allocation",
        "calibration", "device", "seed")}
    ident["code"] = code_fingerprint()  # any change to the code that scores or factorises invalidates the cache
    if spec.model_spec in ("tiny", "tiny-untrained"):
        from gac.fixtures.tiny import recipe_hash

        ident["tiny_recipe"] = recipe_hash()
    elif spec.model_spec == "smollm2":
        from gac.fixtures import named_identity

        ident["smollm2_recipe"] = named_identity("smollm2")
    text = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def prepare_cached(spec: JobSpec, model, tokenizer, cache_dir: Path | None, refresh: bool = False, on_wait=None):
    """:func:`gac.compression.prepare`, with its scores and factorizations cached by content on disk.

    The cache file is data (:mod:`gac.compression.prepared_io`: safetensors + JSON), keyed by the job's model,
    compressor, proxy, calibration and the code that produced it. ``refresh`` (``force=true``) ignores an existing
    entry and writes a fresh one. An unreadable or mismatching entry is reported and recomputed, never trusted.

    Jobs running in parallel (Slurm array tasks of one sweep) share the work: the first takes the entry's lock
    (``<key>.lock`` beside it) and computes; the others wait for it (``on_wait(holder)`` is called once) and load
    its entry. A failing computer leaves the lock to the next waiter, which computes itself.
    """
    from gac.results.lock import FileLock, describe_holder

    if cache_dir is None:
        return _prepare(spec, model, tokenizer)
    path = cache_dir / "prepared" / f"{_prepared_cache_key(spec)}.safetensors"
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
        prepared = _prepare(spec, model, tokenizer)
        try:
            prepared.save(path)
        except (GacError, OSError) as e:  # the cache is an optimisation: a full disk must not fail the job
            log.warning("could not cache the scores and factorizations at %s: %s", path, e)
        return prepared
    finally:
        lock.release()


def _load_prepared(spec: JobSpec, model, path: Path):
    from gac.compression.compress import Prepared

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


def _prepare(spec: JobSpec, model, tokenizer):
    import torch

    from gac.compression.compress import Calibration, prepare

    cal = Calibration(**{k: v for k, v in spec.calibration.items() if k in Calibration.__dataclass_fields__})
    calib_ids = None
    if spec.calibration.get("source") == "random":  # random tokens: enough for latency studies on random weights
        g = torch.Generator().manual_seed(int(spec.calibration.get("seed", spec.seed)))
        vocab = int(model.config.vocab_size)
        calib_ids = torch.randint(0, vocab, (int(cal.n_samples), int(cal.seq_len)), generator=g)
    prepared = prepare(model, tokenizer, spec.compressor, spec.proxy, calibration=cal, calib_ids=calib_ids,
                       allocation=spec.allocation, compressor_options=spec.compressor_options)
    prepared.timings["cached"] = False
    return prepared


def _candidate_filter(spec: JobSpec, targets, cache_dir: Path | None):
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


def _task_files(spec: JobSpec):
    return _task_files_of(spec.task_files)


def _task_files_of(task_files):
    if task_files in (None, "hub"):
        return None
    if task_files in ("tiny", "enwiki"):
        from gac.fixtures import task_files_of

        return {k: str(v) for k, v in task_files_of(task_files).items()}
    if isinstance(task_files, dict):
        return dict(task_files)
    raise GacError(f"model.task_files must be null, 'tiny', 'enwiki' or a {{task: path}} mapping, got {task_files!r}")


def _stage(work: _Work, name: str, resumed: list, compute, timings: dict, hook=None) -> dict:
    """A stage's output from the work dir if a previous attempt finished it, else computed (timed in this attempt's
    ``timings`` as ``<name>_s``) and saved. A resumed stage adds no timing: an attempt reports only what it ran."""
    got = work.get(name)
    if got is not None:
        resumed.append(name)
        return got
    if hook is not None:
        hook(name)
    t0 = time.perf_counter()
    got = compute()
    got["seconds"] = time.perf_counter() - t0
    timings[f"{name}_s"] = got["seconds"]
    if name in STAGE_NAMES:  # perplexity's own progress already closed with its time
        stage_done(STAGE_NAMES[name], got["seconds"])
    work.put(name, got)
    return got


def _results_of(res: dict) -> dict:
    """:func:`evaluate_tasks` with ``layout=True`` as the tasks stage stores it."""
    return {"results": res["tasks"], "metrics": res["metrics"], "lm_eval": res["lm_eval"]}


def _evaluate(spec: JobSpec, model, tokenizer, work: _Work, timings: dict, resumed: list, hook=None,
              meter=None) -> dict:
    import contextlib

    from gac.evaluation import decode_latency, evaluate_tasks, perplexity, prefill_latency

    def measured(name, sample=True):
        return meter.stage(name, sample=sample) if meter is not None else contextlib.nullcontext()

    ev = spec.eval
    metrics: dict = {}
    details: dict = {}
    if ev.ppl and spec.ppl_source:
        if tokenizer is None and work.get("ppl") is None:
            raise GacError("perplexity needs a tokenizer; a random-weights model has none: set eval.ppl=false")
        with measured("ppl"):
            got = _stage(work, "ppl", resumed, lambda: perplexity(
                model, tokenizer, spec.ppl_source, seq_len=ev.ppl_seq_len, batch_size=ev.batch_size,
                max_windows=ev.ppl_max_windows), timings, hook)
        metrics[ppl_metric(got.get("source") or spec.ppl_source)] = got["ppl"]
        details["perplexity"] = got
    if ev.tasks:
        if tokenizer is None and work.get("tasks") is None:
            raise GacError("lm-eval tasks need a tokenizer; a random-weights model has none: set eval.tasks=[]")
        with measured("tasks"):
            got = _stage(work, "tasks", resumed, lambda: _results_of(evaluate_tasks(
                model, tokenizer, ev.tasks, limit=ev.limit, local_files=_task_files(spec), batch_size=ev.batch_size,
                layout=True)), timings, hook)
        metrics.update(got["metrics"])
        details["tasks"] = got["results"]
        if got.get("lm_eval") is not None:
            details["lm_eval"] = got["lm_eval"]
    if ev.latency:
        with measured("latency", sample=False):  # no sampler thread while latency is timed
            lat = work.get("latency") or {}
            resumed += [f"latency:{k}" for k in lat]
            t0 = time.perf_counter()
            points = [(ev.latency_batch, s) for s in ev.latency_seq_lens] + list(ev.latency_batches)
            todo = [(b, s) for b, s in points if prefill_point(b, s) not in lat]
            if (todo or (ev.decode_tokens > 0 and "decode" not in lat)) and hook is not None:
                hook("latency")
            with progress(len(todo), "latency", unit="points") as bar:
                for b, s in points:
                    name = prefill_point(b, s)
                    if name not in lat:
                        lat[name] = prefill_latency(model, batch=b, seq_len=s, warmup=ev.warmup, iters=ev.iters,
                                                    trials=ev.trials, seed=spec.seed)
                        work.put("latency", lat)
                        bar.update()
            if ev.decode_tokens > 0 and "decode" not in lat:
                lat["decode"] = decode_latency(model, batch=ev.latency_batch, new_tokens=ev.decode_tokens,
                                               trials=ev.trials, seed=spec.seed)
                work.put("latency", lat)
            main = prefill_point(ev.latency_batch, spec.seq_len)  # the job's own point: `prefill_ms`, named once
            for name, r in lat.items():
                if name == "decode":
                    metrics[DECODE] = r["median_ms"]
                elif name == main:
                    metrics[PREFILL] = r["median_ms"]
                    if (r.get("trials") or 0) > 1 and r.get("spread_pct") is not None:
                        metrics[PREFILL_SPREAD] = r["spread_pct"]
                else:
                    metrics[name] = r["median_ms"]
            details["latency"] = lat
            if todo or (ev.decode_tokens > 0 and "decode" in lat and "latency:decode" not in resumed):
                timings["latency_s"] = time.perf_counter() - t0
    for k, v in metrics.items():
        if v is not None and isinstance(v, float) and not math.isfinite(v):
            raise GacError(f"metric {k} is {v}: the compressed model produced non-finite outputs")
    return {"metrics": metrics, "details": details}


def _provenance(spec: JobSpec) -> dict:
    from gac.evaluation.report import provenance

    p = provenance(device=spec.device)
    p["seed"] = spec.seed
    p["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    p["slurm_array_job_id"] = os.environ.get("SLURM_ARRAY_JOB_ID")
    p["slurm_array_task_id"] = os.environ.get("SLURM_ARRAY_TASK_ID")
    p["slurm_restart_count"] = os.environ.get("SLURM_RESTART_COUNT")
    try:
        import torch

        if spec.device.startswith("cuda") and torch.cuda.is_available():
            p["device_name"] = torch.cuda.get_device_name(torch.device(spec.device))  # the job's GPU, not cuda:0
    except Exception:  # provenance must never fail a job
        pass
    return p


ON_BUSY = ("wait", "skip")
STAGE_NAMES = {"tasks": "lm-eval tasks"}


def _preflight(spec: JobSpec, store: ResultsStore, save_model: str | None, force: bool = False) -> None:
    """Everything that can fail on bad input or a bad disk, checked before a second of compute (and before the store
    is touched): the job's device, model and sequence lengths (check_job_here), the model's files match their config,
    the store is writable with room to spare and its entries for this key are what gac makes, the task files match
    their task's schema, the checkpoint path is free."""
    check_job_here(spec)
    if not spec.random_weights and (force or not store.is_done(spec.key)):  # a done point needs no model
        from gac.models import check_model_files

        check_model_files(spec.model_spec)  # weights that match their config, a checkpoint that matches its weights
    store.prepare_for_writing()
    store.check_layout(spec.key)
    if spec.eval.tasks:
        files = _task_files(spec) or {}
        from gac.evaluation.tasks import check_local_file

        for t in spec.eval.tasks:
            if t in files:
                check_local_file(t, files[t])
    if save_model:
        from gac.compression.checkpoint import check_output_dir

        check_output_dir(save_model)


def _skipped(store: ResultsStore, key: str, path: Path | None = None, why: str = "done") -> dict:
    rec = store.read_record(key, path=path)
    rec["skipped"] = True
    rec["skip_reason"] = why
    rec["_path"] = str(path or store.record_path(key))
    return rec


def _attempt_info() -> dict:
    return {"host": os.uname().nodename, "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
            "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
            "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def run_job(spec: JobSpec, store: ResultsStore, config: dict | None = None, overrides: Sequence[str] = (),
            force: bool = False, loggers: Sequence = (), save_model: str | None = None, on_busy: str = "wait",
            lock_timeout: float | None = None) -> dict:
    """Run one job end to end and write its record. Returns the record (or the existing one if done).

    The job holds the store's lock for its key while it runs (:mod:`gac.results.lock`): an identical job started
    meanwhile waits for it (``on_busy="wait"``, then returns its record marked ``skipped``) or returns at once
    (``"skip"``). A failure is written to the store with its error (``failures/<key>/``) and re-raised; each
    attempt (completed, failed, or interrupted by a kill) is kept in the record's ``attempts`` with its own timings.
    """
    from gac.jobs.tracking import append_event

    if on_busy not in ON_BUSY:
        raise GacError(f"on_busy must be one of {ON_BUSY}, got {on_busy!r}")
    key = spec.key
    _preflight(spec, store, save_model, force)
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
        if on_busy == "skip":
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
        return _run_locked(spec, store, key, lock, config, overrides, force, loggers, save_model)
    finally:
        lock.release()


def _run_locked(spec, store, key, lock, config, overrides, force, loggers, save_model) -> dict:
    from gac.jobs.tracking import append_event

    work = _Work(store, key)
    if force:  # a forced re-run measures everything again
        work.remove()
    work.load()  # a damaged attempts.json: one line saying what to remove, before any work
    attempts = work.attempts
    for a in attempts:
        if a.get("outcome") in (None, "running"):
            a["outcome"] = "interrupted"  # killed (or its node lost) before it could say how it ended
    attempt = {"attempt": max([a["attempt"] for a in attempts], default=0) + 1, **_attempt_info(), "ended": None,
               "outcome": "running"}
    from gac.io import DISK_FULL, SpaceReserve

    reserve = SpaceReserve(store.root, f"space-reserve-{key}").take()  # room to record the end on a full disk
    attempts.append(attempt)
    work.attempt_id = attempt["attempt"]
    try:
        work.save()
    except BaseException:
        reserve.release()
        raise
    timings: dict = {}  # seconds per stage measured by THIS attempt (numbers only)
    stages: dict = {"resumed": [], "prepare_cached": None}  # what a resumed job or a warm cache saved
    from gac.compression.resources import ResourceMeter

    meter = ResourceMeter(spec.device)  # wall time and peak memory per stage -> record["memory"] (_resources)
    sub_memory: dict = {}  # the stages inside prepare / compress (calibration, score, factorize, plan, apply, ...)
    t_job = time.perf_counter()
    base = {"job": spec.job_fields(), "config": config or asdict(spec), "overrides": list(overrides)}

    def hook(stage: str) -> None:
        attempt.update(stage=stage, timings=dict(timings))  # how far an attempt got, even if it is killed next
        work.save()
        _stage_hook(loggers, stage)

    def end_attempt(outcome: str, error: str | None = None) -> None:
        attempt.update(ended=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), outcome=outcome,
                       timings=dict(timings), resumed=list(stages["resumed"]))
        if error:
            attempt["error"] = error

    estimate: list = [None]  # the memory estimate, named by an out-of-memory error
    try:
        for lg in loggers:
            lg.start(key, spec, base["config"], base["overrides"])
        # before anything is loaded: a clear error if weights + working set exceed the device
        estimate[0] = check_job_fits(spec)
        hook("load")
        t0 = time.perf_counter()
        with meter.stage("load"):
            model, tokenizer = load_job_model(spec)
        timings["load_s"] = time.perf_counter() - t0
        stage_done("load", timings["load_s"], spec.model_name)
        plan_json, report, profile_meta = None, None, None
        if not spec.is_baseline:
            hook("prepare")  # calibration, scoring, factorization (or the shared cache entry)
            t0 = time.perf_counter()
            with meter.stage("prepare"):
                prepared = prepare_cached(spec, model, tokenizer, store.cache_dir, refresh=force,
                                          on_wait=lambda h: append_event(store.root, key, "waiting", what="scoring",
                                                                         holder=h))
            timings["compress_prepare_s"] = time.perf_counter() - t0
            stage_done("prepare", timings["compress_prepare_s"],
                       "cached scores" if prepared.timings.get("cached") else "calibration, scores, factorization")
            stages["prepare_cached"] = bool(prepared.timings.get("cached"))
            if not stages["prepare_cached"]:
                timings.update({k: v for k, v in prepared.timings.items() if k in PREPARE_STAGE_TIMINGS})
                sub_memory.update(prepared.memory)
            hook("plan")
            t0 = time.perf_counter()
            with meter.stage("sweep", sample=False):  # the dimension sweep times kernels: no sampler thread
                targets, _ = prepared.targets(spec.ratio, spec.unit, spec.knapsack_score)
                filt, profile = _candidate_filter(spec, targets, store.cache_dir)
            timings["sweep_s"] = time.perf_counter() - t0
            if profile is not None:
                profile_meta = dict(profile.meta)
            model, plan, report = prepared.compress(spec.ratio, spec.strategy, spec.unit, spec.window, filt,
                                                    copy_model=False, knapsack_score=spec.knapsack_score)
            timings["dp_s"] = report["timings"]["plan_s"]
            timings["compress_apply_s"] = report["timings"]["apply_s"]
            stage_done("plan and apply", timings["sweep_s"] + timings["dp_s"] + timings["compress_apply_s"],
                       f"{spec.strategy}, ratio {spec.ratio:g}")
            sub_memory.update({k: v for k, v in report["memory"].items() if k in ("plan", "apply")})
            plan_json = plan.to_json()
            plan_json["d_star"] = report["d_star"]
            if work.get("plan") is None:
                work.put("plan", plan_json)
            del prepared
            if save_model:
                from gac.compression.checkpoint import save_checkpoint

                save_checkpoint(model, tokenizer, save_model, recipe=report["recipe"], plan=plan)
        t0 = time.perf_counter()
        with meter.stage("evaluate"):
            ev = _evaluate(spec, model, tokenizer, work, timings, stages["resumed"], hook, meter)
        timings["evaluate_s"] = time.perf_counter() - t0
        timings["total_s"] = time.perf_counter() - t_job
        stage_done("job", timings["total_s"], key)
        end_attempt("completed")
        record = {
            **base,
            "metrics": ev["metrics"],
            "aligned_fraction": plan_json["aligned_fraction"] if plan_json else _model_aligned_fraction(model, spec.unit),
            "params": plan_json["params"] if plan_json else None,
            "budget": plan_json["budget"] if plan_json else None,
            "plan": plan_json,
            "compression": None if report is None else {k: report[k] for k in (
                "recipe", "dense_params", "params_counted", "n_targets", "compression_wall_s", "notes")},
            "evaluation": ev["details"],
            "profile": profile_meta,
            "timings": timings,
            "memory": _resources(meter, sub_memory, spec),
            "attempts": attempts,
            "stages": stages,
            "provenance": _provenance(spec),
        }
        if lock.lost:
            log.warning("job %s lost its lock while running (it was silent longer than the stale bound); an "
                        "identical job may have taken over", key)
        from gac.results.store import record_problem

        problem = record_problem({"key": key, "status": "completed", "created": "", **record}, key)
        if problem:  # what every reader checks: never publish a record a reader would refuse
            raise GacError(f"job {key}: its record {problem}; nothing was written (this is a bug in gac or in a "
                           f"compressor: please report it)")
        try:
            path = store.write_record(key, record, rerun=force)
        except GacError as e:
            if getattr(e, "errno", None) not in DISK_FULL:
                raise
            reserve.release()  # the record first: the reserved space is its last chance
            path = store.write_record(key, record, rerun=force)
        reserve.release()
        try:
            work.save()
        except GacError as e:  # the record is written: a bookkeeping file must not fail the job
            log.warning("could not update %s: %s", work.dir / "attempts.json", e)
        stored = store.read_record(key, path=path)  # exactly what was stored (schema, key, created added)
        mine = (stored.get("attempts") or [{}])[-1]
        if (mine.get("pid"), mine.get("started"), mine.get("host")) != (attempt["pid"], attempt["started"],
                                                                         attempt["host"]):
            log.warning("an identical job wrote the record of %s meanwhile; it was kept, this run's discarded", key)
            stored["skipped"] = True
        stored["_path"] = str(path)
        for lg in loggers:
            lg.log_record(stored)
        return stored
    except BaseException as e:
        reserve.release()  # on a full disk: room for the attempt's outcome and the failure record
        oom = is_out_of_memory(e)
        if oom:  # one line naming the stage, the estimate and the fix (the traceback stays in the failure record)
            e = out_of_memory(e, attempt.get("stage"), spec, estimate[0])
        error = f"{type(e).__name__}: {e}"
        end_attempt("interrupted" if isinstance(e, KeyboardInterrupt) else "failed", error)
        try:
            work.save()
        except Exception as e2:  # noqa: BLE001 - never mask the job's own error
            log.warning("could not update the attempts of %s: %s", key, e2)
        if isinstance(e, KeyboardInterrupt):
            raise
        try:
            store.write_failure(key, {**base, "error": error, "traceback": traceback.format_exc(),
                                      "timings": timings, "memory": _resources(meter, sub_memory, spec),
                                      "attempt": attempt, "provenance": _safe_provenance(spec)})
        except Exception as e2:  # noqa: BLE001 - a full disk must not hide the job's own error
            log.error("could not record the failure of %s (%s): %s", key, error, e2)
        for lg in loggers:
            try:
                lg.log_failure(error)
            except Exception as e2:  # noqa: BLE001 - an event log on a full disk must not hide the job's own error
                log.warning("could not log the failure of %s: %s", key, e2)
        if oom:
            raise e from None
        raise
    finally:
        reserve.release()
        for lg in loggers:
            try:
                lg.finish()
            except Exception as e2:  # noqa: BLE001 - never mask the job's outcome
                log.warning("a logger of %s did not finish: %s", key, e2)


PREPARE_STAGE_TIMINGS = ("calibration_s", "gradients_s", "score_s", "factorize_s", "sensitivity_s")


def _resources(meter, sub_memory: dict, spec: JobSpec) -> dict:
    """The record's ``memory`` block: peak host RSS (and GPU memory on CUDA) per stage, in MiB.

    ``stages`` holds the job's own stages (load, prepare, sweep, evaluate, ppl, tasks, latency) and those measured
    inside prepare / compress (calibration, gradients, score, factorize, sensitivity, plan, apply); each has
    ``peak_rss_mb`` (the highest resident set size while it ran), ``start_rss_mb``, ``end_rss_mb`` and, on a CUDA
    device, ``gpu_peak_mb`` (``torch.cuda.max_memory_allocated``, reset at the stage's start)."""
    stages = {**meter.memory(), **sub_memory}
    out = {"device": spec.device, "peak_rss_mb": meter.peak_mb(), "stages": stages}
    gpu = [v["gpu_peak_mb"] for v in stages.values() if "gpu_peak_mb" in v]
    if gpu:
        out["gpu_peak_mb"] = max(gpu)
    return out


def _safe_provenance(spec):
    try:
        return _provenance(spec)
    except Exception as e:  # never mask the job's own error
        return {"error": str(e)}


def _model_aligned_fraction(model, unit: int) -> float | None:
    """Aligned fraction of an uncompressed model's Linear dims (the baseline row)."""
    from torch import nn

    dims = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            dims += [m.in_features, m.out_features]
    return None if not dims else sum(d % unit == 0 for d in dims) / len(dims)
