"""Metric names: one name per quantity, the same in records, CLI output, W&B, tables and reports.

* ``ppl_<dataset>``: perplexity on the text actually scored (``ppl_wikitext2``, ``ppl_tiny``, ``ppl_enwiki``); a
  local file is named by its dataset, never by its split: the file name without split words (test, valid, raw, shard
  numbers), else the nearest informative directory (``wikitext-2-raw/wiki.test.raw`` -> ``ppl_wikitext2``,
  ``ptb/test.txt`` -> ``ppl_ptb``, ``./My Corpus.jsonl`` -> ``ppl_my_corpus``; a bare ``test.txt`` -> ``ppl_text``);
  a sliding-window perplexity (``eval.ppl_stride``, the GAC authors' protocol) is ``ppl_<dataset>_stride<S>``;
* ``<task>_<metric>`` (``piqa_acc``, ``hellaswag_acc_norm``, ``piqa_acc_stderr``): lm-eval's metric with filter
  ``none``; another filter is appended (``gsm8k_exact_match_strict_match``). The key names the task, not its
  data: what the items were (the hub's real dataset, one of gac's look-alike sets, the user's files) is
  :func:`task_data` of the job's ``model.task_files``, which display names and captions say;
* ``prefill_ms``: the job's own prefill point (its ``seq_len``, at ``eval.latency_batch``); further points of a
  sweep over S or batch are ``prefill_ms@<S>`` / ``prefill_ms@b<B>_<S>``, never the job's own point again;
  ``prefill_ms_spread`` only when there was more than one trial;
* ``decode_ms_per_token``.

Records written before these names were settled still load: :func:`upgrade_metrics` maps them when a record is
read (``ResultsStore.read_record`` / ``iter_records``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import PurePath

PPL_PREFIX = "ppl_"
STRIDE_TAG = "_stride"  # a sliding-window perplexity: ppl_<dataset>_stride<S>
_STRIDE = re.compile(r"_stride(\d+)$")
PREFILL = "prefill_ms"
PREFILL_SPREAD = "prefill_ms_spread"
DECODE = "decode_ms_per_token"

#: the names ``"wikitext2"`` goes by (the hub's ``Salesforce/wikitext``, config ``wikitext-2-raw-v1``)
WIKITEXT2_ALIASES = ("wikitext2", "wikitext-2", "wikitext2-raw", "wikitext-2-raw", "wikitext-2-raw-v1", "Salesforce/wikitext",
                     "wikitext")
TINY_ALIASES = ("tiny",)
#: English Wikipedia articles from the gensim==4.4.0 wheel's test data (gac.fixtures.enwiki)
ENWIKI_ALIASES = ("enwiki",)
_SPLIT_NOTE = re.compile(r"\s*\((train|validation|test)\)\s*$")
_NOT_WORD = re.compile(r"[^a-z0-9]+")
# words that name a split, a format or a place, not a dataset: dropped from file and directory names
_SPLIT_WORDS = frozenset({"train", "training", "test", "testing", "valid", "validation", "val", "dev", "heldout",
                          "raw", "tokens", "of", "split", "splits"})
_GENERIC_DIRS = frozenset({"eval", "data", "datasets", "dataset", "text", "texts", "tmp", "temp", "files", "corpus",
                           "corpora", "home", "root", "users", "mnt", "work", "cache"})
_FILE_PREFIXES = frozenset({"wiki"})  # WikiText's own files: wiki.test.raw (the directory says which WikiText)


def dataset_name(source) -> str:
    """The short name of a perplexity text source: ``"wikitext2"``, ``"tiny"``, a local file's stem (lower case,
    ``[a-z0-9_]``), ``"text"`` for an inline text. Accepts what :func:`gac.evaluation.perplexity` records as
    ``source`` too (``"tiny (test)"``)."""
    s = _SPLIT_NOTE.sub("", str(source)).strip()
    if s in WIKITEXT2_ALIASES or s.lower() in WIKITEXT2_ALIASES:
        return "wikitext2"
    if s in TINY_ALIASES:
        return "tiny"
    if s in ENWIKI_ALIASES:
        return "enwiki"
    if s in ("", "<text>"):
        return "text"
    path = PurePath(s)
    stem = path.name
    for suffix in (".parquet", ".jsonl", ".json", ".txt", ".raw", ".tokens"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    own = _dataset_words(stem)
    if own and not (len(own) == 1 and own[0] in _FILE_PREFIXES):
        return _known("_".join(own))
    for parent in list(path.parents)[:3]:  # the dataset's directory: wikitext-2-raw/, ptb/, tiny/eval/
        words = _dataset_words(parent.name)
        if words and "_".join(words) not in _GENERIC_DIRS:
            return _known("_".join(words))
    return _known("_".join(own)) if own else "text"


def _dataset_words(name: str) -> list[str]:
    """The words of a file or directory name that can name a dataset (no split words, no shard numbers)."""
    return [w for w in _NOT_WORD.split(name.lower())
            if w and w not in _SPLIT_WORDS and not (w.isdigit() and (len(w) >= 4 or w.startswith("0")))]


def _known(name: str) -> str:
    """A named source's own name when ``name`` is one of its spellings (``wikitext_2`` -> ``wikitext2``,
    ``enwiki_gensim_4_4_0`` -> ``enwiki``), else ``name``."""
    if name in {"_".join(_dataset_words(a)) for a in WIKITEXT2_ALIASES}:
        return "wikitext2"
    first = name.split("_")[0]
    if first in TINY_ALIASES or first in ENWIKI_ALIASES:
        return first
    return name


#: gac's look-alike task sets (``model.task_files: tiny | enwiki``): PiQA-/HellaSwag-format items that gac
#: made from other text (gac.fixtures.tiny, gac.fixtures.enwiki), not the PiQA/HellaSwag datasets; each one's
#: source text
LOOKALIKE_TASK_SETS = {"tiny": "held-out Shakespeare plays", "enwiki": "held-out English Wikipedia articles"}
HUB_TASKS = "hub"  # lm-eval's own datasets from the hub: the real PiQA, HellaSwag, ...
OWN_TASK_FILES = "files"  # a {task: path} mapping: the user's files (an offline copy of the dataset, or not)
#: the names of the task formats gac's look-alike sets imitate (for captions and notes)
TASK_FORMAT_NAMES = {"piqa": "PiQA", "hellaswag": "HellaSwag"}


def task_data(task_files, task: str | None = None) -> str | None:
    """What data task metrics were scored on, from a job's ``model.task_files``: ``"hub"`` (null or
    ``"hub"``: lm-eval's real datasets), ``"tiny"`` / ``"enwiki"`` (gac's look-alike sets,
    :data:`LOOKALIKE_TASK_SETS`), ``"files"`` (a ``{task: path}`` mapping: the user's own files; with ``task``
    given, a task the mapping does not name came from the hub), None when unknown (``"auto"`` in records
    written before it was resolved, anything else). The metric keys stay ``piqa_acc``, ...: this says what
    display names and captions call them."""
    if task_files is None or task_files == HUB_TASKS:
        return HUB_TASKS
    if isinstance(task_files, str):
        return task_files if task_files in LOOKALIKE_TASK_SETS else None
    if isinstance(task_files, Mapping):
        return OWN_TASK_FILES if task is None or str(task) in task_files else HUB_TASKS
    return None


def is_lookalike(data) -> bool:
    """Whether ``data`` (a :func:`task_data` value) is one of gac's look-alike sets."""
    return isinstance(data, str) and data in LOOKALIKE_TASK_SETS


