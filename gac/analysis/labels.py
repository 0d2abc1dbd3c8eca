"""How methods and metrics are named and ordered in tables and figures: ``ASVD (GAC)``, ``PPL (enwiki)``,
``PiQA-format (enwiki)`` (a task column says what data it was scored on), the paper's compressor order
(ASVD, SVD-LLM, PaLU, LLM-Pruner; the baseline first, unaligned before GAC). The GAC authors' own procedures
are labelled for what they are and say "as the authors ran it" (stable-rank SVD is never called ASVD)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

import pandas as pd

from gac.analysis.load import row_task_data
from gac.metrics import (
    HUB_TASKS,
    OWN_TASK_FILES,
    TASK_FORMAT_NAMES,
    is_lookalike,
    is_ppl,
    ppl_stride,
    task_data_note,
)
from gac.registry import BASELINE, BASELINE_LABEL, BASELINE_STRATEGY, PROXIES, is_baseline

log = logging.getLogger(__name__)

COMPRESSOR_LABELS = {BASELINE: BASELINE_LABEL, "asvd": "ASVD", "svd_llm": "SVD-LLM", "llm_pruner": "LLM-Pruner",
                     "palu": "PaLU", "stable_rank_svd": "Stable-rank SVD"}
STRATEGY_LABELS = {"unaligned": "", "gac": "GAC", "round_nearest": "round-nearest", "round_up": "round-up",
                   "round_down": "round-down", "rebalance": "rebalance", "authors_dp": "GAC DP",
                   "authors_round": "aligned_8", "round_to": "round_to",
                   "gac_latency": "GAC, latency"}
#: the GAC authors' own procedures (their Table 5 script, not what the paper describes): a row that runs one says so
AUTHORS_COMPRESSORS = frozenset({"stable_rank_svd"})
AUTHORS_STRATEGIES = frozenset({"authors_dp", "authors_round", "round_to"})
AS_THE_AUTHORS_RAN_IT = "as the authors ran it"
#: task accuracies labelled by their data: metric -> (short task name, lm-eval's normalised accuracy)
TASK_METRICS = {"piqa_acc": ("PiQA", False), "piqa_acc_norm": ("PiQA", True),
                "hellaswag_acc": ("HSwag", False), "hellaswag_acc_norm": ("HSwag", True)}
#: how a task accuracy's cell is written in every table (Table 5, the ratio sweep)
TASK_FORMAT = "{:.3f}"
#: display names (perplexity is ``PPL (<dataset>)``, task accuracies say their data: :func:`metric_label`); a task
#: accuracy's plain name (the hub's real dataset) comes from :data:`TASK_METRICS`
METRIC_LABELS = {**{m: task + (" (norm)" if norm else "") for m, (task, norm) in TASK_METRICS.items()},
                 "prefill_ms": "Prefill (ms)", "decode_ms_per_token": "Decode (ms/token)"}
#: task accuracies a ratio sweep plots beside perplexity when its records measured them (lm-eval's normalised accuracy)
SWEEP_TASK_METRICS = ("piqa_acc_norm", "hellaswag_acc_norm")
#: a table's task column whose rows were scored on different data (:func:`one_task_data`)
MIXED_TASK_DATA = "mixed"
_UNKNOWN = "unknown"


def metric_label(name: str, task_data: str | None = None) -> str:
    """A metric's display name: ``PPL (enwiki)`` for ``ppl_enwiki`` (named by its dataset); a task accuracy
    by the data it was scored on (``task_data``, :func:`gac.metrics.task_data`): ``PiQA`` / ``PiQA (norm)``
    for the hub's real datasets or unknown data, ``PiQA-format (enwiki)`` / ``HSwag-format (tiny, norm)`` for
    gac's look-alike sets, ``PiQA (own files)`` for the user's files, ``PiQA (mixed data)`` for rows that
    differ (:data:`MIXED_TASK_DATA`)."""
    name = str(name)
    if name in TASK_METRICS and task_data not in (None, HUB_TASKS, _UNKNOWN):
        task, norm = TASK_METRICS[name]
        if is_lookalike(task_data):
            return f"{task}-format ({task_data}{', norm' if norm else ''})"
        what = {OWN_TASK_FILES: "own files", MIXED_TASK_DATA: "mixed data"}.get(task_data, str(task_data))
        return f"{task} ({what}{', norm' if norm else ''})"
    if name in METRIC_LABELS:
        return METRIC_LABELS[name]
    if is_ppl(name):
        dataset, stride = ppl_stride(name)
        return f"PPL ({dataset})" if stride is None else f"PPL ({dataset}, sliding window, stride {stride})"
    return name


def task_of(metric: str) -> str | None:
    """The task of an accuracy that is labelled by its data: ``"hellaswag_acc_norm"`` -> ``"hellaswag"``."""
    return str(metric).split("_acc")[0] if str(metric) in TASK_METRICS else None


def _data(v) -> str:
    return _UNKNOWN if v is None or (isinstance(v, float) and v != v) else str(v)


def one_task_data(values) -> str | None:
    """The one data source of a table's task column from its rows' :func:`gac.metrics.task_data` values
    (None: unknown): that value; None when no row says or every row is unknown; :data:`MIXED_TASK_DATA` when
    rows differ (unknown beside a known source counts as a difference: it may be anything)."""
    seen = {_data(v) for v in values}
    if not seen or seen == {_UNKNOWN}:
        return None
    return seen.pop() if len(seen) == 1 else MIXED_TASK_DATA


def task_columns(values: Mapping[str, Iterable]) -> tuple[dict[str, str | None], str]:
    """What a table's task columns were scored on: ``values`` maps a task (``"piqa"``) to the
    :func:`gac.metrics.task_data` of each row that measured it. Returns ``{task: data}`` (for
    :func:`metric_label`; :func:`one_task_data`) and a caption note: for a look-alike set, what its items are
    made from and that they are not the real datasets; for the user's files, that they are; for rows that
    differ, which sources they mix. The note is empty for the hub's datasets or unknown data."""
    values = {str(t): [_data(v) for v in vs] for t, vs in values.items()}
    data = {t: one_task_data(vs) for t, vs in values.items()}
    shown = {HUB_TASKS: "hub datasets", OWN_TASK_FILES: "own files"}
    notes = []
    for d in dict.fromkeys(v for v in data.values() if v not in (None, HUB_TASKS)):
        tasks = [t for t, v in data.items() if v == d]
        names = "/".join(TASK_FORMAT_NAMES.get(t, t) for t in tasks)
        if is_lookalike(d):
            notes.append(f"task columns: {task_data_note(d, tasks)}")
        elif d == OWN_TASK_FILES:
            notes.append(f"{names} columns: the records' own task files (model.task_files)")
        else:
            mixed = sorted({shown.get(v, v) for t in tasks for v in values[t]})
            notes.append(f"{names} columns mix rows scored on different task data ({', '.join(mixed)}): "
                         f"not one benchmark, compare with care")
    return data, "; ".join(notes)


