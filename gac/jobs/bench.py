"""The side-by-side bench over a results store (``gac bench``, ``experiments/bench.py``, the after-sweep bench).

:func:`bench_store` selects records (sweep / experiment / record keys / any job or config key), turns each into a
:class:`~gac.compression.structure.Structure` (its model's architecture, dtype, compressor, options and plan dims —
no weights), adds the uncompressed baseline of the same model, validates everything, measures them with
:func:`gac.evaluation.bench.run_bench` and writes one bench record to ``<results_dir>/bench/<key>.json``. The key
is a hash of the measured record keys (and plan contents), the device, the points and the protocol: running the
same bench again returns the stored one (``force`` measures again, beside it). Nothing is written on bad input.

:func:`bench_from_config` is the same from a plain config dict (``conf/bench.yaml``); :func:`bench_after_sweep`
runs it when a multirun ends (in this process for a local launcher, as one more Slurm job for a Slurm launcher).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gac.errors import GacError
from gac.results import ResultsStore, config_key

log = logging.getLogger(__name__)

JOB_KEYS = ("model", "compressor", "proxy", "strategy", "ratio", "unit", "gpu", "seq_len", "experiment", "sweep")
BENCH_SCHEMA = 1
CONF_NAME = "bench"


# ---------------------------------------------------------------------------------------------- selection
def parse_where(items: Sequence[str] | dict | None) -> dict[str, str]:
    """``["compressor=asvd", "ratio=0.15"]`` (or a dict) -> ``{"compressor": "asvd", "ratio": "0.15"}``."""
    if not items:
        return {}
    if isinstance(items, dict):  # Hydra turns +where.compressor.options.alpha=0.5 into nested dicts
        out: dict = {}

        def flat(d, prefix=""):
            for k, v in d.items():
                if isinstance(v, dict) and v:
                    flat(v, f"{prefix}{k}.")
                else:
                    out[f"{prefix}{k}"] = v

        flat(items)
        return out
    out = {}
    for it in items:
        k, sep, v = str(it).partition("=")
        if not sep or not k.strip():
            raise GacError(f"filter {it!r} is not KEY=VALUE; e.g. --where compressor=asvd --where ratio=0.15")
        out[k.strip()] = v.strip()
    return out


_MISSING = object()


def _lookup(rec: dict, key: str):
    """A record's value for a filter key: a job field, ``key``, or a dotted config path (``compressor.options.alpha``
    or ``config.compressor.options.alpha``)."""
    if key in JOB_KEYS:
        return (rec.get("job") or {}).get(key, _MISSING)
    if key == "key":
        return rec.get("key", _MISSING)
    cur = rec.get("config") or {}
    for part in key.removeprefix("config.").split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _matches(value, want) -> bool:
    if value is None or value is _MISSING:
        return str(want).lower() in ("none", "null", "") and value is None
    if isinstance(value, bool):
        return str(want).lower() in (str(value).lower(), str(int(value)))
    if isinstance(value, (int, float)):
        try:
            return math.isclose(float(value), float(want), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True) == str(want) or str(value) == str(want)
    return str(value) == str(want)


def _latest_per_key(records: list[dict]) -> list[dict]:
    best: dict[str, dict] = {}
    for r in records:
        k = r.get("key")
        if k not in best or str(r.get("created", "")) >= str(best[k].get("created", "")):
            best[k] = r
    return list(best.values())


def select_records(records: list[dict], where: dict | None = None, sweep: str | None = None,
                   experiment: str | None = None, keys: Sequence[str] | None = None) -> list[dict]:
    """The completed records matching every filter (latest per key). Unknown filter keys and an empty selection are
    errors that name the keys and values there are."""
    records = [r for r in records if r.get("status", "completed") == "completed"]
    if not records:
        raise GacError("the results store has no completed records; run the sweep first (python experiments/run.py -m ...)")
    filters = dict(where or {})
    if sweep is not None:
        filters["sweep"] = sweep
    if experiment is not None:
        filters["experiment"] = experiment
    for k in filters:
        if all(_lookup(r, k) is _MISSING for r in records):
            raise GacError(f"unknown filter key {k!r}: no record has it; use a job field ({', '.join(JOB_KEYS)}), "
                           f"'key', or a config path such as compressor.options.alpha")
    out = records
    if keys:
        wanted = set(keys)
        out = [r for r in out if r.get("key") in wanted]
    for k, v in filters.items():
        out = [r for r in out if _matches(_lookup(r, k), v)]
    if not out:
        avail = {k: sorted({str(_lookup(r, k)) for r in records if _lookup(r, k) is not _MISSING})[:12] for k in filters}
        what = ", ".join(f"{k}={v!r}" for k, v in filters.items()) or (f"{len(keys)} record keys" if keys else "no filter")
        raise GacError(f"no completed record matches {what}; values in the store: "
                       f"{'; '.join(f'{k}: {v}' for k, v in avail.items()) or 'none'}")
    return _latest_per_key(out)


# ---------------------------------------------------------------------------------------------- records -> variants
def _cfg(rec: dict, path: str, default=None):
    cur = rec.get("config") or {}
    for p in path.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return default
        cur = cur[p]
    return cur


def model_identity(rec: dict) -> dict:
    """What fixes a record's architecture: the model name, spec, random_weights and arch."""
    spec = _cfg(rec, "model.spec")
    if spec is None:
        raise GacError(f"record {rec.get('key')} has no config.model.spec; it was not written by a gac job and cannot "
                       f"be benched (re-run the job)")
    return {"name": (rec.get("job") or {}).get("model"), "spec": str(spec),
            "random_weights": bool(_cfg(rec, "model.random_weights", False)),
            "arch": _cfg(rec, "model.arch") if _cfg(rec, "model.random_weights", False) else None}


