"""The job config's types: dataclasses registered in Hydra's ConfigStore as ``gac_schema``.

``conf/config.yaml`` lists ``gac_schema`` first in its defaults, so Hydra itself checks every value's type and every
key of a group (``align.window=abc`` or a typo'd key in a group file fail at composition, the file or override named).
:func:`validate_config` applies the same schema to a plain dict (tests and notebooks build configs by hand) and turns
OmegaConf's error into one :class:`~gac.errors.GacError` line with close matches. Ranges and names (ratio in (0, 1),
known compressors, strategies, tasks...) are checked by :func:`gac.jobs.config.build.spec_from_config`, which applies this
schema first; the ``eval`` group is the job's own :class:`~gac.jobs.config.spec.EvalSpec`.

The top level is open (``+my_label=...`` adds a key); groups are closed (an unknown key is a typo).
"""

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional  # noqa: UP035 - OmegaConf reads these annotations at runtime

from omegaconf import MISSING

from gac.align.candidates import DEFAULT_UNIT, DEFAULT_WINDOW
from gac.errors import GacError
from gac.jobs.config.spec import EvalSpec
from gac.registry import DEFAULT_KNAPSACK_SCORE
from gac.text import CALIBRATION_SAMPLES, CALIBRATION_SEQ_LEN, CALIBRATION_SOURCE

SCHEMA_NAME = "gac_schema"


@dataclass
class ModelConfig:
    name: str = MISSING
    spec: str = MISSING
    dtype: Optional[str] = None  # noqa: UP045
    random_weights: bool = False
    arch: Optional[Dict[str, Any]] = None  # noqa: UP006, UP045
    calibration_source: str = CALIBRATION_SOURCE
    calibration_seq_len: int = CALIBRATION_SEQ_LEN
    ppl_source: Optional[str] = None  # noqa: UP045
    task_files: Any = None  # "tiny", "enwiki", null (the hub) or {task: path}
    device_map: str = "single"  # "auto": spread over the GPUs (and cpu/disk named in max_memory); gac.models.placement
    max_memory: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006 - {N (cuda:N) | cpu | disk: size}, device_map=auto
    offload_dir: Optional[str] = None  # noqa: UP045 - where units placed on disk keep their weights (null: a temp dir)


@dataclass
class CompressorConfig:
    name: str = MISSING
    options: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006 - checked by the compressor itself


@dataclass
class ProxyConfig:
    name: Optional[str] = None  # noqa: UP045 - null: the compressor's own proxy


@dataclass
class AlignConfig:
    strategy: str = "gac"
    unit: Any = DEFAULT_UNIT  # a multiple of 8, or an engine's unit (llama.cpp:q4_K): gac.align.candidates.resolve_unit
    window: int = DEFAULT_WINDOW  # the conf/align files leave it to this default
    use_profile: bool = True
    knapsack_score: str = DEFAULT_KNAPSACK_SCORE
    # align=gac_latency only (conf/align/gac_latency.yaml; gac.jobs.run.latency_plan): null for every other strategy
    budget_kind: Optional[str] = None  # noqa: UP045 - latency | min_latency
    latency_budget_ms: Optional[float] = None  # noqa: UP045 - the prefill's latency budget in ms
    latency_budget: Optional[float] = None  # noqa: UP045 - the budget as a share of the reference plan's latency
    latency_reference: Optional[str] = None  # noqa: UP045 - unaligned | gac: the plan latency_budget is a share of
    latency_source: Optional[str] = None  # noqa: UP045 - measured | predicted


@dataclass
class GpuConfig:
    name: str = "cpu"
    device: str = "cpu"
    dtype: Optional[str] = None  # noqa: UP045
    profile: str = "none"
    allow_profile_mismatch: bool = False


@dataclass
class WandbConfig:
    project: str = "gac"
    entity: Optional[str] = None  # noqa: UP045
    mode: str = "offline"
    tags: List[str] = field(default_factory=list)  # noqa: UP006


@dataclass
class LoggerConfig:
    wandb: Optional[WandbConfig] = None  # noqa: UP045 - null: the disk logger only


@dataclass
class CalibrationConfig:
    source: str = CALIBRATION_SOURCE
    n_samples: int = CALIBRATION_SAMPLES
    seq_len: int = CALIBRATION_SEQ_LEN
    seed: Optional[int] = None  # noqa: UP045 - null: the job's seed


@dataclass
class BenchConfig:
    after_sweep: bool = False
    overrides: List[str] = field(default_factory=list)  # noqa: UP006