def task_metric_labels(recs, metrics) -> tuple[dict[str, str], dict[str, str | None], str]:
    """For a table of ``recs`` (frame rows; None is skipped): the display names of the task metrics among
    ``metrics`` by the data the rows that measured each task were scored on (``PiQA-format (enwiki)``; rows
    that differ: ``PiQA (mixed data)``, logged; a column no row measured: by the data all rows name), that
    data per task, and the caption note saying what the items are (:func:`gac.analysis.labels.task_columns`)."""
    recs = [r for r in recs if r is not None]
    values = {}
    for m in metrics:
        if task_of(m) is not None:
            values.setdefault(task_of(m), [])
    for t, vals in values.items():
        mine = [m for m in metrics if task_of(m) == t]
        vals.extend(row_task_data(r, t) for r in recs if any(not math.isnan(row_number(r, m)) for m in mine))
    data, note = task_columns(values)
    if MIXED_TASK_DATA in data.values():
        log.warning("task columns mix rows scored on different task data: %s", note)
    for t in [t for t, vals in values.items() if not vals]:  # a blank column: named by the data the rows name
        d = one_task_data(row_task_data(r, t) for r in recs)
        data[t] = None if d == MIXED_TASK_DATA else d
    return {m: metric_label(m, data[task_of(m)]) for m in metrics if task_of(m) is not None}, data, note


