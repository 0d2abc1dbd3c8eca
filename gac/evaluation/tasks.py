"""Zero-shot PiQA and HellaSwag through ``lm_eval.simple_evaluate`` on an in-memory model.

The prompts and metrics are lm-eval's OFFICIAL task configs, unchanged. With the hub, the tasks load their datasets
(``baber/piqa``, ``Rowan/hellaswag``) as lm-eval does. Offline, ``local_files={"piqa": "piqa.jsonl", ...}`` runs the
same configs on local files: a generated YAML ``include:``-s the official one and only swaps the data source
(``dataset_path: json``, the file as its validation split), so prompt, choices, processing and metrics stay lm-eval's.

PiQA rows: ``goal``, ``sol1``, ``sol2``, ``label`` (the integer 0 or 1). HellaSwag rows: ``activity_label``, ``ctx_a``,
``ctx_b``, ``endings`` (exactly 4 strings), ``label`` ("0".."3" or 0..3). Local files are checked row by row against
this schema before anything is evaluated (:func:`check_local_file`). ``limit`` takes the first ``limit`` rows of the evaluation split (the
paper uses 200).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from gac.errors import GacError, unknown_name

log = logging.getLogger(__name__)

# official lm-eval task name -> (config file inside lm_eval/tasks, required fields of a local row)
TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "piqa": ("piqa/piqa.yaml", ("goal", "sol1", "sol2", "label")),
    "hellaswag": ("hellaswag/hellaswag.yaml", ("activity_label", "ctx_a", "ctx_b", "endings", "label")),
}
LOCAL_PREFIX = "gac_local_"


def parse_tasks(tasks: str | Iterable[str]) -> list[str]:
    """Task names from ``"piqa,hellaswag"`` or a list, checked (unknown names get close-match suggestions)."""
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks)]
    names = [t.lower() if t.lower() in TASKS else t for t in names if t]
    if not names:
        raise GacError(f"no task given; choose from {', '.join(TASKS)}")
    for t in names:
        if t not in TASKS:
            raise unknown_name("task", t, TASKS)
    return list(dict.fromkeys(names))


def official_config(task: str) -> Path:
    """The path of lm-eval's own YAML for ``task``."""
    import lm_eval

    return Path(lm_eval.__file__).resolve().parent / "tasks" / TASKS[task][0]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_piqa(row: dict) -> str | None:
    for k in ("goal", "sol1", "sol2"):
        if not isinstance(row[k], str):
            return f"{k} must be a string, got {row[k]!r}"
    if not _is_int(row["label"]) or row["label"] not in (0, 1):
        return f"label must be the integer 0 or 1 (the index of the correct solution), got {row['label']!r}"
    return None


def _check_hellaswag(row: dict) -> str | None:
    for k in ("activity_label", "ctx_a", "ctx_b"):
        if not isinstance(row[k], str):
            return f"{k} must be a string, got {row[k]!r}"
    e = row["endings"]
    if not isinstance(e, list) or len(e) != 4 or not all(isinstance(x, str) for x in e):
        n = len(e) if isinstance(e, list) else type(e).__name__
        return f"endings must be a list of exactly 4 strings (HellaSwag is 4-way), got {n}"
    label = row["label"]
    ok = (_is_int(label) and 0 <= label <= 3) or (isinstance(label, str) and label in ("0", "1", "2", "3"))
    if not ok:
        return f'label must be 0..3 (or "0".."3"), the index of the correct ending, got {label!r}'
    return None


# what lm-eval's official config needs of every row (checked before any evaluation: a bad row would otherwise be
# scored as wrong, or change the chance level, with exit code 0)
ROW_CHECKS = {"piqa": _check_piqa, "hellaswag": _check_hellaswag}


def check_local_file(task: str, path: str | os.PathLike) -> Path:
    """``path`` exists, is non-empty JSONL, and every row matches the task's schema (fields, types, the number of
    choices, the label's range); the first bad row is named with its line number."""
    path = Path(path).expanduser().resolve()
    fields = TASKS[task][1]
    if not path.is_file():
        raise GacError(f"{task} file {path} does not exist; pass a JSONL file with fields {', '.join(fields)}")
    n = 0
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # JSONL: newline only (U+2028 may sit in a string)
    except (OSError, UnicodeDecodeError) as e:
        raise GacError(f"cannot read the {task} file {path}: {e}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise GacError(f"{path}:{i} is not valid JSON ({e.msg}); {task} files are JSONL, one row per line") from None
        missing = [k for k in fields if not isinstance(row, dict) or k not in row]
        if missing:
            raise GacError(f"{path}:{i} lacks {', '.join(missing)}; {task} rows need {', '.join(fields)}")
        problem = ROW_CHECKS[task](row)
        if problem:
            raise GacError(f"{path}:{i}: {problem}; fix the row (or drop it) and run again")
        n += 1
    if n == 0:
        raise GacError(f"{task} file {path} is empty; it needs at least one JSONL row with {', '.join(fields)}")
    return path


def write_local_configs(local_files: Mapping[str, str | os.PathLike], directory: str | os.PathLike) -> dict[str, str]:
    """Write one YAML per task into ``directory`` that includes the official config and reads a local file.

    Returns ``{task: local task name}``.
    """
    directory = Path(directory)
    names = {}
    for task, path in local_files.items():
        if task not in TASKS:
            raise unknown_name("task", task, TASKS)
        path = check_local_file(task, path)
        name = f"{LOCAL_PREFIX}{task}"
        # JSON is valid YAML: no quoting surprises in paths
        cfg = {
            "include": str(official_config(task)),
            "task": name,
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {"validation": str(path)}},
            "training_split": None,
            "validation_split": "validation",
            "test_split": None,
        }
        (directory / f"{name}.yaml").write_text(json.dumps(cfg, indent=2) + "\n")
        names[task] = name
    return names