def record_dtype(rec: dict) -> str:
    """The dtype a record's job ran in (the rule of :func:`gac.dtypes.job_dtype`: gpu.dtype > model.dtype > auto)."""
    from gac.dtypes import job_dtype

    return job_dtype(_cfg(rec, "gpu.dtype"), _cfg(rec, "model.dtype"), _cfg(rec, "gpu.device") or "cpu")


def _is_baseline(rec: dict) -> bool:
    job = rec.get("job") or {}
    return job.get("compressor") == "none" or job.get("strategy") == "baseline"


def _options(rec: dict) -> dict:
    recipe = ((rec.get("compression") or {}).get("recipe") or {})
    opts = recipe.get("options")
    return dict(opts) if isinstance(opts, dict) else dict(_cfg(rec, "compressor.options", {}) or {})


def _label(rec: dict) -> str:
    from gac.analysis.tables import method_label

    job = rec.get("job") or {}
    return method_label(job.get("compressor"), job.get("strategy"))


def _sibling_id(rec: dict) -> str:
    """Everything but the strategy (and its alignment settings): records with the same id are siblings."""
    job = dict(rec.get("job") or {})
    for k in ("strategy", "unit", "experiment", "sweep"):
        job.pop(k, None)
    return json.dumps([job, _options(rec), _cfg(rec, "allocation"), _cfg(rec, "calibration"),
                       _cfg(rec, "align.knapsack_score")], sort_keys=True, default=str)