@dataclass
class GacConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    compressor: CompressorConfig = field(default_factory=CompressorConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    align: AlignConfig = field(default_factory=AlignConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    eval: EvalSpec = field(default_factory=EvalSpec)  # one dataclass for the config group and the job
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    ratio: float = 0.15
    seq_len: int = 1024
    seed: int = 0
    allocation: str = "default"
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    results_dir: str = "results"
    force: bool = False
    quiet: bool = False
    verbose: bool = False
    on_busy: str = "wait"
    experiment_name: str = "default"
    sweep: Optional[str] = None  # noqa: UP045
    save_model: Optional[str] = None  # noqa: UP045
    bench: BenchConfig = field(default_factory=BenchConfig)


SLURM_LAUNCHER = "gac_slurm"
#: what a Slurm job gets from the launching shell (when set there), through a file only the user reads
#: (gac.launch.slurm): the caches, the hub token and endpoint, offline mode, the proxies and CA bundles, gac's own
#: settings and W&B's; ``PREFIX*`` is every variable set with that prefix
JOB_ENV = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "GAC_CACHE", "XDG_CACHE_HOME", "HF_TOKEN", "HF_TOKEN_PATH",
           "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY",
           "https_proxy", "http_proxy", "no_proxy", "all_proxy", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
           "CURL_CA_BUNDLE", "GAC_*", "WANDB_*")

try:  # hydra-submitit-launcher is a dependency; without it there are no Slurm launchers to type
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf as _SlurmQueueConf
except ImportError:  # pragma: no cover
    _SlurmQueueConf = None

if _SlurmQueueConf is not None:
    @dataclass
    class GacSlurmConf(_SlurmQueueConf):
        """gac's Slurm launcher settings (``hydra/launcher: gac_slurm``, which ``conf/hydra/launcher/slurm_*.yaml``
        extend): hydra-submitit's ``submitit_slurm`` plus ``wait`` (the launching process waits for the end-of-sweep
        job and prints its report; false: it returns once submitted), ``env`` (:data:`JOB_ENV`) and ``end_gpu``
        (whether the end-of-sweep job asks for the array's GPU; null: only when it benches, true: always, for a
        partition that refuses jobs without one)."""

        _target_: str = "hydra_plugins.gac_launcher.gac_launcher.GacSlurmLauncher"  # gac.launch.slurm.SlurmLauncher
        wait: bool = True
        env: List[str] = field(default_factory=lambda: list(JOB_ENV))  # noqa: UP006
        end_gpu: Optional[bool] = None  # noqa: UP045 - the end-of-sweep job asks for the array's GPU: null, only to bench


def register() -> None:
    """Put the schema in Hydra's ConfigStore (idempotent); ``conf/config.yaml`` composes it first. Also the settings
    of gac's Slurm launcher (:class:`GacSlurmConf`); the launcher's class is registered by the apps that launch
    (:func:`gac.commands.hydra_apps.register_launcher`)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=GacConfig)
    if _SlurmQueueConf is not None:
        ConfigStore.instance().store(group="hydra/launcher", name=SLURM_LAUNCHER, node=GacSlurmConf, provider="gac")


def schema():
    """The schema as an OmegaConf node (open: unknown keys are :func:`validate_config`'s own check)."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(GacConfig)
    OmegaConf.set_struct(node, False)
    return node


def validate_config(cfg: dict) -> dict:
    """``cfg`` (a resolved config as a plain dict) checked against the schema: an unknown key in a group (``align``,
    ``eval``, ``logger.wandb``...) or a value of the wrong type raises one :class:`GacError` line naming the key (with
    close matches); returns the dict with values converted as OmegaConf does (``"8"`` -> 8 for an int field)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _check_keys(cfg, GacConfig, "", top=True)
    try:
        merged = OmegaConf.merge(schema(), cfg)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        text = str(getattr(e, "msg", "") or str(e)).strip().splitlines()[0]
        raise GacError(f"config: {key}: {text}" if key else f"config: {text}") from None
    try:
        out = OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        raise GacError(f"config: missing key {key!r} (a required value; set it or pick a {key.split('.')[0]} "
                       f"config)") from None
    return out


def _check_keys(d, cls, prefix: str, top: bool = False) -> None:
    import difflib

    if not isinstance(d, dict):
        return
    known = {f.name: f for f in fields(cls)}
    for k, v in d.items():
        path = f"{prefix}{k}"
        f = known.get(k)
        if f is None:
            if top:
                continue  # the top level is open: labels and +new keys are the user's
            close = difflib.get_close_matches(str(k), list(known), n=3, cutoff=0.5)
            parent = prefix.rstrip(".")
            hint = f"; did you mean {' or '.join(repr(f'{parent}.{c}') for c in close)}?" if close else ""
            raise GacError(f"config: unknown key {path!r}{hint} (known under {parent!r}: {', '.join(sorted(known))})")
        inner = _dataclass_of(f)
        if inner is not None:
            _check_keys(v, inner, f"{path}.")


def _dataclass_of(f):
    t = f.type
    for cand in (t, *getattr(t, "__args__", ())):
        if hasattr(cand, "__dataclass_fields__"):
            return cand
    return None
