"""Tidy pandas views of results: one row per record (from the results store or a W&B export).

Columns of the frame :func:`load_results` returns (any column may hold NaN/None where a record lacks it):

``key, status, created, path``
    the record's identity (``path`` is its file; empty for W&B runs)
``model, compressor, proxy, strategy, ratio, unit, gpu, seq_len, experiment, sweep``
    the record's ``job`` fields, flat (the original model's: :func:`gac.registry.is_baseline`)
``aligned_fraction, params, budget``
    the record's top-level numbers
``<metric>``
    one column per metric name in ``record["metrics"]`` (:mod:`gac.metrics`: ``ppl_wikitext2`` or ``ppl_tiny``,
    ``piqa_acc``, ``prefill_ms``, ``prefill_ms@512``, ``prefill_ms@b4_1024``, ...); a metric a record did not run
    is NaN. In a record that measured several points, the job's own one (``prefill_ms`` in the record) is also
    its ``prefill_ms@<seq_len>`` column here, so a sweep over S sees every point
``plan_strategy, plan_objective, plan_budget_met, n_targets, aligned_8, aligned_16, aligned_32, dims, d_star,
dense_targets``
    from ``record["plan"]`` (``dims`` is the ``{target name: dim}`` dict and ``d_star`` the compressor's
    unconstrained ``{target name: d*}``, ``dense_targets`` the names left dense, kept as object columns;
    :func:`plan_dims` expands them into one row per target)
``time_<stage>``
    stage timings in seconds
``git_commit, git_dirty, device, gac_version``
    provenance
``task_data``
    what the task metrics were scored on, from the record's ``model.task_files``
    (:func:`gac.metrics.task_data`): ``hub`` (lm-eval's real datasets), ``tiny`` / ``enwiki`` (gac's
    PiQA-/HellaSwag-format look-alike sets), ``files`` (the user's own), None when the record does not say;
    what task columns are labelled by (:func:`row_task_data` for one task)
``config``
    the record's resolved config, flat (``{"eval.limit": 50, "align.window": 8, ...}``, pandas.json_normalize),
    without the keys that never change a result (:data:`CONFIG_LABELS`: output paths, loggers, labels); what
    :func:`gac.analysis.selection.setting_groups` compares to tell records that may share a table row apart
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from gac.align.candidates import DEFAULT_UNIT
from gac.devices import gpu_of_device
from gac.errors import GacError
from gac.io import file_problem
from gac.metrics import OWN_TASK_FILES, PREFILL, own_prefill_point, task_data
from gac.results.query import JOB_FIELDS, number_of

log = logging.getLogger(__name__)

ID_COLUMNS = ("key", "status", "created", "path")
TOP_FIELDS = ("aligned_fraction", "params", "budget")
PLAN_COLUMNS = ("plan_strategy", "plan_objective", "plan_budget_met", "n_targets", "aligned_8", "aligned_16",
                "aligned_32", "dims", "d_star", "dense_targets")
PROVENANCE_FIELDS = ("git_commit", "git_dirty", "device", "gac_version")
CONFIG = "config"
TASK_DATA = "task_data"
ALLOCATION = "allocation"  # the allocation rule that ran (the record's compression recipe), not a metric
BASE_COLUMNS = ID_COLUMNS + JOB_FIELDS + TOP_FIELDS + PLAN_COLUMNS
RESERVED = frozenset(BASE_COLUMNS) | frozenset(PROVENANCE_FIELDS) | {CONFIG, TASK_DATA, ALLOCATION}
#: top-level config keys that never change a result (where it is written, logging, labels): left out of ``config``
CONFIG_LABELS = frozenset({"results_dir", "force", "on_busy", "logger", "launcher", "hydra", "wandb", "slurm",
                           "work_dir", "quiet", "verbose", "save_model", "experiment_name", "experiment", "sweep",
                           "bench", "job", "key", "overrides"})

#: ``prefill_ms@1024`` or ``prefill_ms@b4_1024`` -> (metric, batch, seq_len)
SEQ_METRIC = re.compile(r"^(?P<metric>[A-Za-z0-9_]+)@(?:b(?P<batch>\d+)_)?(?P<seq>\d+)$")


def parse_seq_metric(name: str) -> tuple[str, int, int] | None:
    """``"prefill_ms@b4_1024"`` -> ``("prefill_ms", 4, 1024)``; ``"prefill_ms@128"`` -> batch 1; else None."""
    m = SEQ_METRIC.match(str(name))
    if not m:
        return None
    return m["metric"], int(m["batch"] or 1), int(m["seq"])


# ---------------------------------------------------------------------------------------------- store
def load_results(source, include_failures: bool = False, allow_empty: bool = False) -> pd.DataFrame:
    """Load a results store (a directory, or a :class:`gac.results.store.ResultsStore`) as a tidy frame.

    Raises :class:`GacError` for a missing directory, a corrupt or non-gac record, and (unless
    ``allow_empty``) a store without records.
    """
    from gac.results.store import ResultsStore, results_path

    store = source if isinstance(source, ResultsStore) else None
    if store is None:
        root = results_path(source)
        if not root.exists():
            if root.is_symlink():
                raise GacError(f"results directory {str(root)!r} is a broken or looping symbolic link; point it at the "
                               f"results_dir your jobs wrote to")
            raise GacError(f"results directory {str(root)!r} does not exist; give the results_dir your jobs wrote to")
        if not root.is_dir():
            raise GacError(f"results directory {str(root)!r} is a file; give the directory that holds records/")
        store = ResultsStore(root)
    records = list(store.iter_records(include_failures=include_failures))
    if not records and not allow_empty:
        raise GacError(f"no result records in {str(store.root)!r} (expected {store.records_dir}/<key>.json); "
                       f"run jobs with results_dir={store.root} first")
    df = records_to_frame(records)
    df.attrs["bench"] = [bench_summary(doc) for doc in store.iter_bench()]
    log.info("loaded %d records (and %d benches) from %s", len(df), len(df.attrs["bench"]), store.root)
    return df


def bench_summary(doc: Mapping) -> dict:
    """A side-by-side bench record (``bench/<key>.json``) reduced to what tables need: per point, the baseline's
    and every measured record's median ms and ratio to the baseline with its 95% interval. Frames from
    :func:`load_results` carry these in ``df.attrs["bench"]``; Table 5 and the latency figure use them."""
    points: dict = {}
    for p in doc.get("points") or []:
        name = p["name"]
        variants, base_ms = {}, None
        for v in doc.get("variants") or []:
            e = (v.get("points") or {}).get(name)
            if not e:
                continue
            if v.get("baseline"):
                base_ms = e["median_ms"]
            elif v.get("record_key"):
                lo, hi = e.get("ratio_ci95") or (None, None)
                variants[v["record_key"]] = {"ms": e["median_ms"], "ratio": e["ratio_to_baseline"], "lo": lo, "hi": hi,
                                             "compressor": v.get("compressor"), "strategy": v.get("strategy"),
                                             "ratio_param": v.get("ratio"), "label": v.get("label"),
                                             "samples": e.get("samples_ms")}  # per round: any two pair up later
        points[name] = {"batch": p["batch"], "seq_len": p["seq_len"], "baseline_ms": base_ms, "variants": variants}
    pred = doc.get("predicted") or {}
    for name, pp in (pred.get("points") or {}).items():
        if name in points:
            points[name]["predicted"] = {"label": pred.get("label"), "baseline_ms": pp.get("baseline_ms"),
                                         "by_key": {v["record_key"]: v["ms"] for v in pp["variants"].values()
                                                    if v.get("record_key")}}
    dev = doc.get("device") or {}
    return {"key": doc.get("key"), "created": doc.get("created"), "model": (doc.get("model") or {}).get("name"),
            "device": dev.get("name"), "device_type": dev.get("type"),
            "rounds": (doc.get("protocol") or {}).get("rounds"), "baseline_record": doc.get("baseline_record"),
            "engine": _engine_of(doc),
            "path": doc.get("_path"), "points": points}


def _engine_of(doc: Mapping) -> str:
    """What measured a bench document's first engine, as results name it: ``torch`` for benches from before engines,
    ``llama.cpp:q4_K`` for llama.cpp at a type other than its default (:func:`gac.align.engine_types.engine_spec`)."""
    from gac.align.engine_types import engine_spec

    engine = doc.get("engine") or {}
    return engine_spec(str(engine.get("name", "torch")), engine.get("quant"))


def records_to_frame(records: Iterable[Mapping]) -> pd.DataFrame:
    """Store records (dicts, see :mod:`gac.results.store`) -> the tidy frame (one row per record)."""
    rows = [_record_row(rec) for rec in records]
    return _frame(rows)


def _where(rec: Mapping) -> str:
    return str(rec.get("_path") or rec.get("key") or "<record>")


def _record_row(rec: Mapping) -> dict:
    if not isinstance(rec, Mapping):
        raise GacError(f"a result record is a {type(rec).__name__}, expected a JSON object")
    where = _where(rec)
    schema = rec.get("schema", 1)
    if schema != 1:
        raise GacError(f"result record {where} has schema {schema!r}; this gac reads schema 1 — upgrade gac "
                       f"or move the record out of the store")
    job = rec.get("job")
    if not isinstance(job, Mapping):
        raise GacError(f"result record {where} has no 'job' object; it is not a gac result record — move it out "
                       f"of the store")
    for f in ("model", "compressor", "strategy"):
        if f not in job:
            raise GacError(f"result record {where} lacks job.{f}; it is not a complete gac result record — move it "
                           f"out of the store or re-run the job")
    row: dict = {
        "key": rec.get("key"),
        "status": rec.get("status", "completed"),
        "created": rec.get("created"),
        "path": str(rec.get("_path", "")),
    }
    for f in JOB_FIELDS:
        row[f] = job.get(f)
    prov = rec.get("provenance") or {}
    if row["gpu"] == "auto" and isinstance(prov, Mapping) and isinstance(prov.get("device_name"), str):
        row["gpu"] = gpu_of_device(prov["device_name"])  # gpu=auto: the tables name the device the job ran on
    for f in TOP_FIELDS:
        row[f] = rec.get(f)
    metrics = rec.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise GacError(f"result record {where} has 'metrics' of type {type(metrics).__name__}, expected an object")
    for name, value in metrics.items():
        row[_metric_column(name)] = _number(value, f"metric {name!r} of {where}")
    own = own_prefill_point(rec)  # a sweep over S: the job's own point (`prefill_ms`) is one of its points
    if own is not None and PREFILL in metrics and own not in metrics and any(parse_seq_metric(m) for m in metrics):
        row[own] = row[PREFILL]
    row.update(_plan_columns(rec.get("plan"), where))
    row.update(_latency_budget_columns(rec.get("latency_budget")))
    comp = rec.get("compression")
    recipe = comp.get("recipe") if isinstance(comp, Mapping) else None
    alloc = recipe.get("allocation") if isinstance(recipe, Mapping) else None
    row[ALLOCATION] = alloc if isinstance(alloc, str) else None  # the rule that ran (a config's "default" resolved)
    ev = rec.get("evaluation")
    ppl = ev.get("perplexity") if isinstance(ev, Mapping) else None
    row["ppl_warning"] = ppl.get("warning") if isinstance(ppl, Mapping) else None  # a wrecked model (perplexity.py)
    if row["aligned_fraction"] is None and row.get("plan_aligned") is not None:
        row["aligned_fraction"] = row["plan_aligned"]
    row.pop("plan_aligned", None)
    for stage, secs in (rec.get("timings") or {}).items():
        row[f"time_{stage}"] = _number(secs, f"timing {stage!r} of {where}")
    for f in PROVENANCE_FIELDS:
        row[f] = prov.get(f) if isinstance(prov, Mapping) else None
    row[CONFIG] = config_fields(rec.get("config"))
    row[TASK_DATA] = config_task_data(row[CONFIG])
    return row


#: a latency-budget plan's columns (record block ``latency_budget``, :mod:`gac.jobs.run.latency_plan`): column -> key
LATENCY_BUDGET_COLUMNS = {"budget_kind": "budget_kind", "latency_held": "latency_held", "latency_source": "source",
                          "latency_budget_ms": "budget_ms", "latency_table_ms": "table_ms",
                          "latency_reference": "reference", "latency_share": "budget_share"}


def _latency_budget_columns(block) -> dict:
    """The columns of a record's ``latency_budget`` block (none for a plan by parameters: its row is unchanged)."""
    if not isinstance(block, Mapping):
        return {}
    out = {col: block.get(key) for col, key in LATENCY_BUDGET_COLUMNS.items()}
    lo_hi = block.get("interval_ms")
    if isinstance(lo_hi, (list, tuple)) and len(lo_hi) == 2:
        out["latency_table_lo_ms"], out["latency_table_hi_ms"] = lo_hi
    return out