def build_variants(selected: list[dict], all_records: list[dict], dtype: str | None = None):
    """``(variants, model identity, dtype)`` for the selected records plus the baseline of their model."""
    from gac.compression.structure import Structure, architecture
    from gac.evaluation.bench import Variant

    ids = {}
    for r in selected:
        mid = model_identity(r)
        ids.setdefault(json.dumps(mid, sort_keys=True, default=str), []).append(r)
    if len(ids) > 1:
        names = sorted({json.loads(k)["name"] or json.loads(k)["spec"] for k in ids})
        raise GacError(f"the selection holds records of {len(ids)} different models ({', '.join(map(str, names))}); "
                       f"bench one model at a time: add --where model=NAME")
    ident = json.loads(next(iter(ids)))
    dtypes = sorted({record_dtype(r) for r in selected})
    if dtype is None:
        if len(dtypes) > 1:
            raise GacError(f"the selected records ran in several dtypes {dtypes}; choose one with --dtype")
        dtype = dtypes[0]
    config = architecture(ident["spec"], ident["random_weights"], ident["arch"])
    comp = [r for r in selected if not _is_baseline(r)]
    bases = [r for r in selected if _is_baseline(r)]
    if not bases:  # the baseline of the same model elsewhere in the store (its structure is all that matters)
        same = json.dumps(ident, sort_keys=True, default=str)
        bases = [r for r in all_records if r.get("status", "completed") == "completed" and _is_baseline(r)
                 and json.dumps(model_identity(r), sort_keys=True, default=str) == same]
    base_rec = max(bases, key=lambda r: str(r.get("created", ""))) if bases else None
    if not comp:
        raise GacError("the selection holds only the baseline; select compressed records too (e.g. --sweep or --where)")
    for r in comp:
        if not isinstance(r.get("plan"), dict) or not isinstance(r["plan"].get("dims"), dict) or not r["plan"]["dims"]:
            job = r.get("job") or {}
            raise GacError(f"record {r.get('key')} ({job.get('compressor')}, {job.get('strategy')}) has no plan; a bench "
                           f"builds each variant from its plan's dims — re-run that job, or leave it out with --where")
    structures = []
    for r in comp:
        job = r.get("job") or {}
        try:
            s = Structure(config, dtype, job.get("compressor"), _options(r), r["plan"]["dims"])
        except GacError as e:
            raise GacError(f"record {r.get('key')} ({job.get('compressor')}, {job.get('strategy')}): {e}") from None
        structures.append(s)
    labels = _unique_labels(comp)
    by_id = {}
    for r, lab in zip(comp, labels):
        if (r.get("job") or {}).get("strategy") == "unaligned":
            by_id.setdefault(_sibling_id(r), lab)
    variants = [Variant("Baseline", Structure(config, dtype), key=base_rec.get("key") if base_rec else None,
                        info={"model": ident["name"], "strategy": "baseline"})]
    order = sorted(range(len(comp)), key=lambda i: _order(comp[i]))
    for i in order:
        r, s, lab = comp[i], structures[i], labels[i]
        job = r.get("job") or {}
        sib = by_id.get(_sibling_id(r)) if job.get("strategy") != "unaligned" else None
        info = {k: job.get(k) for k in ("model", "strategy", "ratio", "proxy", "unit")}
        info["aligned_fraction"] = r.get("aligned_fraction")
        info["plan_params"] = r["plan"].get("params")
        variants.append(Variant(lab, s, key=r.get("key"), info=info, sibling=sib if sib != lab else None))
    return variants, ident, dtype


def _order(rec: dict):
    from gac.analysis.tables import _method_order

    job = rec.get("job") or {}
    return (_method_order(job.get("compressor"), job.get("strategy")), float(job.get("ratio") or 0),
            str(job.get("proxy")), int(job.get("unit") or 0), str(rec.get("key")))


def _unique_labels(recs: list[dict]) -> list[str]:
    labels = [_label(r) for r in recs]
    for field in ("ratio", "proxy", "unit"):
        dup = {lab for lab in labels if labels.count(lab) > 1}
        if not dup:
            break
        labels = [f"{lab}, {field} {(r.get('job') or {}).get(field)}" if lab in dup else lab for lab, r in zip(labels, recs)]
    dup = {lab for lab in labels if labels.count(lab) > 1}
    return [f"{lab} [{r.get('key')[:8]}]" if lab in dup else lab for lab, r in zip(labels, recs)]


