"""What a job is: :class:`JobSpec` (with its :class:`EvalSpec`) and the record key derived from it.

:class:`EvalSpec` is also the ``eval`` group of the typed config (:mod:`gac.jobs.config.schema`): one dataclass, so the
config's defaults and the spec's cannot drift apart. Its annotations use :mod:`typing` because OmegaConf reads
them at runtime.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Tuple  # noqa: UP035 - OmegaConf reads these annotations at runtime

from gac.align.candidates import DEFAULT_UNIT, DEFAULT_WINDOW
from gac.evaluation.suite import DECODE_PROMPT, EVAL_BATCH_SIZE
from gac.registry import BASELINE, BASELINE_STRATEGY, DEFAULT_KNAPSACK_SCORE
from gac.results import config_key
from gac.text import CALIBRATION_SAMPLES, CALIBRATION_SEQ_LEN, CALIBRATION_SOURCE


@dataclass
class EvalSpec:
    ppl: bool = True
    ppl_seq_len: Optional[int] = None  # noqa: UP045 - None: 2048 capped at the model's maximum (the papers' protocol)
    ppl_max_windows: Optional[int] = None  # noqa: UP045 - None: the whole test text
    # None: non-overlapping windows (the papers' protocol); a number of tokens: sliding windows starting every stride
    # tokens (the GAC authors' script: 1024 with 2048-token windows), gac.evaluation.perplexity
    ppl_stride: Optional[int] = None  # noqa: UP045
    tasks: Tuple[str, ...] = ("piqa", "hellaswag")  # noqa: UP006
    limit: Optional[int] = 200  # noqa: UP045
    batch_size: int = EVAL_BATCH_SIZE
    latency: bool = True
    latency_batch: int = 1
    latency_seq_lens: Tuple[int, ...] = (1024,)  # noqa: UP006
    latency_batches: Tuple[Any, ...] = ()  # noqa: UP006 - ((batch, seq_len), ...)
    decode_tokens: int = 0
    decode_prompt: int = DECODE_PROMPT  # the prompt before the decode steps (tokens)
    warmup: Optional[int] = None  # noqa: UP045
    iters: Optional[int] = None  # noqa: UP045
    trials: Optional[int] = None  # noqa: UP045
    engine: str = "torch"  # what runs the timed prefill (gac.engines: torch, onnxruntime, llama.cpp)


@dataclass
class JobSpec:
    model_name: str
    model_spec: str
    compressor: str
    strategy: str = "gac"
    ratio: float = 0.15
    unit: int = DEFAULT_UNIT
    window: int = DEFAULT_WINDOW
    use_profile: bool = True
    knapsack_score: str = DEFAULT_KNAPSACK_SCORE  # s_i of Eq. 4: "marginal" (the error per parameter) or "proxy"
    proxy: str | None = None
    compressor_options: dict = field(default_factory=dict)
    allocation: str = "default"  # "default": the compressor's own rule (its reference's); else see gac.compression.allocation
    calibration: dict = field(default_factory=lambda: {"source": CALIBRATION_SOURCE, "n_samples": CALIBRATION_SAMPLES,
                                                       "seq_len": CALIBRATION_SEQ_LEN})
    dtype: str | None = None  # None: the model's own (a config's `own`, gac.dtypes.OWN)
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
    device_map: str = "single"  # "auto": the model spread over several devices (gac.models.placement)
    max_memory: dict | None = None  # with device_map=auto: {device: size} limits (gac.models.placement)
    offload_dir: str | None = None  # with device_map=auto: where units on disk keep their weights (not in the key)
    experiment: str = "default"
    sweep: str | None = None
    #: a latency-budget plan's settings (strategy gac_latency, :mod:`gac.jobs.run.latency_plan`): budget_kind, budget_ms,
    #: budget (a share of the unaligned plan's latency), source; None for every other strategy (and out of the key)
    latency: dict | None = None

    @property
    def is_baseline(self) -> bool:
        return self.compressor == BASELINE

    def identity(self) -> dict:
        """What determines the result (labels such as experiment/sweep excluded); the baseline ignores
        compression-only settings, so every sweep shares one baseline record per model, GPU and evaluation."""
        d = asdict(self)
        for k in ("experiment", "sweep", "offload_dir"):
            d.pop(k)
        if self.eval.ppl_stride is None:  # the default protocol: the keys of jobs that never set a stride stay theirs
            d["eval"].pop("ppl_stride")
        if self.eval.decode_prompt == DECODE_PROMPT:  # the prompt every decode used before it was a setting
            d["eval"].pop("decode_prompt")
        if self.eval.engine == "torch":  # PyTorch eager, what every latency measured before engines: keys unchanged
            d["eval"].pop("engine")
        if self.device_map == "single":  # the default placement leaves the key as it was before placements existed
            d.pop("device_map")
            d.pop("max_memory")
        if self.latency is None:  # the keys of the jobs that plan by parameters stay as they were
            d.pop("latency")
        if d["compressor_options"].get("expert_width") == "shared":  # LLM-Pruner's default: keys from before it stay
            d["compressor_options"] = {k: v for k, v in d["compressor_options"].items() if k != "expert_width"}
        if self.is_baseline:
            for k in ("strategy", "ratio", "unit", "window", "use_profile", "knapsack_score", "proxy", "compressor_options",
                      "allocation", "calibration", "latency"):
                d.pop(k, None)
        return d

    @property
    def key(self) -> str:
        return config_key(self.identity())

    def job_fields(self) -> dict:
        return {
            "model": self.model_name, "compressor": self.compressor,
            "proxy": None if self.is_baseline else (self.proxy or default_proxy(self.compressor)),
            "strategy": BASELINE_STRATEGY if self.is_baseline else self.strategy,
            "ratio": None if self.is_baseline else self.ratio, "unit": None if self.is_baseline else self.unit,
            "gpu": self.gpu, "seq_len": self.seq_len, "experiment": self.experiment, "sweep": self.sweep,
        }


def default_proxy(compressor: str) -> str:
    """The importance proxy ``compressor`` uses when the job names none."""
    from gac.compression.compressors import COMPRESSORS, canonical_name

    return COMPRESSORS[canonical_name(compressor)].default_proxy


def task_files_of(task_files) -> dict | None:
    """``model.task_files`` as ``{task: path}``: None for the hub, a named set's files, or the mapping given."""
    from gac.errors import GacError

    if task_files in (None, "hub"):
        return None
    if task_files in ("tiny", "enwiki"):
        from gac.fixtures import task_files_of as named

        return {k: str(v) for k, v in named(task_files).items()}
    if isinstance(task_files, dict):
        return dict(task_files)
    raise GacError(f"model.task_files must be null, 'tiny', 'enwiki' or a {{task: path}} mapping, got {task_files!r}")


@dataclass(frozen=True)
class RunOptions:
    """How a job runs, beside what it computes (:class:`JobSpec`; never part of its key): the results store, whether
    a done job runs again, what an identical running job makes it do, where its checkpoint goes, its W&B logger, the
    command line's overrides. Built by :func:`gac.jobs.config.build.job_from_config` from the config the schema checked
    (:class:`gac.jobs.config.schema.GacConfig`'s defaults are the only defaults)."""

    results_dir: str
    force: bool
    on_busy: str
    save_model: str | None
    wandb: dict | None
    quiet: bool | None
    verbose: bool
    overrides: tuple = ()


@dataclass
class Job:
    """One job, checked once: what it computes (``spec``), how it runs (``run``) and the resolved config its record
    keeps (``config``). Every entry point that runs a job builds one (:func:`gac.jobs.config.build.job_from_config`)."""

    spec: JobSpec
    run: RunOptions
    config: dict