def sweep_task_labels(sweep: pd.DataFrame) -> tuple[dict[str, str], dict[str, str | None], str]:
    """A ratio sweep's (:func:`ratio_sweep`) task metrics labelled by the data they were scored on, as
    :func:`task_metric_labels` does for Table 5: ``({metric: label}, {task: data}, caption note)``."""
    metrics = [m for m in dict.fromkeys(sweep["metric"].astype(str)) if task_of(m) is not None]
    values: dict[str, list] = {}
    for m in metrics:
        col = sweep.loc[sweep["metric"] == m, "task_data"] if "task_data" in sweep.columns else []
        values.setdefault(task_of(m), []).extend(col)
    data, note = task_columns(values)
    if MIXED_TASK_DATA in data.values():
        log.warning("ratio sweep: task accuracies mix rows scored on different task data: %s", note)
    return {m: metric_label(m, data[task_of(m)]) for m in metrics}, data, note


def row_number(rec, name: str) -> float:
    """A frame row's ``name`` as a float; NaN when the row (None) or the column is missing or holds no number."""
    if rec is None or name not in rec.index:
        return math.nan
    v = rec[name]
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


#: stands for the perplexity metric of the data at hand (``ppl_<dataset>``, :mod:`gac.metrics`): see ppl_column
PPL = "ppl"

def ppl_column(df: pd.DataFrame) -> str:
    """The perplexity column of ``df`` (``ppl_wikitext2``, ``ppl_tiny``, ...): the one with the most values."""
    cols = [c for c in df.columns if is_ppl(c)]
    if not cols:
        return PPL
    return max(sorted(cols), key=lambda c: int(df[c].notna().sum()))


def compressor_label(name) -> str:
    return COMPRESSOR_LABELS.get(str(name), str(name))


def method_label(compressor, strategy) -> str:
    """``("asvd", "unaligned")`` -> ``"ASVD"``; ``("asvd", "gac")`` -> ``"ASVD (GAC)"``; baseline -> ``"Baseline"``;
    the GAC authors' procedures say so: ``("stable_rank_svd", "authors_dp")`` -> ``"Stable-rank SVD (GAC DP, as the
    authors ran it)"``, ``("llm_pruner", "round_to")`` -> ``"LLM-Pruner (round_to, as the authors ran it)"``."""
    if is_baseline(compressor, strategy):
        return BASELINE_LABEL
    s = STRATEGY_LABELS.get(str(strategy), str(strategy))
    parts = [s] if s else []
    if str(compressor) in AUTHORS_COMPRESSORS or str(strategy) in AUTHORS_STRATEGIES:
        parts.append(AS_THE_AUTHORS_RAN_IT)
    return compressor_label(compressor) + (f" ({', '.join(parts)})" if parts else "")


def baseline_mask(df: pd.DataFrame) -> pd.Series:
    """:func:`gac.registry.is_baseline` of every row."""
    return (df["compressor"].astype(str) == BASELINE) | (df["strategy"].astype(str) == BASELINE_STRATEGY)


_PREFERRED = ("asvd", "stable_rank_svd", "svd_llm", "palu", "llm_pruner")
_STRATEGY_ORDER = ("baseline", "unaligned", "gac", "gac_latency", "authors_dp", "authors_round", "round_to",
                   "round_nearest", "round_up", "round_down", "rebalance")


def method_order(compressor, strategy) -> tuple:
    """Sort key: baseline first, then compressors in the paper's order, unaligned before GAC before the rest."""
    if is_baseline(compressor, strategy):
        return (-1, "", -1, "")
    c, s = str(compressor), str(strategy)
    return (_PREFERRED.index(c) if c in _PREFERRED else len(_PREFERRED), c,
            _STRATEGY_ORDER.index(s) if s in _STRATEGY_ORDER else len(_STRATEGY_ORDER), s)