# ---------------------------------------------------------------------------------------------- plan files
def plan_variants(plans: Sequence[str], model: str, compressor: str, options: dict | None = None,
                  dtype: str | None = None):
    """Variants from plan JSON files (``gac align -o PLAN.json``, or any ``{"dims": {target: dim}}``) for ``model``
    (a model spec: tiny, a local dir, a hub id) compressed by ``compressor`` with ``options``."""
    from gac.compression.structure import Structure, architecture
    from gac.evaluation.bench import Variant
    from gac.io import read_json

    if not model or not compressor:
        raise GacError("--plan needs --model (the model the plan is for: tiny, a local dir or a hub id) and "
                       "--compressor (the compressor whose modules the plan sizes)")
    config = architecture(model)
    dtype = dtype or "float32"
    variants = [Variant("Baseline", Structure(config, dtype), info={"model": model, "strategy": "baseline"})]
    digests = []
    for f in plans:
        doc = read_json(f, "plan file")
        dims = doc.get("dims") if isinstance(doc, dict) else None
        if not isinstance(dims, dict) or not dims:
            raise GacError(f"plan file {str(f)!r} has no 'dims' object; write it with `gac align ... -o PLAN.json`")
        try:
            s = Structure(config, dtype, compressor, dict(options or {}), dims)
        except GacError as e:
            raise GacError(f"plan file {str(f)!r}: {e}") from None
        label = Path(f).stem
        if any(v.label == label for v in variants):
            label = f"{label} ({len(variants)})"
        variants.append(Variant(label, s, info={"model": model, "strategy": doc.get("strategy"), "plan_file": str(f),
                                                "plan_params": doc.get("params")}))
        digests.append(hashlib.sha256(json.dumps(dims, sort_keys=True).encode()).hexdigest()[:16])
    by_strategy = {v.info.get("strategy"): v.label for v in variants[1:]}
    for v in variants[1:]:
        if v.info.get("strategy") not in (None, "unaligned") and "unaligned" in by_strategy:
            v.sibling = by_strategy["unaligned"]
    return variants, {"name": model, "spec": model, "random_weights": False, "arch": None}, dtype, digests


# ---------------------------------------------------------------------------------------------- the bench
def bench_key(measured: Sequence[str], model: dict, dtype: str, device: dict, protocol: dict) -> str:
    """The bench record's key: what was measured (record keys / plan digests, model, dtype), where (device type and
    name) and how (points and protocol)."""
    return config_key({"measured": sorted(measured), "model": model, "dtype": str(dtype),
                       "device": {"type": device["type"], "name": device["name"]}, "protocol": protocol})