def task_data_note(data: str, tasks: Iterable[str] = ("piqa", "hellaswag")) -> str:
    """What a look-alike set's items are, for a caption or a printed line: ``"PiQA-/HellaSwag-format items
    made from held-out English Wikipedia articles (gac's enwiki set), not the PiQA/HellaSwag datasets"``;
    ``tasks``: the tasks shown (their formats are named). Empty for data that are not a look-alike set."""
    if not is_lookalike(data):
        return ""
    names = [TASK_FORMAT_NAMES.get(str(t), str(t)) for t in dict.fromkeys(tasks)]
    names = names or list(TASK_FORMAT_NAMES.values())
    return (f"{'-/'.join(names)}-format items made from {LOOKALIKE_TASK_SETS[data]} (gac's {data} set), "
            f"not the {'/'.join(names)} dataset{'s' if len(names) > 1 else ''}")


def ppl_metric(source, stride: int | None = None) -> str:
    """``"wikitext2"`` -> ``"ppl_wikitext2"``, ``"tiny"`` -> ``"ppl_tiny"`` (see :func:`dataset_name`); a sliding-window
    perplexity (``stride``, the GAC authors' protocol) is another quantity: ``"ppl_wikitext2_stride1024"``."""
    return PPL_PREFIX + dataset_name(source) + ("" if stride is None else f"{STRIDE_TAG}{int(stride)}")


def ppl_stride(name: str) -> tuple[str, int | None]:
    """``"ppl_wikitext2_stride1024"`` -> ``("wikitext2", 1024)``; ``"ppl_tiny"`` -> ``("tiny", None)``."""
    m = _STRIDE.search(str(name))
    base = str(name)[: m.start()] if m else str(name)
    return base[len(PPL_PREFIX):] if base.startswith(PPL_PREFIX) else base, int(m.group(1)) if m else None


def is_ppl(name: str) -> bool:
    return str(name).startswith(PPL_PREFIX) and not str(name).endswith("_stderr")


def prefill_point(batch: int, seq_len: int) -> str:
    """The name of one prefill point: ``prefill_ms@1024``, ``prefill_ms@b4_1024``."""
    return f"{PREFILL}@{int(seq_len)}" if int(batch) == 1 else f"{PREFILL}@b{int(batch)}_{int(seq_len)}"


