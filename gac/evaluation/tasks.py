"""Any lm-eval task, zero-shot by default, through ``lm_eval.simple_evaluate`` on an in-memory model.

The prompts and metrics are lm-eval's OFFICIAL task configs, unchanged. A task is named as lm-eval names it (a task,
a group such as ``mmlu`` or a tag); names are checked against lm-eval's task registry
(``lm_eval.tasks.TaskManager``) before any model is loaded, with close-match suggestions for a typo
(:func:`check_task_names`). With the hub, the tasks load their datasets as lm-eval does. Offline,
``local_files={"piqa": "piqa.jsonl", ...}`` runs the same configs on local files: a generated YAML ``include:``-s
the official one and only swaps the data source (``dataset_path: json``, the file as the split the task evaluates
on), so prompt, choices, processing and metrics stay lm-eval's.

Results: flat metrics named ``<task>_<metric>`` (filter ``none``) or ``<task>_<metric>_<filter>``
(:func:`gac.metrics.task_metric`), and lm-eval's own layout beside them (``results`` task -> ``"metric,filter"``,
``versions``, ``n-samples``, ``higher_is_better``, the configs' key fields), see :func:`evaluate_tasks`.

PiQA rows: ``goal``, ``sol1``, ``sol2``, ``label`` (the integer 0 or 1). HellaSwag rows: ``activity_label``, ``ctx_a``,
``ctx_b``, ``endings`` (exactly 4 strings), ``label`` ("0".."3" or 0..3). Local files are checked row by row against
this schema before anything is evaluated (:func:`check_local_file`). ``limit`` takes the first ``limit`` rows of the evaluation split (the
paper uses 200).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from gac.errors import GacError
from gac.hub import offline
from gac.io import file_problem
from gac.metrics import task_metric

log = logging.getLogger(__name__)

# official lm-eval task name -> (config file inside lm_eval/tasks, required fields of a local row)
TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "piqa": ("piqa/piqa.yaml", ("goal", "sol1", "sol2", "label")),
    "hellaswag": ("hellaswag/hellaswag.yaml", ("activity_label", "ctx_a", "ctx_b", "endings", "label")),
}
LOCAL_PREFIX = "gac_local_"


def parse_tasks(tasks: str | Iterable[str], check: bool = True, local: Iterable[str] = ()) -> list[str]:
    """Task names from ``"piqa,hellaswag"`` or a list, de-duplicated; with ``check``, validated against lm-eval's
    registry (:func:`check_task_names`; ``local``: tasks that will run on local files)."""
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks)]
    names = [t.lower() if t.lower() in TASKS else t for t in names if t]
    if not names:
        raise GacError(f"no task given; name lm-eval tasks, e.g. {', '.join(TASKS)}")
    names = list(dict.fromkeys(names))
    if check:
        check_task_names(names, local)
    return names


@functools.lru_cache(maxsize=1)
def _registry():
    """lm-eval's task index (every built-in task, group and tag); built once per process (~6 s)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=True)


def task_manager():
    """lm-eval's task manager as gac builds it (every built-in task, group and tag), one per process."""
    return _registry()


def registry_names() -> list[str]:
    """Every name lm-eval's registry knows (tasks, groups, tags)."""
    return list(_registry().all_tasks)