def bench_store(results_dir: str | os.PathLike | None, *, where=None, sweep: str | None = None,
                experiment: str | None = None, keys: Sequence[str] | None = None, plans: Sequence[str] = (),
                model: str | None = None, compressor: str | None = None, options: dict | None = None,
                device: str | None = None, dtype: str | None = None, points=None, rounds: int | None = None,
                warmup: int | None = None, iters: int | None = None, decode_tokens: int = 0, decode_prompt: int = 128,
                threads: int | None = None, seed: int = 0, bootstrap: int = 2000, memory: str = "auto",
                timer: str = "auto", profile: bool = True, force: bool = False, json_out: str | os.PathLike | None = None,
                json_force: bool = False, predict: str | None = None) -> dict:
    """Select, validate, measure and record one bench; returns the bench document (``skipped`` when it was done)."""
    import torch

    from gac.evaluation.bench import Protocol, check_device, run_bench

    if json_out and Path(json_out).exists() and not json_force:
        raise GacError(f"{str(json_out)!r} already exists; choose another --json path or pass --force")
    if predict is not None:
        from gac.predict.predictor import GPUS

        if str(predict).strip().lower() not in GPUS:
            raise GacError(f"--predict {predict!r}: predictions exist for {', '.join(GPUS)} (published kernel data); "
                           f"use one of them")
    store = None
    if results_dir is not None:
        root = Path(results_dir).expanduser()
        if not root.is_dir():
            raise GacError(f"results directory {str(root)!r} does not exist; give the results_dir your sweep wrote to")
        store = ResultsStore(root)
    if plans:
        variants, ident, dtype, measured = plan_variants(plans, model, compressor, options, dtype)
        selection = {"plans": [str(p) for p in plans], "model": model, "compressor": compressor, "options": options}
        devs = []
        seqs = []
    else:
        if store is None:
            raise GacError("give a results directory (gac bench RESULTS_DIR) or plan files (--plan)")
        all_records = list(store.iter_records())
        sel = select_records(all_records, parse_where(where), sweep, experiment, keys)
        variants, ident, dtype = build_variants(sel, all_records, dtype)
        measured = [v.key for v in variants[1:]]
        selection = {"where": parse_where(where), "sweep": sweep, "experiment": experiment,
                     "keys": list(keys) if keys else None}
        devs = sorted({str(_cfg(r, "gpu.device") or "cpu") for r in sel})
        seqs = sorted({int((r.get("job") or {}).get("seq_len")) for r in sel if (r.get("job") or {}).get("seq_len")})
    if device is None:
        if len(devs) > 1:
            raise GacError(f"the selected records ran on several devices {devs}; choose one with --device")
        device = devs[0] if devs else "cpu"
    dev = check_device(device)
    if points is None:
        points = [(1, s) for s in seqs] or [(1, min(1024, variants[0].structure.max_length or 1024))]
    protocol = Protocol(points=tuple(tuple(p) for p in points), rounds=rounds, warmup=warmup, iters=iters,
                        decode_tokens=decode_tokens, decode_prompt=decode_prompt, seed=seed, bootstrap=bootstrap,
                        threads=threads, memory=memory, profile=profile, timer=timer)
    resolved = protocol.resolved(dev.type)
    limit = variants[0].structure.max_length
    for _, s in resolved["points"]:
        if limit is not None and s > limit:
            raise GacError(f"bench seq_len {s} is above the model's maximum sequence length ({limit}); use at most {limit}")
    from gac.evaluation.latency import device_name

    dev_id = {"type": dev.type, "name": device_name(dev)}
    key_protocol = {k: resolved[k] for k in ("points", "rounds", "warmup", "iters", "decode_tokens", "decode_prompt",
                                             "decode_warmup", "decode_iters", "seed", "bootstrap", "threads", "timer",
                                             "profile")}
    key_protocol["points"] = [list(p) for p in resolved["points"]]
    key = bench_key(measured, ident, dtype, dev_id, key_protocol)
    if store is not None and store.bench_path(key).exists() and not force:
        from gac.io import read_json

        doc = read_json(store.bench_path(key), "bench record")
        doc["skipped"] = True
        doc["_path"] = str(store.bench_path(key))
        log.info("bench %s is done (%s); skipping (force re-measures it)", key, doc["_path"])
        if predict is not None and (doc.get("predicted") or {}).get("gpu") != str(predict).lower():
            doc["predicted"] = predicted_points(variants, resolved["points"], predict)  # shown, not stored
        if json_out:
            _write_json(json_out, doc, json_force)
        return doc
    log.info("bench %s: %d variants of %s on %s (%s)", key, len(variants), ident["name"], dev, dtype)
    doc = run_bench(variants, protocol, dev)
    doc = {"schema": BENCH_SCHEMA, "kind": "bench", "key": key, "model": ident, "records": measured,
           "baseline_record": variants[0].key, "selection": selection, **doc, "provenance": _provenance(dev)}
    if predict is not None:
        doc["predicted"] = predicted_points(variants, resolved["points"], predict)
    if torch.device(dev).type == "cuda":
        doc["provenance"]["device_name"] = doc["device"]["name"]
    if store is not None:
        from gac.io import read_json

        path = store.write_bench(key, doc)
        doc = read_json(path, "bench record")  # exactly what was stored (created added)
        doc["_path"] = str(path)
    if json_out:
        _write_json(json_out, doc, json_force)
    return doc


def predicted_points(variants, points, gpu: str) -> dict:
    """Every variant's predicted prefill ms on ``gpu`` (gac.predict, published kernel data) at the bench's points."""
    from gac.metrics import prefill_point
    from gac.predict import Predictor
    from gac.predict.report import column_label

    pred = Predictor(gpu)
    out = {"gpu": pred.gpu, "label": column_label(pred.gpu), "issue_ms": pred.issue_ms, "points": {}}
    for b, s in points:
        name = prefill_point(int(b), int(s))  # the bench's own point names, so records and tables match
        vs = {}
        for v in variants:
            vs[v.label] = {"ms": pred.predict(v.structure, int(b), int(s)).total_ms, "record_key": v.key}
        out["points"][name] = {"batch": int(b), "seq_len": int(s), "baseline_ms": vs[variants[0].label]["ms"],
                               "variants": vs}
    return out