def proxy_order(names) -> list[str]:
    """Proxies in the paper's Table 1 order (magnitude, activation, gradient, fisher; then gac's others as
    registered, :data:`gac.registry.PROXIES`), unknown names last."""
    known = list(PROXIES.names)
    uniq = list(dict.fromkeys(str(n) for n in names))
    return sorted(uniq, key=lambda n: (known.index(n) if n in known else len(known), n))


def compressor_order(names) -> list[str]:
    uniq = list(dict.fromkeys(str(n) for n in names))
    return sorted(uniq, key=lambda n: (_PREFERRED.index(n) if n in _PREFERRED else len(_PREFERRED), n))


def sweep_metric_rank(m: str) -> tuple[int, int]:
    """A ratio sweep's metric order: perplexity first, then the task accuracies (PiQA before HellaSwag, as in
    Table 5), latency last."""
    tasks = list(SWEEP_TASK_METRICS)
    return (0, 0) if is_ppl(m) else (2, 0) if str(m).startswith(("prefill", "decode")) else \
        (1, tasks.index(m) if m in tasks else len(tasks))


def budget_note(row) -> str:
    """A latency-budget plan's budget and whether it held, by its table (``latency <= 1.0 x gac (3.2 ms): held``,
    ``min latency at the parameter count: held``); empty for a plan by parameters. ``row``: a results-frame row."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: d)
    kind = get("budget_kind", None)
    if not isinstance(kind, str):
        return ""
    held = get("latency_held", None)
    if kind == "min_latency":
        params, budget = get("params", None), get("budget", None)
        ok = "?" if params is None or budget is None or params != params or budget != budget else \
            "held" if params >= budget else "over"
        return f"min latency at >= the ratio's parameters: {ok}"
    share, ref, ms = get("latency_share", None), get("latency_reference", None), get("latency_budget_ms", None)
    what = f"{share:g} x {ref}" if isinstance(share, float) and isinstance(ref, str) and share == share else "budget"
    if isinstance(ms, float) and ms == ms:
        what += f" ({ms:.4g} ms)" if what != "budget" else f" {ms:.4g} ms"
    state = "?" if held is None or held != held else "held" if held else "over"
    return f"latency <= {what}: {state}"


#: the engine every latency of gac measured before engines were an axis: its columns keep their plain names
DEFAULT_ENGINE = "torch"


def engine_label(column: str, engine: str | None) -> str:
    """A latency column named by the engine that measured it (``Prefill (ms), onnxruntime``); torch (PyTorch
    eager) and an unknown engine keep the plain name."""
    return column if engine in (None, "", DEFAULT_ENGINE) else f"{column}, {engine}"


def _spelled(engine) -> str:
    """A record's ``eval.engine`` as results name it (``LLAMA.CPP:Q4_K`` is ``llama.cpp:q4_K``; ``llama.cpp:f32`` is
    ``llama.cpp``); a name gac does not know stays as written (a table shows what the record says)."""
    from gac.align.engine_types import canonical_engine
    from gac.errors import GacError

    try:
        return canonical_engine(engine)
    except GacError:
        return str(engine)


def rows_engine(rows: Iterable) -> str | None:
    """The engine the records' own latency was measured in (``eval.engine`` of their config; torch where it is
    not set), ``"mixed engines"`` when they differ, None without rows."""
    from gac.analysis.load import CONFIG

    seen = []
    for rec in rows:
        if rec is None:
            continue
        cfg = rec.get(CONFIG) if hasattr(rec, "get") else None
        name = (cfg or {}).get("eval.engine") if isinstance(cfg, Mapping) else None
        name = DEFAULT_ENGINE if name is None or (isinstance(name, float) and math.isnan(name)) else _spelled(name)
        if name not in seen:
            seen.append(name)
    return None if not seen else seen[0] if len(seen) == 1 else "mixed engines"