def config_fields(config) -> dict:
    """A record's (or W&B run's) config -> a flat ``{"a.b": value}`` dict without :data:`CONFIG_LABELS`; list values
    become tuples (hashable, comparable)."""
    flat = _flatten(config) if config is not None else {}
    out = {}
    for k, v in flat.items():
        if k.split(".", 1)[0] in CONFIG_LABELS or k.startswith("job/"):
            continue
        out[k] = tuple(v) if isinstance(v, list) else v
    return dict(sorted(out.items()))


#: where a record's config (the job's resolved config, the one shape every entry point writes) holds the task files
_TASK_FILES = "model.task_files"


def config_task_data(flat: Mapping, task: str | None = None) -> str | None:
    """:func:`gac.metrics.task_data` of a flat config's ``model.task_files`` (a ``{task: path}`` mapping is
    flat as ``model.task_files.<task>``); None when the config does not hold the key (records and W&B runs
    without it)."""
    if not isinstance(flat, Mapping):
        return None
    if _TASK_FILES in flat:
        return task_data(flat[_TASK_FILES], task)
    own = {k[len(_TASK_FILES) + 1:]: v for k, v in flat.items() if str(k).startswith(_TASK_FILES + ".")}
    return task_data(own, task) if own else None


def row_task_data(row, task: str | None = None) -> str | None:
    """A frame row's :data:`TASK_DATA` (None when unknown); for ``task``, a task its own files do not name
    (a mapping of some tasks only) is the hub's."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: d)
    data = get(TASK_DATA, None)
    if not isinstance(data, str):
        return None
    if data == OWN_TASK_FILES and task is not None:
        return config_task_data(get(CONFIG, None), task) or data
    return data


def _metric_column(name: str) -> str:
    if name in RESERVED:
        log.warning("metric %r collides with a frame column; it is loaded as 'metric_%s'", name, name)
        return f"metric_{name}"
    return str(name)


def _number(value, what: str) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise GacError(f"{what} is {value!r}, expected a number; fix or remove the record") from None


def _plan_columns(plan, where: str) -> dict:
    out = {c: None for c in PLAN_COLUMNS}
    if plan is None:
        return out
    if not isinstance(plan, Mapping):
        raise GacError(f"result record {where} has 'plan' of type {type(plan).__name__}, expected an object or null")
    dims = plan.get("dims") or {}
    if not isinstance(dims, Mapping):
        raise GacError(f"result record {where} has plan.dims of type {type(dims).__name__}, expected an object")
    out["plan_strategy"] = plan.get("strategy")
    out["plan_objective"] = plan.get("objective")
    out["plan_budget_met"] = plan.get("budget_met")
    out["n_targets"] = len(dims)
    by_unit = plan.get("aligned_by_unit") or {}
    for u in (8, 16, 32):
        v = by_unit.get(str(u), by_unit.get(u)) if isinstance(by_unit, Mapping) else None
        out[f"aligned_{u}"] = v
    out["dims"] = {str(k): int(v) for k, v in dims.items()}
    d_star = plan.get("d_star") or {}
    out["d_star"] = {str(k): float(v) for k, v in d_star.items()} if isinstance(d_star, Mapping) else {}
    out["dense_targets"] = [str(x) for x in plan.get("dense") or []]
    out["plan_aligned"] = plan.get("aligned_fraction")
    return out


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in BASE_COLUMNS:
        if c not in df.columns:
            df[c] = None
    numeric = ("ratio", "unit", "seq_len", "aligned_fraction", "params", "budget", "plan_objective", "n_targets",
               "aligned_8", "aligned_16", "aligned_32")
    for c in numeric:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    if CONFIG not in df.columns:
        df[CONFIG] = None
    df[CONFIG] = [c if isinstance(c, dict) else {} for c in df[CONFIG]]
    if TASK_DATA not in df.columns:
        df[TASK_DATA] = None
    extra = [c for c in df.columns if c not in BASE_COLUMNS]
    return df[list(BASE_COLUMNS) + extra].reset_index(drop=True)


def metric_columns(df: pd.DataFrame) -> list[str]:
    """The metric columns of a tidy frame (everything that is not an identity/job/plan/timing/provenance column)."""
    return [c for c in df.columns if c not in RESERVED and not c.startswith("time_")]


# ---------------------------------------------------------------------------------------------- plan dims
_TARGET = re.compile(r"layers\.(?P<layer>\d+)\.(?P<rest>.+)$")


def parse_target(name: str) -> tuple[int | None, str, int | None]:
    """``model.layers.3.self_attn.k_proj.group0`` -> ``(3, "k_proj", 0)``; ``model.layers.3.mlp`` -> ``(3, "mlp", None)``."""
    m = _TARGET.search(name)
    layer = int(m["layer"]) if m else None
    parts = (m["rest"] if m else name).split(".")
    group = None
    if len(parts) > 1 and re.fullmatch(r"group\d+", parts[-1]):
        group = int(parts[-1][5:])
        parts = parts[:-1]
    return layer, parts[-1], group


def plan_dims(df: pd.DataFrame, unit: int = DEFAULT_UNIT) -> pd.DataFrame:
    """One row per (record, plan target): ``key, model, compressor, proxy, strategy, ratio, gpu, created, device,
    target, layer, kind, group, dim, d_star, dense, aligned`` (``aligned``: ``dim % unit == 0``; ``d_star``: the
    compressor's unconstrained dimension, NaN where the record lacks it; ``dense``: the target was left dense).
    Records without a plan contribute no rows."""
    cols = ["key", "model", "compressor", "proxy", "strategy", "ratio", "gpu", "created", "device"]
    rows = []
    for rec in df.to_dict("records"):
        dims = rec.get("dims")
        if not isinstance(dims, Mapping):
            continue
        d_star = rec.get("d_star") if isinstance(rec.get("d_star"), Mapping) else {}
        dense = set(rec.get("dense_targets") or [])
        for target, d in dims.items():
            layer, kind, group = parse_target(target)
            rows.append({**{c: rec.get(c) for c in cols}, "target": target, "layer": layer, "kind": kind,
                         "group": group, "dim": int(d), "d_star": float(d_star.get(target, math.nan)),
                         "dense": target in dense, "aligned": int(d) % unit == 0})
    out = pd.DataFrame(rows, columns=cols + ["target", "layer", "kind", "group", "dim", "d_star", "dense", "aligned"])
    out["d_star"] = pd.to_numeric(out["d_star"]).astype("float64")
    out["dense"] = out["dense"].astype(bool)
    out["layer"] = pd.to_numeric(out["layer"]).astype("Int64")
    out["group"] = pd.to_numeric(out["group"]).astype("Int64")
    out["aligned"] = out["aligned"].astype(bool)
    return out


# ---------------------------------------------------------------------------------------------- W&B
def records_from_wandb(runs) -> pd.DataFrame:
    """W&B runs -> the same tidy frame as :func:`load_results`.

    ``runs`` is an iterable of W&B API run objects (``wandb.Api().runs(path)``; attributes ``.config``,
    ``.summary``, ``.name``, ``.group``, optionally ``.id``, ``.state``, ``.created_at``), or the path of a
    CSV exported from the W&B runs table (or a DataFrame read from one).

    Where the fields are looked for (first hit wins): a job field ``f`` in config ``job.f``, ``job/f``, ``f``
    (a scalar) or ``f.name`` (a Hydra group dict); a metric ``m`` in summary ``m``, ``metrics/m`` or
    ``metrics.m``; ``aligned_fraction``, ``params``, ``budget`` in summary then config; ``key`` in config
    ``key`` then the run id.
    """
    if isinstance(runs, (str, os.PathLike)):
        p = Path(runs)
        why = file_problem(p)
        if why:
            raise GacError(f"W&B export {str(p)!r} {why}; export the runs table as CSV from the W&B UI")
        try:
            runs = pd.read_csv(p)
        except Exception as e:  # pandas raises several types for a bad CSV
            raise GacError(f"cannot read W&B export {str(p)!r} as CSV: {e}") from None
    if isinstance(runs, pd.DataFrame):
        flats = [_csv_run(r) for r in runs.to_dict("records")]
    else:
        flats = [_api_run(r) for r in runs]
    rows = [_wandb_row(*f) for f in flats]
    if not rows:
        raise GacError("no W&B runs given; check the project path and filters")
    return _frame(rows)


def _unwrap_wandb(d):
    """W&B's ``{"value": x, "desc": ...}`` config entries -> ``x`` (recursively)."""
    if isinstance(d, Mapping):
        if "value" in d and "desc" in d and len(d) == 2:
            return _unwrap_wandb(d["value"])
        return {str(k): _unwrap_wandb(v) for k, v in d.items()}
    return d


def _flatten(d) -> dict:
    """A nested config/summary (or its JSON text) -> one flat ``{"a.b.c": value}`` dict (pandas.json_normalize)."""
    if isinstance(d, str):
        try:
            d = json.loads(d)
        except ValueError:
            return {}
    if not isinstance(d, Mapping):
        return {}
    d = _unwrap_wandb(d)
    if not d:
        return {}
    return pd.json_normalize(d, sep=".").iloc[0].to_dict()


def _api_run(run) -> tuple[dict, dict, dict]:
    config = _flatten(dict(getattr(run, "config", {}) or {}))
    summary_obj = getattr(run, "summary", {}) or {}
    summary_dict = getattr(summary_obj, "_json_dict", None)
    summary = _flatten(dict(summary_dict if isinstance(summary_dict, Mapping) else summary_obj))
    meta = {"name": getattr(run, "name", None), "group": getattr(run, "group", None),
            "id": getattr(run, "id", None), "state": getattr(run, "state", None),
            "created": getattr(run, "created_at", None)}
    return config, summary, meta


def _csv_run(row: Mapping) -> tuple[dict, dict, dict]:
    clean = {str(k): v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
    meta = {"name": clean.pop("Name", None), "group": clean.pop("Group", None), "id": clean.pop("ID", None),
            "state": clean.pop("State", None), "created": clean.pop("Created", None)}
    return clean, clean, meta  # a CSV export holds config and summary side by side (dotted keys)


def _first(flat: Mapping, *names):
    for n in names:
        if n in flat and flat[n] is not None and not (isinstance(flat[n], float) and math.isnan(flat[n])):
            return flat[n]
    return None


def _wandb_row(config: dict, summary: dict, meta: dict) -> dict:
    where = f"W&B run {meta.get('name') or meta.get('id')!r}"
    row: dict = {"key": _first(config, "key", "job.key") or meta.get("id") or meta.get("name"),
                 "status": "failed" if str(meta.get("state") or "").lower() in ("failed", "crashed") else "completed",
                 "created": str(meta["created"]) if meta.get("created") is not None else None, "path": ""}
    for f in JOB_FIELDS:
        row[f] = _first(config, f"job.{f}", f"job/{f}", f, f"{f}.name")
    missing = [f for f in ("model", "compressor", "strategy") if row[f] is None]
    if missing:
        raise GacError(f"{where} has no {', '.join(missing)} in its config (looked for job.<field>, <field> and "
                       f"<field>.name); log the job fields to W&B config or load the results store instead")
    for f in TOP_FIELDS:
        v = _first(summary, f)
        row[f] = v if v is not None else _first(config, f)
    taken = {f"job.{f}" for f in JOB_FIELDS} | {f"job/{f}" for f in JOB_FIELDS} | set(JOB_FIELDS) | set(TOP_FIELDS)
    mixed = config is summary  # a CSV export: config and summary columns side by side
    for k, v in summary.items():
        if k in taken or k.startswith("_") or not _reads_as_number(v):
            continue
        if k.startswith(("metrics/", "metrics.")):
            name = k[len("metrics/"):]
        elif mixed and not _looks_like_metric(k):
            continue  # a numeric config column of the export
        else:
            name = k
        row[_metric_column(name)] = _number(v, f"metric {name!r} of {where}")
    for c in PLAN_COLUMNS:
        row.setdefault(c, None)
    row[CONFIG] = config_fields({k: v for k, v in config.items() if not k.startswith(("job.", "job/"))
                                 and (not mixed or not _looks_like_metric(k))
                                 and k not in TOP_FIELDS and not k.startswith(("metrics/", "metrics."))})
    row[TASK_DATA] = config_task_data(config)
    return row


_METRIC_HINT = re.compile(r"(ppl|_acc|_ms|@|latency|tokens_per_s)")


def _looks_like_metric(name: str) -> bool:
    return bool(_METRIC_HINT.search(name)) and "." not in name.split("@")[0]


def _reads_as_number(v) -> bool:
    """A W&B value that is a number (or text that reads as one), NaN excepted (:func:`gac.results.query.number_of`)."""
    n = number_of(v)
    return n is not None and not math.isnan(n)