@contextlib.contextmanager
def _offline():
    """No hub while local files load: the env vars (for a first import) and the already-imported flags, restored after.

    Without this, ``datasets`` makes a network round trip (a DNS lookup, or a timeout) per local JSON load.
    """
    import sys

    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    flags = []
    for mod, attr in (("datasets.config", "HF_HUB_OFFLINE"), ("huggingface_hub.constants", "HF_HUB_OFFLINE")):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, attr):
            flags.append((m, attr, getattr(m, attr)))
            setattr(m, attr, True)
    try:
        yield
    finally:
        for m, attr, old in flags:
            setattr(m, attr, old)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def evaluate_tasks(model, tokenizer, tasks: str | Iterable[str] = ("piqa", "hellaswag"), limit: int | None = 200,
                   local_files: Mapping[str, str | os.PathLike] | None = None, batch_size: int = 16,
                   device: str | None = None, num_fewshot: int = 0, bootstrap_iters: int = 100_000,
                   seed: int = 1234, log_samples: bool = False) -> dict:
    """Zero-shot accuracy of an in-memory model on lm-eval's official PiQA / HellaSwag.

    ``local_files`` maps task names to local JSONL files (the offline variant); tasks not in it load from the hub.
    Returns ``{task: {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "n", "source", "version"[, "samples"]}}``
    (stderr is the standard error of the mean over items).
    """
    names = parse_tasks(tasks)
    local_files = dict(local_files or {})
    unused = [t for t in local_files if t not in names]
    for t in unused:
        if t not in TASKS:
            raise unknown_name("task", t, TASKS)
    local_files = {t: p for t, p in local_files.items() if t in names}
    if limit is not None and int(limit) < 1:
        raise GacError(f"limit={limit}; use a positive number of items (the paper uses 200) or None for all")
    with _offline() if local_files and len(local_files) == len(names) else contextlib.nullcontext():
        return _run(model, tokenizer, names, limit, local_files, batch_size, device, num_fewshot, bootstrap_iters,
                    seed, log_samples)


def _run(model, tokenizer, names, limit, local_files, batch_size, device, num_fewshot, bootstrap_iters, seed,
         log_samples) -> dict:
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="gac-tasks-") as tmp:
        local_names = write_local_configs(local_files, tmp)
        hub = [t for t in names if t not in local_names]
        tm = TaskManager(include_path=tmp if local_names else None, include_defaults=bool(hub))
        run_names = [local_names.get(t, t) for t in names]
        try:
            loaded = tm.load(run_names)["tasks"]
        except Exception as e:  # the datasets library raises many kinds when the hub is unreachable
            where = ("the hub: " + ", ".join(hub)) if hub else "local files"
            raise GacError(
                f"could not load the task data from {where} ({type(e).__name__}: {str(e).strip()[:300]}); without "
                f"the hub, pass local JSONL files (`--task-file piqa=/path/piqa.jsonl`, or local_files={{...}} in "
                f"Python); `gac evaluate tiny` uses the shipped ones"
            ) from None
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
        res = lm_eval.simple_evaluate(
            model=lm, tasks=[loaded[n] for n in run_names], num_fewshot=num_fewshot, limit=limit,
            bootstrap_iters=bootstrap_iters, log_samples=log_samples, random_seed=seed, numpy_random_seed=seed,
            torch_random_seed=seed, fewshot_random_seed=seed,
        )
    out = {}
    for task, name in zip(names, run_names, strict=True):
        r = res["results"][name]
        n = res.get("n-samples", {}).get(name, {}).get("effective")
        row = {
            "acc": float(r["acc,none"]),
            "acc_stderr": _num(r.get("acc_stderr,none")),
            "acc_norm": float(r["acc_norm,none"]),
            "acc_norm_stderr": _num(r.get("acc_norm_stderr,none")),
            "n": int(n) if n is not None else None,
            "source": str(local_files[task]) if task in local_files else "hub",
            "version": res.get("versions", {}).get(name),
            "num_fewshot": num_fewshot,
            "limit": limit,
        }
        if log_samples:
            row["samples"] = res["samples"][name]
        out[task] = row
        log.info("%s: acc %.4f (+-%.4f) acc_norm %.4f over %s items", task, row["acc"], row["acc_stderr"] or 0.0,
                 row["acc_norm"], row["n"])
    return out


def _num(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None