def check_task_names(names: Iterable[str], local: Iterable[str] = ()) -> None:
    """Every name is a task, group or tag in lm-eval's registry; an unknown one raises :class:`GacError` with
    close matches. The tasks gac knows the configs of (:data:`TASKS`) need no registry lookup (no 6 s index)."""
    todo = [t for t in names if t not in TASKS]
    if not todo:
        return
    known = set(registry_names())
    for t in todo:
        if t not in known:
            close = difflib.get_close_matches(t, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise GacError(f"unknown lm-eval task {t!r}; {hint}({len(known)} tasks, groups and tags are registered: "
                           f"`lm-eval ls tasks` lists them)")


def official_config(task: str) -> Path:
    """The path of lm-eval's own YAML for ``task``."""
    import lm_eval

    if task in TASKS:
        return Path(lm_eval.__file__).resolve().parent / "tasks" / TASKS[task][0]
    entry = _registry().task_index.get(task)
    if entry is None or entry.yaml_path is None:
        raise GacError(f"lm-eval task {task!r} has no YAML config to run on a local file (a group, a tag or a Python "
                       f"task); name its tasks one by one")
    return Path(entry.yaml_path)


def _eval_split(task: str) -> str:
    """The split ``task``'s official config evaluates on (``test_split``, else ``validation_split``)."""
    if task in TASKS:
        return "validation"
    cfg = _registry().task_index[task].cfg or {}
    return str(cfg.get("test_split") or cfg.get("validation_split") or "test")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_piqa(row: dict) -> str | None:
    for k in ("goal", "sol1", "sol2"):
        if not isinstance(row[k], str):
            return f"{k} must be a string, got {row[k]!r}"
    for k in ("sol1", "sol2"):
        if not row[k].strip():
            return f"{k} is empty (PiQA scores the likelihood of each solution's text, an empty one has none)"
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
    if any(not x.strip() for x in e):
        return f"ending {[x.strip() for x in e].index('')} is empty (HellaSwag scores the likelihood of each ending)"
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
    fields = TASKS[task][1] if task in TASKS else ()
    what = file_problem(path)
    if what:
        want = f"fields {', '.join(fields)}" if fields else "the fields of the task's dataset"
        raise GacError(f"{task} file {Path(path).expanduser()} {what}; pass a JSONL file with {want}")
    path = Path(path).expanduser().resolve()
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
        except RecursionError:
            raise GacError(f"{path}:{i} nests its JSON deeper than Python parses; {task} rows are flat objects, fix "
                           f"the row (or drop it)") from None
        if not isinstance(row, dict):
            raise GacError(f"{path}:{i} is a {type(row).__name__}, not a JSON object; {task} files hold one object per "
                           f"line")
        missing = [k for k in fields if k not in row]
        if missing:
            raise GacError(f"{path}:{i} lacks {', '.join(missing)}; {task} rows need {', '.join(fields)}")
        problem = ROW_CHECKS[task](row) if task in ROW_CHECKS else None
        if problem:
            raise GacError(f"{path}:{i}: {problem}; fix the row (or drop it) and run again")
        n += 1
    if n == 0:
        raise GacError(f"{task} file {path} is empty; it needs at least one JSONL row"
                       + (f" with {', '.join(fields)}" if fields else ""))
    return path


#: the text lm-eval scores for an item of a task: its context and its longest choice, joined as its config does
ITEM_TEXT = {
    "piqa": lambda r: (f"Question: {r['goal']}\nAnswer:", max((r["sol1"], r["sol2"]), key=len)),
    "hellaswag": lambda r: (f"{r['activity_label']}: {r['ctx_a']} {r['ctx_b'].capitalize()}",
                            max(r["endings"], key=len)),
}


def check_item_lengths(task: str, path: str | os.PathLike, tokenizer, max_len: int | None,
                       limit: int | None = None) -> None:
    """Every item lm-eval would score from ``path`` (the first ``limit``) fits the model's context: a longer one is
    silently cut to its last ``max_len`` tokens and scored on what is left, after minutes of work. Only the tasks
    of :data:`ITEM_TEXT` are checked (their rows were checked by :func:`check_local_file`)."""
    if task not in ITEM_TEXT or tokenizer is None or not max_len:
        return
    check_local_file(task, path)
    n = 0
    for i, line in enumerate(Path(path).expanduser().read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        if limit is not None and n >= limit:
            return
        n += 1
        ctx, choice = ITEM_TEXT[task](json.loads(line))
        if len(ctx) + len(choice) + 1 <= max_len:  # a token holds at least one character: fits without counting
            continue
        size = len(tokenizer(ctx + " " + choice, add_special_tokens=False, verbose=False)["input_ids"])
        if size > max_len:
            raise GacError(f"{path}:{i}: the {task} item is {size:,} tokens, longer than the model's context "
                           f"({max_len}); it would be scored on a truncated text. Shorten or drop the item")


def write_local_configs(local_files: Mapping[str, str | os.PathLike], directory: str | os.PathLike) -> dict[str, str]:
    """Write one YAML per task into ``directory`` that includes the official config and reads a local file.

    Returns ``{task: local task name}``.
    """
    directory = Path(directory)
    names = {}
    for task, path in local_files.items():
        check_task_names([task])
        path = check_local_file(task, path)
        name = f"{LOCAL_PREFIX}{task}"
        split = _eval_split(task)
        # JSON is valid YAML: no quoting surprises in paths
        cfg = {
            "include": str(official_config(task)),
            "task": name,
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: str(path)}},
            "training_split": None,
            "validation_split": split if split == "validation" else None,
            "test_split": split if split != "validation" else None,
        }
        if task not in TASKS and (_registry().task_index[task].cfg or {}).get("fewshot_split"):
            cfg["fewshot_split"] = None  # the local file holds one split: few-shot examples come from it
        (directory / f"{name}.yaml").write_text(json.dumps(cfg, indent=2) + "\n")
        names[task] = name
    return names