def format_predicted(doc: dict) -> str:
    """The predicted column beside what the bench measured (a model of another GPU, not a measurement)."""
    pr = doc.get("predicted")
    if not pr:
        return ""
    measured = {}
    for v in doc.get("variants") or []:
        for name, e in (v.get("points") or {}).items():
            measured[(v.get("label"), name)] = e.get("median_ms")
    dev = (doc.get("device") or {}).get("name") or "this device"
    lines = [f"\n{pr['label']} (a model of that GPU, not a measurement) beside what {dev} measured:"]
    for name, p in pr["points"].items():
        lines.append(f"{name}:")
        lines.append(f"  {'variant':<28} {'measured ms':>12} {'predicted ms':>13} {'predicted vs baseline':>22}")
        for label, v in p["variants"].items():
            m = measured.get((label, name))
            rel = "" if v["ms"] == p["baseline_ms"] and label == next(iter(p["variants"])) else \
                f"{100 * (v['ms'] / p['baseline_ms'] - 1):+.1f}%"
            lines.append(f"  {label:<28} {'' if m is None else f'{m:.2f}':>12} {v['ms']:>13.2f} {rel:>22}")
    return "\n".join(lines)


def _write_json(path, doc, force):
    from gac.io import write_json_atomic

    write_json_atomic(path, {k: v for k, v in doc.items() if not k.startswith("_")}, overwrite=force)


