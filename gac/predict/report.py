"""Predictions for a model and its plans, as a document and a table (``gac predict``, the bench's predicted column)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gac.errors import GacError
from gac.hashing import digest
from gac.io import conf_dir
from gac.predict.predictor import KIND_LABELS, KINDS, STEP, Predictor, check_llama_shaped
from gac.registry import BASELINE_LABEL, NAMED_MODELS

CONF_MODEL_DIR = conf_dir() / "model"
LABEL = "predicted, {gpu}, from published kernel data"


def column_label(gpu: str) -> str:
    """The label every predicted number carries (never mistaken for a measurement)."""
    return LABEL.format(gpu=gpu.upper())


def resolve_model(model: str):
    """``(name, transformers config)`` of a model given as a ``conf/model`` name (``llama3_8b``: its ``arch`` block,
    no weights, offline), a ``conf/model``-style YAML file, ``tiny``, a local HF/gac directory or a hub id."""
    from gac.compression.structure import architecture

    m = str(model)
    path = Path(m).expanduser()
    conf = CONF_MODEL_DIR / f"{m}.yaml"
    yml = path if path.suffix in (".yaml", ".yml") and path.is_file() else conf if conf.is_file() else None
    if yml is not None:
        try:
            doc = yaml.safe_load(yml.read_text()) or {}
        except yaml.YAMLError as e:
            raise GacError(f"model config {str(yml)!r} is not valid YAML ({str(e).splitlines()[0]})") from None
        if doc.get("arch"):
            return str(doc.get("name") or m), architecture(doc.get("spec", m), random_weights=True, arch=doc["arch"])
        return str(doc.get("name") or m), architecture(doc.get("spec", m))
    if path.suffix in (".yaml", ".yml"):
        raise GacError(f"model config {m!r} does not exist")
    known = sorted(p.stem for p in CONF_MODEL_DIR.glob("*.yaml")) if CONF_MODEL_DIR.is_dir() else []
    if not path.exists() and "/" not in m and m not in NAMED_MODELS:
        from gac.errors import unknown_name

        raise unknown_name("model config (a conf/model name, a YAML file, a model directory or a hub id)", m, known)
    return m, architecture(m)


def load_plan(path: str, compressor: str | None) -> tuple[dict, str]:
    """``(dims, compressor)`` of a plan file (``gac align -o``, a job record's ``plan``, or any ``{"dims": ...}``)."""
    from gac.io import read_json

    doc = read_json(path, "plan file")
    if isinstance(doc, dict) and isinstance(doc.get("plan"), dict):  # a job record
        comp = compressor or (doc.get("job") or {}).get("compressor")
        doc = doc["plan"]
    else:
        comp = compressor or (doc.get("compressor") if isinstance(doc, dict) else None)
    dims = doc.get("dims") if isinstance(doc, dict) else None
    if not isinstance(dims, dict) or not dims:
        raise GacError(f"plan file {str(path)!r} has no 'dims' object; write it with `gac align ... -o PLAN.json`")
    if not comp:
        raise GacError(f"plan file {str(path)!r} does not name its compressor; pass --compressor (asvd, svd_llm, "
                       f"llm_pruner or palu)")
    return dims, str(comp)


GPU_MEMORY_GIB = 80  # the A100 80GB and H100 80GB the published kernel data come from


def weights_gib(structure) -> float:
    """The structure's weights in GiB at its dtype (tied weights once), from the meta skeleton."""
    return sum(p.numel() * p.element_size() for p in structure.skeleton().parameters()) / 2**30


def _max_batch(seq_len: int, vocab: int) -> int:
    return max(1, int(GPU_MEMORY_GIB * 2**30 // max(1, seq_len * vocab * 2)))


def predict_document(gpu: str, model: str, plans=(), compressor: str | None = None, options: dict | None = None,
                     seq_lens=(1024,), batch: int = 1, predictor: Predictor | None = None) -> dict:
    """Predicted prefill latency of ``model`` and of each plan (validated before anything is predicted)."""
    from gac.compression.structure import Structure
    from gac.predict.predictor import GPUS

    if predictor is None and str(gpu).strip().lower() not in GPUS:
        from gac.errors import unknown_name

        raise unknown_name("GPU (published kernel data exist for these)", str(gpu), GPUS)
    if batch < 1 or any(int(s) < 1 for s in seq_lens):
        raise GacError(f"--batch and --seq-len must be positive, got batch={batch} seq_len={list(seq_lens)}")
    name, config = resolve_model(model)
    limit = getattr(config, "max_position_embeddings", None)
    for s in seq_lens:
        if isinstance(limit, int) and s > limit:
            raise GacError(f"--seq-len {s} is above {name}'s maximum sequence length {limit}")
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    logits_gib = batch * max(seq_lens) * vocab * 2 / 2**30  # the prefill's fp16 logits, one row per token
    if logits_gib > GPU_MEMORY_GIB:
        raise GacError(f"--batch {batch} at --seq-len {max(seq_lens)}: the prefill's logits alone ({batch} x "
                       f"{max(seq_lens)} tokens x {vocab} fp16) take {logits_gib:,.0f} GiB, more than an 80 GiB "
                       f"A100/H100 holds; predict a batch that runs (at most {_max_batch(max(seq_lens), vocab)})")
    check_llama_shaped(config)
    variants = [(BASELINE_LABEL, Structure(config, "float16"), None)]
    for f in plans:
        dims, comp = load_plan(f, compressor)
        try:
            s = Structure(config, "float16", comp, dict(options or {}), dims)
        except GacError as e:
            raise GacError(f"plan file {str(f)!r} does not fit {name} with {comp}: {e}") from None
        label = Path(f).stem
        if any(v[0] == label for v in variants):
            label = f"{label} ({len(variants)})"
        variants.append((label, s, {"plan_file": str(f), "compressor": comp,
                                    "dims_sha256": digest(json.dumps(dims, sort_keys=True), None)}))
    # a model whose weights and logits exceed the GPU's memory does not run there: no latency is predicted for it
    memory = {label: weights_gib(st) for label, st, _ in variants}
    fits = {label: w + logits_gib <= GPU_MEMORY_GIB for label, w in memory.items()}
    if not any(fits.values()):
        w = memory[BASELINE_LABEL]
        raise GacError(f"{name} does not fit one {GPU_MEMORY_GIB} GiB {str(gpu).upper()}: its fp16 weights take "
                       f"{w:,.1f} GiB" + (f" (the smallest plan's {min(memory.values()):,.1f} GiB)" if plans else "")
                       + ", so a prefill on one GPU cannot run and no latency is predicted; predict a smaller model "
                       "or a plan whose weights fit")
    pred = predictor or Predictor(gpu)  # after every input is checked: the calibration takes a second
    rows = []
    for s in seq_lens:
        base = None
        for label, st, info in variants:
            row = {"variant": label, "seq_len": int(s), "batch": batch, "weights_gib": memory[label],
                   "fits_memory": fits[label]}
            if fits[label]:
                p = pred.predict(st, batch, int(s))
                if label == BASELINE_LABEL:
                    base = p.total_ms
                row.update(p.to_json(), vs_baseline=None if base is None else p.total_ms / base - 1,
                           predicted_step=predicted_step(pred, st, batch, int(s), p.total_ms, limit))
            else:
                row.update(total_ms=None, vs_baseline=None,
                           does_not_fit=f"{memory[label]:,.1f} GiB of fp16 weights + {logits_gib:,.1f} GiB of "
                                        f"logits > {GPU_MEMORY_GIB} GiB")
            rows.append({**row, **({"plan": info} if info else {})})
    return {"kind": "prediction", "label": column_label(pred.gpu), "gpu": pred.gpu, "model": name, "rows": rows,
            "predictor": pred.describe()}


def predicted_step(pred: Predictor, structure, batch: int, seq_len: int, total_ms: float, limit=None) -> dict | None:
    """The rise of the prediction into ``seq_len`` from ``seq_len - 1``, or out of it to ``seq_len + 1``, where it
    exceeds :data:`~gac.predict.predictor.STEP`: ``{"from", "to", "rise"}``, else None. Such a step comes from the
    model's tile and wave quantization, a model assumption, and is marked as predicted wherever it is shown."""
    for a, b in ((seq_len - 1, seq_len), (seq_len, seq_len + 1)):
        if a < 1 or (isinstance(limit, int) and b > limit):
            continue
        ta = total_ms if a == seq_len else pred.predict(structure, batch, a).total_ms
        tb = total_ms if b == seq_len else pred.predict(structure, batch, b).total_ms
        if tb / ta - 1 > STEP:
            return {"from": a, "to": b, "rise": tb / ta - 1}
    return None


def format_prediction(doc: dict) -> str:
    ref = doc["predictor"]["launch_cost_from"]
    if ref.get("issue_from_gpu"):
        launch = (f"taken from the {str(ref['issue_from_gpu']).upper()} (no {doc['gpu'].upper()} end-to-end run "
                  f"outside the validation figures)")
    else:
        launch = f"solved from their Llama-3-8B baseline at S={ref.get('seq_len')} ({ref.get('prefill_ms')} ms)"
    head = (f"{doc['label']} (a model, not a measurement): {doc['model']} prefill, batch "
            f"{doc['rows'][0]['batch']}, fp16, HF eager\n"
            f"kernel data: the GAC authors' {doc['gpu'].upper()} figures; launch cost "
            f"{1e3 * doc['predictor']['issue_ms']:.1f} us/kernel {launch}")
    cols = ["variant", "S"] + [KIND_LABELS[k] for k in KINDS] + [KIND_LABELS["launch_wait"], "total ms", "vs baseline"]
    lines, notes = [], []
    for r in doc["rows"]:
        if r["total_ms"] is None:  # does not fit the GPU: no latency, never a number as if it ran
            lines.append([r["variant"], str(r["seq_len"])] + ["-"] * len(KINDS) + ["-", "does not fit", ""])
            notes.append(f"{r['variant']} at S={r['seq_len']}: does not fit one {doc['gpu'].upper()} "
                         f"({r['does_not_fit']}); it cannot run there, so no latency is predicted")
            continue
        vs = "" if r["variant"] == BASELINE_LABEL or r["vs_baseline"] is None else f"{100 * r['vs_baseline']:+.1f}%"
        step = r.get("predicted_step")
        lines.append([r["variant"], str(r["seq_len"])] + [f"{r['by_kind_ms'][k]:.2f}" for k in KINDS]
                     + [f"{r['launch_wait_ms']:.2f}", f"{r['total_ms']:.2f}" + (" *" if step else ""), vs])
        if step:
            notes.append(f"* {r['variant']} at S={r['seq_len']}: a PREDICTED step of {100 * step['rise']:+.1f}% "
                         f"from S={step['from']} to S={step['to']}: the model's tile/wave quantization (a model "
                         f"assumption, not a measurement; the GPU may not step there)")
    widths = [max(len(c), *(len(x[i]) for x in lines)) for i, c in enumerate(cols)]
    out = [head, "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths))),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths))) for r in lines]
    return "\n".join(out + notes)