def check_hub_tasks(tasks: Iterable[str], timeout: float = 5.0, via: str = "cli") -> None:
    """Tasks that load their data from the hub (no local file) can: the hub answers here, or the task's dataset is
    in the local Hugging Face cache. Otherwise a :class:`GacError` now, not a minute of retries after the model was
    loaded (or compressed). Tasks whose dataset cannot be told (a group, a Python task) are given the benefit of the
    doubt. ``via``: how the caller's user gives local files, ``"cli"`` (``gac evaluate`` flags) or ``"config"`` (a
    job's ``model.task_files``); the message names those."""
    tasks = list(dict.fromkeys(tasks))
    if not tasks:
        return
    from gac.hub import hub_unreachable

    why = hub_unreachable(timeout)
    if why is None:
        return
    missing = [t for t in tasks if task_dataset_cached(t) is False]
    if missing:
        shipped = set(missing) <= {"piqa", "hellaswag"}  # tiny's (and enwiki's) offline files hold these two
        if via == "config":
            fix = (f"model.task_files={{{missing[0]}: FILE.jsonl}}"
                   + (" (or model.task_files=tiny / enwiki, the shipped offline files)" if shipped else ""))
        else:
            fix = (f"--task-file {missing[0]}=FILE.jsonl"
                   + (" (or --data tiny, the shipped offline piqa/hellaswag files)" if shipped else ""))
        raise GacError(
            f"task(s) {', '.join(missing)} load their data from the Hugging Face hub, which is not reachable here "
            f"({why}), and the dataset is not in the local cache; give local JSONL files with {fix}, drop the task, "
            f"or run where the hub is reachable"
        )


def task_dataset_cached(task: str) -> bool | None:
    """Whether ``task``'s dataset is in the local Hugging Face caches (None: its dataset cannot be told)."""
    try:
        if task in TASKS:
            text = official_config(task).read_text()
            import re

            m = re.search(r"^dataset_path:\s*(\S+)", text, re.M)
            path = m.group(1).strip("'\"") if m else None
        else:
            entry = _registry().task_index.get(task)
            cfg = getattr(entry, "cfg", None) or {}
            path = cfg.get("dataset_path") if isinstance(cfg, dict) else None
    except Exception:  # noqa: BLE001 - a group or a task lm-eval builds in Python: cannot tell
        return None
    if not path:
        return None
    from gac.hub import hub_dataset_cached

    return hub_dataset_cached(path)


