"""What a bench measures: store records (or plan files) turned into :class:`~gac.evaluation.bench.Variant` s.

Each record becomes a :class:`~gac.compression.structure.Structure` (its model's architecture, dtype, compressor,
options and plan dims; no weights) labelled for its method, beside the uncompressed baseline of the same model; a
GAC variant names its unaligned sibling (the same job but for the strategy) so the bench reports their ratio.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from gac.errors import GacError
from gac.hashing import digest
from gac.registry import BASELINE_LABEL, BASELINE_STRATEGY
from gac.results.query import MISSING, config_value, is_baseline_record


def config_of(rec: dict, path: str, default=None):
    """The record's config value at a dotted ``path`` (:func:`gac.results.query.config_value`), or ``default``."""
    v = config_value(rec.get("config"), path)
    return default if v is MISSING else v


def model_identity(rec: dict) -> dict:
    """What fixes a record's architecture: the model name, spec, random_weights and arch."""
    spec = config_of(rec, "model.spec")
    if spec is None:
        raise GacError(f"record {rec.get('key')} has no config.model.spec; it was not written by a gac job and cannot "
                       f"be benched (re-run the job)")
    return {"name": (rec.get("job") or {}).get("model"), "spec": str(spec),
            "random_weights": bool(config_of(rec, "model.random_weights", False)),
            "arch": config_of(rec, "model.arch") if config_of(rec, "model.random_weights", False) else None}


def record_dtype(rec: dict) -> str:
    """The dtype a record's job ran in (the rule of :func:`gac.dtypes.job_dtype`: gpu.dtype > model.dtype > auto)."""
    from gac.dtypes import job_dtype

    return job_dtype(config_of(rec, "gpu.dtype"), config_of(rec, "model.dtype"), config_of(rec, "gpu.device") or "cpu")


def _options(rec: dict) -> dict:
    recipe = ((rec.get("compression") or {}).get("recipe") or {})
    opts = recipe.get("options")
    return dict(opts) if isinstance(opts, dict) else dict(config_of(rec, "compressor.options", {}) or {})


def _label(rec: dict) -> str:
    from gac.analysis.labels import method_label

    job = rec.get("job") or {}
    return method_label(job.get("compressor"), job.get("strategy"))


def _sibling_id(rec: dict) -> str:
    """Everything but the strategy (and its alignment settings): records with the same id are siblings."""
    job = dict(rec.get("job") or {})
    for k in ("strategy", "unit", "experiment", "sweep"):
        job.pop(k, None)
    return json.dumps([job, _options(rec), config_of(rec, "allocation"), config_of(rec, "calibration"),
                       config_of(rec, "align.knapsack_score")], sort_keys=True, default=str)


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
    comp = [r for r in selected if not is_baseline_record(r)]
    bases = [r for r in selected if is_baseline_record(r)]
    if not bases:  # the baseline of the same model elsewhere in the store (its structure is all that matters)
        same = json.dumps(ident, sort_keys=True, default=str)
        bases = [r for r in all_records if r.get("status", "completed") == "completed" and is_baseline_record(r)
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
    variants = [Variant(BASELINE_LABEL, Structure(config, dtype), key=base_rec.get("key") if base_rec else None,
                        info={"model": ident["name"], "strategy": BASELINE_STRATEGY})]
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
    from gac.analysis.labels import method_order

    job = rec.get("job") or {}
    return (method_order(job.get("compressor"), job.get("strategy")), float(job.get("ratio") or 0),
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
    variants = [Variant(BASELINE_LABEL, Structure(config, dtype), info={"model": model, "strategy": BASELINE_STRATEGY})]
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
        digests.append(digest(json.dumps(dims, sort_keys=True)))
    by_strategy = {v.info.get("strategy"): v.label for v in variants[1:]}
    for v in variants[1:]:
        if v.info.get("strategy") not in (None, "unaligned") and "unaligned" in by_strategy:
            v.sibling = by_strategy["unaligned"]
    return variants, {"name": model, "spec": model, "random_weights": False, "arch": None}, dtype, digests