def _provenance(dev) -> dict:
    from gac.evaluation.report import provenance

    p = provenance(device=str(dev))
    p["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    return p


# ---------------------------------------------------------------------------------------------- config / Hydra
def bench_from_config(cfg: dict) -> dict:
    """Run :func:`bench_store` from a plain config (``conf/bench.yaml`` resolved); print the table; return the doc."""
    known = {"results_dir", "where", "sweep", "experiment", "keys", "plans", "model", "compressor", "options", "device",
             "dtype", "points", "rounds", "warmup", "iters", "decode_tokens", "decode_prompt", "threads", "seed",
             "bootstrap", "memory", "timer", "profile", "force", "json", "quiet", "verbose", "predict"}
    extra = sorted(set(cfg) - known - {"hydra"})
    if extra:
        raise GacError(f"bench config: unknown key(s) {extra}; known: {sorted(known)}")
    from gac.progress import quiet_libraries, set_quiet

    if cfg.get("quiet") is not None:
        set_quiet(bool(cfg["quiet"]))
    quiet_libraries(verbose=bool(cfg.get("verbose", False)))
    doc = bench_store(
        cfg.get("results_dir"), where=cfg.get("where"), sweep=cfg.get("sweep"), experiment=cfg.get("experiment"),
        keys=cfg.get("keys") or None, plans=cfg.get("plans") or (), model=cfg.get("model"),
        compressor=cfg.get("compressor"), options=cfg.get("options"), device=cfg.get("device"),
        dtype=cfg.get("dtype"), points=cfg.get("points"), rounds=cfg.get("rounds"), warmup=cfg.get("warmup"),
        iters=cfg.get("iters"), decode_tokens=int(cfg.get("decode_tokens") or 0),
        decode_prompt=int(cfg.get("decode_prompt") or 128), threads=cfg.get("threads"), seed=int(cfg.get("seed") or 0),
        bootstrap=int(cfg.get("bootstrap") or 2000), memory=str(cfg.get("memory") or "auto"),
        timer=str(cfg.get("timer") or "auto"),
        profile=bool(cfg.get("profile", True)), force=bool(cfg.get("force", False)), json_out=cfg.get("json"),
        json_force=bool(cfg.get("force", False)), predict=cfg.get("predict"))
    print(describe(doc))
    return doc


def describe(doc: dict) -> str:
    from gac.evaluation.bench import format_bench

    head = ("bench already measured (force=true measures again): " if doc.get("skipped") else "bench: ") + \
        str(doc.get("_path") or doc.get("key"))
    return head + "\n" + format_bench(doc) + format_predicted(doc)


def compose_bench(overrides: Sequence[str] = ()) -> dict:
    """``conf/bench.yaml`` composed with ``overrides``, resolved, as a plain dict (tests, the after-sweep bench)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from gac.jobs.experiment import CONF_DIR

    try:
        if GlobalHydra.instance().is_initialized():
            cfg = compose(CONF_NAME, overrides=list(overrides))
        else:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose(CONF_NAME, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise GacError(f"bench config: {str(e).strip().splitlines()[0]}") from None
    return OmegaConf.to_container(cfg, resolve=True)


def bench_from_hydra(cfg) -> dict | None:
    """The body of ``experiments/bench.py``: bad input exits 2 with one line (in a multirun the error propagates so
    the launcher reports the job as failed)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        doc = bench_from_config(OmegaConf.to_container(cfg, resolve=True))
    except GacError as e:
        if multirun:
            raise
        print(f"experiments/bench.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    return {"key": doc.get("key"), "path": doc.get("_path")}


# ---------------------------------------------------------------------------------------------- after a sweep
def bench_after_sweep(config, keys: Sequence[str]) -> dict | None:
    """The bench a multirun asks for (``bench.after_sweep: true``) over its points' ``keys``, once every job ended.

    A local launcher runs it here; a Slurm launcher (submitit) submits it as one more job with the launcher's own
    settings (partition, GPUs, time) and waits for it. Returns the bench document, or None when nothing was done.
    """
    from omegaconf import OmegaConf

    results_dir = str(Path(str(config.get("results_dir", "results"))).expanduser().resolve())
    store = ResultsStore(results_dir)
    done = [k for k in keys if store.is_done(k)]
    missing = len(set(keys)) - len(set(done))
    if missing:
        log.warning("after-sweep bench: %d of the sweep's points have no record (failed or skipped); benching the rest",
                    missing)
    if not [k for k in done if not _is_baseline_key(store, k)]:
        log.warning("after-sweep bench: no compressed record to bench")
        return None
    bench = OmegaConf.to_container(config.bench, resolve=True) if config.get("bench") else {}
    overrides = [f"results_dir={results_dir}", f"keys=[{','.join(sorted(set(done)))}]",
                 *[str(o) for o in (bench.get("overrides") or [])]]
    cfg = compose_bench(overrides)
    launcher = OmegaConf.to_container(config.hydra.launcher, resolve=True)
    target = str(launcher.get("_target_", ""))
    if target.endswith("SlurmLauncher"):
        job = _submit(launcher, cfg, Path(str(config.hydra.sweep.dir)))
        print(f"after-sweep bench: submitted Slurm job {job.job_id}; waiting for it")
        doc = job.result()
        print(describe(doc))
        return doc
    return bench_from_config(cfg)


def _is_baseline_key(store: ResultsStore, key: str) -> bool:
    from gac.io import read_json

    return _is_baseline(read_json(store.record_path(key), "result record"))


def _submit(launcher: dict, cfg: dict, sweep_dir: Path):
    """Submit :func:`bench_from_config` as one Slurm job with the sweep launcher's settings (hydra-submitit's mapping)."""
    import submitit

    params = {k: v for k, v in launcher.items() if k != "_target_"}
    folder = str(sweep_dir / ".submitit" / "bench-%j")
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm",
                                     slurm_max_num_timeout=int(params.pop("max_num_timeout", 0) or 0))
    params.pop("submitit_folder", None)
    base = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name",
            "stderr_to_stdout"}
    params = {(k if k in base else f"slurm_{k}"): v for k, v in params.items() if v is not None}
    params.pop("slurm_array_parallelism", None)
    params["name"] = "gac-bench"
    executor.update_parameters(**params)
    return executor.submit(bench_from_config, cfg)