def evaluate_tasks(model, tokenizer, tasks: str | Iterable[str] = ("piqa", "hellaswag"), limit: int | None = 200,
                   local_files: Mapping[str, str | os.PathLike] | None = None, batch_size: int = 16,
                   device: str | None = None, num_fewshot: int = 0, bootstrap_iters: int = 100_000,
                   seed: int = 1234, log_samples: bool = False, layout: bool = False) -> dict:
    """Zero-shot (or ``num_fewshot``) scores of an in-memory model on lm-eval tasks, by their registry names.

    ``local_files`` maps task names to local JSONL files (the offline variant); tasks not in it load from the hub.
    Returns ``{task: row}``, one row per evaluated task (a group's subtasks each get one): ``metrics`` (lm-eval's
    ``"metric,filter"`` as ``metric`` for filter ``none``, else ``metric_filter``; ``*_stderr`` is the standard error
    of the mean over items), the same keys flat at the top for filter ``none`` (``acc``, ``acc_stderr``, ``acc_norm``,
    ...), ``n``, ``source``, ``version``, ``num_fewshot``, ``limit`` (and ``samples``). With ``layout``:
    ``{"tasks": rows, "metrics": {<task>_<metric>: value}, "lm_eval": lm-eval's own layout}`` where the layout is
    ``results`` (task -> ``{"metric,filter": value, "alias"}``), ``groups``, ``group_subtasks``, ``versions``,
    ``n-samples``, ``higher_is_better``, ``configs`` (task -> num_fewshot, output_type, metric_list, dataset),
    ``sources`` (task -> ``"hub"`` or the local file); local tasks appear under their own names.
    """
    local_files = dict(local_files or {})
    names = parse_tasks(tasks, local=local_files)
    unused = [t for t in local_files if t not in names]
    check_task_names(unused)
    local_files = {t: p for t, p in local_files.items() if t in names}
    if limit is not None and int(limit) < 1:
        raise GacError(f"limit={limit}; use a positive number of items (the paper uses 200) or None for all")
    from gac.evaluation.perplexity import model_max_length

    for t, p in local_files.items():
        check_item_lengths(t, p, tokenizer, model_max_length(model), limit)
    with offline() if local_files and len(local_files) == len(names) else contextlib.nullcontext():
        res, run_names = _run(model, tokenizer, names, limit, local_files, batch_size, device, num_fewshot,
                              bootstrap_iters, seed, log_samples)
    back = {run: task for task, run in run_names.items()}  # gac_local_piqa -> piqa
    lm_layout = _layout(res, back, {t: str(local_files[t]) if t in local_files else "hub" for t in names})
    rows, flat = {}, {}
    groups = set(lm_layout["groups"])
    for task, r in lm_layout["results"].items():
        if task in groups:
            continue
        row_metrics = {}
        for key, value in r.items():
            name = task_metric("", key)
            v = _num(value)
            if name is None or v is None:
                continue
            row_metrics[name.lstrip("_")] = v
            flat[task_metric(task, key)] = v
        n = (lm_layout["n-samples"].get(task) or {}).get("effective")
        row = {k: row_metrics[k] for k in _PLAIN if k in row_metrics}
        sources = lm_layout["sources"]
        row.update(metrics=row_metrics, n=int(n) if n is not None else None,
                   source=sources.get(task) or sources.get(_root(task, lm_layout)) or "hub",
                   version=lm_layout["versions"].get(task), num_fewshot=num_fewshot, limit=limit)
        if log_samples:
            row["samples"] = res.get("samples", {}).get(run_names.get(task, task))
        rows[task] = row
        log.info("%s: %s over %s items", task, ", ".join(f"{k} {v:.4f}" for k, v in row_metrics.items()
                                                          if not k.endswith("_stderr")), row["n"])
    for task, r in lm_layout["results"].items():  # a group's aggregate (mmlu's acc) is a flat metric too
        if task in groups:
            for key, value in r.items():
                name, v = task_metric(task, key), _num(value)
                if name is not None and v is not None:
                    flat[name] = v
    if layout:
        return {"tasks": rows, "metrics": flat, "lm_eval": lm_layout}
    return rows


_PLAIN = ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")


def _root(task: str, lm_layout: dict) -> str:
    for g, subs in lm_layout.get("group_subtasks", {}).items():
        if task in subs:
            return g
    return task


def _rename(d, back: Mapping[str, str]):
    """lm-eval's per-task dicts with gac's local task names (``gac_local_piqa``) turned back into ``piqa``."""
    if not isinstance(d, Mapping):
        return d
    return {back.get(k, k): v for k, v in d.items()}


def _layout(res: Mapping, back: Mapping[str, str], sources: Mapping[str, str]) -> dict:
    """lm-eval's own results layout (JSON-ready), keyed by the names the user gave."""
    import json as _json

    def clean(x):
        return _json.loads(_json.dumps(x, default=str))

    results = {}
    for name, r in (res.get("results") or {}).items():
        results[back.get(name, name)] = {k: (v if k != "alias" else back.get(v, v)) for k, v in r.items()}
    configs = {}
    for name, c in (res.get("configs") or {}).items():
        configs[back.get(name, name)] = {k: c.get(k) for k in ("task", "dataset_path", "dataset_name", "output_type",
                                                              "num_fewshot", "metric_list", "test_split",
                                                              "validation_split", "metadata") if k in c}
    return clean({
        "results": results,
        "groups": _rename(res.get("groups") or {}, back),
        "group_subtasks": {back.get(g, g): [back.get(t, t) for t in subs]
                           for g, subs in (res.get("group_subtasks") or {}).items()},
        "versions": _rename(res.get("versions") or {}, back),
        "n-samples": _rename(res.get("n-samples") or {}, back),
        "higher_is_better": _rename(res.get("higher_is_better") or {}, back),
        "configs": configs,
        "sources": dict(sources),
        "lm_eval_version": (res.get("lm_eval_version") or None),
    })


