"""What a job reads from outside gac, whether it is in this machine's caches, and fetching it there.

Many clusters' compute nodes cannot reach the Hugging Face hub (or PyPI). A job reads: its model (config, tokenizer,
safetensors weights: ``HF_HUB_CACHE``), WikiText-2 for calibration and perplexity (``HF_DATASETS_CACHE``), the lm-eval
tasks' datasets (the same), and gac's fixture builds (``smollm2``, ``gemma3``, ``enwiki``: ``GAC_CACHE``, built from
pinned PyPI wheels, so from the package index, not the hub). :func:`job_inputs` lists them for one job, :func:`inputs_of` for several (a sweep's points);
:meth:`Input.missing` tells from the files alone (no network, no heavy import) what of one is not here, and
:meth:`Input.fetch` downloads it the way the job will read it.

``gac fetch OVERRIDES`` (on a login node, same caches) fetches everything a sweep will read; ``gac fetch --check
OVERRIDES`` names what is missing. A job whose hub is not reachable (an offline node, ``HF_HUB_OFFLINE=1``) checks
the same in its preflight (:func:`check_offline`) and stops before any work with one line that names every missing
input and that command. Each input is fetched from where it comes: a fixture is built wherever the package index is
reachable (the hub is not asked), a model, dataset or task is downloaded where the hub is. A cached file that is empty,
or an index that is not the JSON object it should be, counts as missing, never as here.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gac import hub
from gac.errors import GacError

log = logging.getLogger(__name__)

TASK_FILE_SETS = ("tiny", "enwiki")  # named offline task-file sets: piqa and hellaswag from local files
_SET_TASKS = ("piqa", "hellaswag")


@dataclass(frozen=True)
class Input:
    """One thing a job reads from outside gac. ``kind``: ``model`` (a hub repository: config, tokenizer and, with
    ``weights``, its safetensors), ``dataset`` (a hub dataset ``name`` with its ``config``, the ``split`` read),
    ``task`` (an lm-eval task's data) or ``fixture`` (gac's ``smollm2`` / ``gemma3`` / ``enwiki`` build, from the
    package index)."""

    kind: str
    name: str
    config: str | None = None
    split: str | None = None
    weights: bool = True

    def label(self) -> str:
        if self.kind == "model":
            return f"model {self.name}" + ("" if self.weights else " (config and tokenizer)")
        if self.kind == "dataset":
            return f"dataset {self.name} ({self.config}, {self.split})"
        if self.kind == "task":
            return f"lm-eval task {self.name}"
        return f"gac fixture {self.name}"

    def missing(self) -> str | None:
        """What of it is not in the caches here (one phrase), None when all of it is; ``"unknown"`` when the files
        cannot tell (an lm-eval group, a task built in Python)."""
        if self.kind == "model":
            return model_missing(self.name, self.weights)
        if self.kind == "dataset":
            return None if dataset_cached(self.name, self.config, self.split) else "not in the datasets cache"
        if self.kind == "task":
            from gac.evaluation.tasks import task_dataset_cached

            cached = task_dataset_cached(self.name)
            return "unknown" if cached is None else None if cached else "its dataset is not in the caches"
        return None if _fixture_complete(self.name) else "not built yet"

    def fetch(self) -> None:
        """Download (or build) it into the caches, as the job will read it."""
        if self.kind == "model":
            from huggingface_hub import snapshot_download

            snapshot_download(self.name, allow_patterns=MODEL_FILES if self.weights else MODEL_FILES_NO_WEIGHTS)
        elif self.kind == "dataset":
            import datasets

            datasets.load_dataset(self.name, self.config)  # every split, prepared in HF_DATASETS_CACHE
        elif self.kind == "task":
            from lm_eval.tasks import get_task_dict

            from gac.evaluation.tasks import task_manager

            get_task_dict([self.name], task_manager=task_manager())  # lm-eval downloads the task's dataset
        else:
            module, _ = _fixture(self.name)
            getattr(module, f"{self.name}_dir")(build_if_missing=True)

    @property
    def from_hub(self) -> bool:
        """Whether it comes from the Hugging Face hub (a fixture comes from the package index)."""
        return self.kind != "fixture"


# what a job loads of a hub model: safetensors only (gac never unpickles .bin / .pth weights), the configs and the
# tokenizer files (tokenizer.json, tokenizer.model, tiktoken / BPE vocabularies)
MODEL_FILES_NO_WEIGHTS = ["*.json", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt"]
MODEL_FILES = [*MODEL_FILES_NO_WEIGHTS, "*.safetensors"]


def cached_shards(repo: str) -> tuple[list[str], list[str]] | None:
    """``(shards the cached index names, those of them that are here)`` for the hub model ``repo``; a model of one
    ``model.safetensors``: that file; None when the model is not in the hub cache."""
    snap = hub.model_snapshot(repo)
    if snap is None:
        return None
    index = snap / "model.safetensors.index.json"
    named = _index_shards(index) if index.exists() else ["model.safetensors"]
    return named, [n for n in named if _nonempty(snap / n)]


def model_missing(repo: str, weights: bool = True) -> str | None:
    """What of the hub model ``repo`` is not in the hub cache (``HF_HUB_CACHE``): the snapshot ``refs/main`` names
    (else any snapshot) must hold ``config.json``, a tokenizer and, with ``weights``, every safetensors shard its index
    lists (a shard half-downloaded is a dangling link there: missing)."""
    snap = hub.model_snapshot(repo)
    if snap is None:
        return "not in the hub cache"
    lacks = []
    if not _nonempty(snap / "config.json"):
        lacks.append("config.json")
    if not any(_nonempty(snap / f) for f in ("tokenizer.json", "tokenizer.model")):
        lacks.append("its tokenizer (tokenizer.json)")
    if weights:
        index = snap / "model.safetensors.index.json"
        if index.exists():
            shards = _index_shards(index)
            gone = [s for s in shards if not _nonempty(snap / s)]
            if not shards:
                lacks.append("a readable model.safetensors.index.json")
            elif gone:
                lacks.append(f"{len(gone)} of {len(shards)} weight shards ({gone[0]}...)")
        elif not _nonempty(snap / "model.safetensors"):
            lacks.append("its weights (model.safetensors)")
    return ", ".join(lacks) or None


def _nonempty(path: Path) -> bool:
    """A cached file that is there: a regular file (links followed) with content; 0 bytes is a download that never
    wrote, not a file."""
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def _index_shards(index: Path) -> list[str]:
    """The shard file names a cached ``model.safetensors.index.json`` lists; none when it is not the JSON object
    with a ``weight_map`` of file names it should be (a list, a hostile nesting, a name with a path in it)."""
    from gac.io import read_json

    try:
        data = read_json(index, "model.safetensors.index.json", max_bytes=64 * 2**20)
    except GacError:
        return []
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        return []
    names = set(weight_map.values())
    if not names or not all(isinstance(n, str) and n and "/" not in n and "\\" not in n and n not in (".", "..")
                            for n in names):
        return []
    return sorted(names)


def dataset_cached(name: str, config: str | None, split: str | None) -> bool:
    """Whether the hub dataset ``name`` (``config``, ``split``) is here as the datasets library reads it offline:
    its prepared split in ``HF_DATASETS_CACHE`` (``<org>___<name>/<config>/.../*-<split>*.arrow``), or the split's
    files in the hub cache's snapshot."""
    split = split or ""
    prepared = hub.prepared_dataset_dir(name) / (config or "")
    if prepared.is_dir() and any(_nonempty(p) for p in prepared.rglob(f"*-{split}*.arrow")):
        return True
    snaps = hub.snapshots_dir(name, "dataset")
    return snaps.is_dir() and any(_nonempty(p) for p in snaps.glob(f"*/{config or '*'}/{split}-*"))


FIXTURE_MODELS = ("smollm2", "gemma3")  # named models built from PyPI wheels (tiny ships with gac)
FIXTURES = (*FIXTURE_MODELS, "enwiki")


def _fixture(name: str):
    """The fixture module and its build folder; a name gac has no build for is a bug, not an enwiki."""
    import importlib

    if name not in FIXTURES:
        raise GacError(f"no gac fixture is named {name!r}; the fixtures built from PyPI are {', '.join(FIXTURES)}")
    module = importlib.import_module(f"gac.fixtures.{name}")
    return module, module.default_dir()


def _fixture_complete(name: str) -> bool:
    module, root = _fixture(name)
    try:
        return bool(module.is_complete(root))
    except RecursionError:  # a provenance nested past Python's parser: not a finished build
        return False


def _source_inputs(source, split: str) -> list[Input]:
    from gac.metrics import ENWIKI_ALIASES, WIKITEXT2_ALIASES
    from gac.text import WIKITEXT2_HUB

    s = str(source)
    if s in WIKITEXT2_ALIASES or s.lower() in WIKITEXT2_ALIASES:
        return [Input("dataset", WIKITEXT2_HUB[0], WIKITEXT2_HUB[1], split)]
    if s in ENWIKI_ALIASES:
        return [Input("fixture", "enwiki")]
    return []  # tiny's text ships with gac; a file is the user's own


def is_hub_model(model_spec) -> bool:
    """Whether ``model_spec`` names a hub model (not a fixture, not a local path; a path that is no model: False)."""
    from gac.fixtures import is_named
    from gac.models import model_kind

    try:
        return not is_named(model_spec) and model_kind(model_spec) == "hub"
    except GacError:
        return False


def job_inputs(spec) -> list[Input]:
    """What the job ``spec`` (a :class:`gac.jobs.config.spec.JobSpec`) reads from outside gac (module docstring)."""
    out: list[Input] = []
    if str(spec.model_spec) in FIXTURE_MODELS:
        out.append(Input("fixture", str(spec.model_spec)))
    elif is_hub_model(spec.model_spec) and not (spec.random_weights and spec.arch):
        out.append(Input("model", str(spec.model_spec), weights=not spec.random_weights))
    source = (spec.calibration or {}).get("source")
    if not spec.is_baseline and source and source != "random":
        out += _source_inputs(source, "train")
    if spec.eval.ppl and spec.ppl_source:
        out += _source_inputs(spec.ppl_source, "test")
    if spec.eval.tasks:
        files = spec.task_files
        local = set(_SET_TASKS) if files in TASK_FILE_SETS else set(files or {}) if isinstance(files, dict) else set()
        if files == "enwiki":
            out.append(Input("fixture", "enwiki"))
        out += [Input("task", t) for t in spec.eval.tasks if t not in local]
    return list(dict.fromkeys(out))


def inputs_of(specs: Iterable) -> list[Input]:
    """What the jobs ``specs`` read, each input once, models first, then datasets, tasks and fixtures."""
    found = dict.fromkeys(i for s in specs for i in job_inputs(s))
    order = {"model": 0, "dataset": 1, "task": 2, "fixture": 3}
    return sorted(found, key=lambda i: (order[i.kind], i.name, i.config or "", i.split or ""))


def missing_inputs(inputs: Iterable[Input]) -> list[tuple[Input, str]]:
    """The inputs that are not (all) here, each with what is missing; ``unknown`` ones are left out."""
    return [(i, m) for i in inputs for m in [i.missing()] if m and m != "unknown"]


_NOT_INPUTS = ("results_dir", "save_model", "force", "on_busy", "quiet", "verbose", "sweep", "logger")


def fetch_command(overrides: Sequence[str]) -> str:
    """``gac fetch`` with the job's or sweep's overrides, shell-quoted; Hydra's own, the launcher's and those that
    change no input (where results go, logging) are left out."""
    def key(o: str) -> str:
        return o.lstrip("+~").split("=", 1)[0].split(".", 1)[0]

    keep = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/")) and key(o) not in _NOT_INPUTS]
    return " ".join(["gac fetch", *(shlex.quote(o) for o in keep)])


def describe_missing(missing: Sequence[tuple[Input, str]]) -> str:
    return "; ".join(f"{i.label()}: {m}" for i, m in missing)


def check_offline(spec, overrides: Sequence[str] = ()) -> None:
    """Every input of the job ``spec`` is in the caches, or the hub is reachable from here to download it: else one
    :class:`GacError` naming each missing input and the command that fetches them (``gac fetch`` with the job's
    overrides, on a machine that reaches the hub and shares these caches). The caches are looked at first; the hub
    is asked only when something is missing."""
    # a missing fixture is built by the job from the package index, wherever that is reachable: not the hub's concern
    missing = [(i, m) for i, m in missing_inputs(job_inputs(spec)) if i.from_hub]
    if not missing:
        return
    why = hub.hub_unreachable()
    if why is None:
        return
    caches = f"HF_HUB_CACHE={hub.hub_cache_dir()}, HF_DATASETS_CACHE={hub.datasets_cache_dir()}"
    raise GacError(f"the hub is not reachable here ({why}) and the caches lack what this job reads: "
                   f"{describe_missing(missing)}; fetch them where the hub is reachable (a login node) into the same "
                   f"caches ({caches}): {fetch_command(overrides)}")


def check_sweep_offline(specs: Iterable, overrides: Sequence[str]) -> None:
    """Before a Slurm sweep is submitted with ``HF_HUB_OFFLINE`` (or ``HF_DATASETS_OFFLINE``) set, which its jobs
    get: they will read the caches only, so every input of every point must be there now, not found missing by each
    job after its wait in the queue. A :class:`GacError` names what is missing and the fetch command."""
    offline = hub.offline_set()
    if not offline:
        return
    missing = missing_inputs(inputs_of(specs))
    if missing:
        where = ("the hub is reachable and without " + offline[0] if any(i.from_hub for i, _ in missing) else
                 "the package index is reachable (gac's fixtures are built from PyPI wheels)")
        raise GacError(f"{offline[0]} is set, so the jobs will read only the caches, which lack: "
                       f"{describe_missing(missing)}; fetch them first, where {where}: {fetch_command(overrides)}")


def caches() -> dict[str, Path]:
    """Where the fetched inputs go: the hub cache, the datasets cache and gac's cache."""
    from gac.fixtures import cache_root

    return {"HF_HUB_CACHE": hub.hub_cache_dir(), "HF_DATASETS_CACHE": hub.datasets_cache_dir(),
            "GAC_CACHE": cache_root()}