def own_prefill_point(record: Mapping) -> str | None:
    """The point name of a record's own prefill measurement (``prefill_ms`` in its metrics): its ``seq_len`` at
    ``config.eval.latency_batch`` (default 1), e.g. ``prefill_ms@1024``; None without a ``seq_len``."""
    seq_len = _path(record, "job", "seq_len")
    batch = _path(record, "config", "eval", "latency_batch") or 1
    try:
        return prefill_point(int(batch), int(seq_len))
    except (TypeError, ValueError):
        return None


def task_metric(task: str, metric_filter: str) -> str | None:
    """lm-eval's ``"acc,none"`` of ``task`` -> ``"<task>_acc"``; ``"exact_match,strict-match"`` ->
    ``"<task>_exact_match_strict_match"``; ``"alias"`` and other non-metric keys -> None."""
    metric, sep, filt = str(metric_filter).partition(",")
    if not sep:
        return None
    name = f"{task}_{metric}" if filt in ("none", "") else f"{task}_{metric}_{filt}"
    return re.sub(r"[^A-Za-z0-9_]+", "_", name)


def upgrade_metrics(record: Mapping) -> dict:
    """A record's metrics under today's names (a new dict; the record is not changed).

    * ``ppl_wikitext2`` (every record before per-dataset names, whatever text was scored) -> ``ppl_<dataset>`` of
      the source the record says it scored (``evaluation.perplexity.source``, else ``config.model.ppl_source``, else
      ``wikitext2``);
    * the duplicate of ``prefill_ms`` at the job's own point (``prefill_ms@<seq_len>``) is dropped;
    * ``prefill_ms_spread`` from a single trial (always 0) is dropped.
    """
    metrics = dict(record.get("metrics") or {})
    ev = record.get("evaluation") if isinstance(record.get("evaluation"), Mapping) else {}
    for old in ("ppl_wikitext2",):
        if old in metrics:
            source = ((ev or {}).get("perplexity") or {}).get("source") if isinstance(ev, Mapping) else None
            if source is None:
                source = _path(record, "config", "model", "ppl_source") or "wikitext2"
            new = ppl_metric(source)
            if new != old:
                value = metrics.pop(old)
                metrics.setdefault(new, value)
    dup = own_prefill_point(record)
    if PREFILL in metrics and dup in metrics and metrics[dup] == metrics[PREFILL]:
        metrics.pop(dup)
    if PREFILL_SPREAD in metrics:
        lat = (ev or {}).get("latency") if isinstance(ev, Mapping) else None
        trials = {r.get("trials") for r in (lat or {}).values() if isinstance(r, Mapping)}
        if trials == {1}:
            metrics.pop(PREFILL_SPREAD)
    return metrics


def upgrade_record(record: dict) -> dict:
    """``record`` with :func:`upgrade_metrics` applied in place (returned for chaining)."""
    if isinstance(record, dict) and isinstance(record.get("metrics"), Mapping):
        record["metrics"] = upgrade_metrics(record)
    return record


def _path(d, *keys):
    for k in keys:
        if not isinstance(d, Mapping):
            return None
        d = d.get(k)
    return d


# ---------------------------------------------------------------------------------------------- plausible values
_UNIT_INTERVAL = re.compile(r"_(acc|acc_norm|exact_match|f1|mcc|brier_score)(_[A-Za-z0-9_]+)?$")


def metric_problem(name: str, value) -> str | None:
    """Why ``value`` cannot be metric ``name`` (None when it can; None itself is "not run"): every metric is a finite
    number; perplexity is above 1; accuracies (``*_acc``, ``*_acc_norm``, exact match, F1) lie in [0, 1]; standard
    errors and spreads are >= 0; latencies are > 0. What a job checks before writing a record and a reader checks
    before trusting one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {value!r}, not a number"
    if not math.isfinite(value):
        return f"is {value}, not a finite number"
    n = str(name)
    if n.endswith("_stderr") or n == PREFILL_SPREAD:
        return None if value >= 0 else f"is {value:g}; a standard error or spread is >= 0"
    if is_ppl(n):
        return None if value > 1 else f"is {value:g}; a perplexity is above 1"
    if n.startswith(PREFILL) or n == DECODE:
        return None if value > 0 else f"is {value:g}; a latency is above 0 ms"
    if _UNIT_INTERVAL.search(n):
        return None if 0 <= value <= 1 else f"is {value:g}; an accuracy lies in [0, 1]"
    return None


def check_metrics(metrics, where: str) -> None:
    """Raise a :class:`~gac.errors.GacError` naming the first metric of ``metrics`` that :func:`metric_problem`
    rejects (``where`` says whose metrics they are)."""
    from gac.errors import GacError

    if not isinstance(metrics, Mapping):
        raise GacError(f"{where}: metrics are a {type(metrics).__name__}, not an object of numbers")
    for k, v in metrics.items():
        why = metric_problem(k, v)
        if why:
            raise GacError(f"{where}: metric {k!r} {why}")