def _hflm():
    """lm-eval's HFLM whose request bars follow :func:`gac.progress.library_bars` (hidden when quiet or off a
    terminal, where gac's stage line says the same in one line)."""
    from lm_eval.models.huggingface import HFLM

    from gac.progress import library_bars

    class QuietHFLM(HFLM):
        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not library_bars())

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm or not library_bars())

        def generate_until(self, requests, disable_tqdm: bool = False):
            return super().generate_until(requests, disable_tqdm=disable_tqdm or not library_bars())

    return QuietHFLM


@contextlib.contextmanager
def _hidden_request_bars():
    """lm-eval's "building requests" bar (``lm_eval.api.task``'s tqdm, which it calls without a ``disable``) off
    while gac hides library bars: ``TQDM_DISABLE`` cannot, as tqdm reads it at its import, which torch does first."""
    from gac.progress import library_bars

    task_mod = sys.modules.get("lm_eval.api.task")
    bar = getattr(task_mod, "tqdm", None)
    if library_bars() or bar is None:
        yield
        return
    task_mod.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        task_mod.tqdm = bar


def _run(model, tokenizer, names, limit, local_files, batch_size, device, num_fewshot, bootstrap_iters, seed,
         log_samples) -> tuple[dict, dict]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="gac-tasks-") as tmp:
        local_names = write_local_configs(local_files, tmp)
        hub = [t for t in names if t not in local_names]
        tm = _registry() if hub and not local_names else TaskManager(include_path=tmp if local_names else None,
                                                                     include_defaults=bool(hub))
        run_names = {t: local_names.get(t, t) for t in names}
        try:
            loaded = tm.load(list(run_names.values()))["tasks"]
        except Exception as e:  # the datasets library raises many kinds when the hub is unreachable
            where = ("the hub: " + ", ".join(hub)) if hub else "local files"
            raise GacError(
                f"could not load the task data from {where} ({type(e).__name__}: {str(e).strip()[:300]}); without "
                f"the hub, pass local JSONL files (`--task-file piqa=/path/piqa.jsonl`, or local_files={{...}} in "
                f"Python), or `--data tiny` for the shipped offline piqa/hellaswag files"
            ) from None
        lm = _hflm()(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
        with _quiet_git_hash(), _hidden_request_bars():
            res = _simple_evaluate(lm_eval, lm, tm, loaded, run_names, num_fewshot, limit, bootstrap_iters,
                                   log_samples, seed)
    if res is None:
        raise GacError("lm-eval returned no results (a non-zero rank of a distributed run?)")
    return res, run_names


def _simple_evaluate(lm_eval, lm, tm, loaded, run_names, num_fewshot, limit, bootstrap_iters, log_samples, seed):
    """One lm-eval run on the loaded task objects (a group's names when a name expanded to several tasks), always
    with gac's own task manager: without one, lm-eval indexes all of its ~14k task YAMLs again (6-20 s a process)."""
    tasks = list(run_names.values()) if len(loaded) != len(run_names) else [loaded[n] for n in run_names.values()]
    return lm_eval.simple_evaluate(
        model=lm, tasks=tasks, task_manager=tm, num_fewshot=num_fewshot, limit=limit,
        bootstrap_iters=bootstrap_iters, log_samples=log_samples, random_seed=seed, numpy_random_seed=seed,
        torch_random_seed=seed, fewshot_random_seed=seed,
    )


@contextlib.contextmanager
def _quiet_git_hash():
    """lm-eval records ``git describe --always`` of the working directory and lets git print "fatal: not a git
    repository" on stderr outside a checkout (lm_eval/loggers/utils.py). The same lookup, git's stderr discarded,
    for the duration of one evaluation; the recorded ``git_hash`` is unchanged (None outside a checkout)."""
    import subprocess

    import lm_eval.evaluator as ev
    from lm_eval.loggers import utils as lm_utils

    def quiet():
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, OSError):
            return lm_utils.get_commit_from_path(os.getcwd())

    original = getattr(ev, "get_git_commit_hash", None)
    if original is None:  # another lm-eval layout: leave it alone
        yield
        return
    ev.get_git_commit_hash = quiet
    try:
        yield
    finally:
        ev.get_git_commit_hash = original


def _num(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None
