"""Alignment audit of any supported model or gac checkpoint: which dimensions break which alignment rule.

For every projection in the decoder layers the audit lists its GEMM dimensions (``in``, ``out``, and the ``rank``
of low-rank factors or the per-group ranks of PaLU projections) and, for each unit in (8, 16, 32), the dimensions
that are not multiples of it (paper Table 4: 8 for cuBLAS tier-1 kernels and SDPA's FlashAttention backend,
16 for Tensor Core K and L2 sectors, 32 for FA2 templates). It also checks the attention ``head_dim`` against
FlashAttention (``head_dim % 8 == 0`` and ``<= 256``) and the head sizes vLLM serves. A weight counts as aligned
at unit u when all its dimensions are multiples of u; the aligned fraction is over weights.

Head counts (``heads``): what the attention kernels and serving engines require of the number of query heads H and
KV heads K, per layer as the weights give them (q_proj / k_proj outputs over ``head_dim``):

* grouped-query attention needs ``H % K == 0`` (each KV head serves H/K query heads: transformers' ``repeat_kv``,
  FlashAttention's MQA/GQA "number of heads in Q divisible by the number of heads in KV"); a head count that is not
  a whole number of heads (an output not a multiple of ``head_dim``) breaks every kernel;
* vLLM's tensor parallelism over TP GPUs shards heads: ``H % TP == 0`` (``ModelConfig.verify_with_parallel_config``:
  "Total number of attention heads (H) must be divisible by tensor parallel size (TP)") and ``K % TP == 0`` when
  ``K >= TP``, else ``TP % K == 0`` (KV heads replicated; the ``assert`` in every vLLM attention module, e.g.
  ``LlamaAttention``). The audit lists which TP in (1, 2, 4, 8) a model can be served at; SmolLM2's 9 query heads
  allow TP 1 only. Those TP sizes are a serving constraint, not a speed rule: a model that allows only TP 1 runs
  fine on one GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from gac.compression.modules import get_module, module_spec
from gac.errors import GacError
from gac.layout import CHECKPOINT_FILE
from gac.transformers_lock import transformers_lock
from gac.untrusted import NO_REMOTE_CODE, refuse_remote_code

AUDIT_UNITS = (8, 16, 32)
VLLM_HEAD_SIZES = (64, 80, 96, 112, 128, 256)
TP_SIZES = (1, 2, 4, 8)  # the tensor-parallel sizes of one node the head-count check reports


def vllm_tp_ok(heads: int, kv_heads: int, tp: int) -> bool:
    """Whether vLLM accepts ``heads`` query / ``kv_heads`` KV heads at tensor-parallel size ``tp`` (module docstring)."""
    if heads % tp:
        return False
    return kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0


def head_checks(rows: dict[int, dict[str, int]], head_dim: int, num_heads: int, num_kv_heads: int) -> dict:
    """The head counts of every layer (its q and k output rows, :func:`head_rows`) checked as the module docstring
    says."""
    counts = {(v.get("q", num_heads * head_dim) / head_dim if head_dim else 0,
               v.get("k", num_kv_heads * head_dim) / head_dim if head_dim else 0) for v in rows.values()} or {
        (num_heads, num_kv_heads)}
    problems = []
    for h, k in sorted(counts):
        if h != int(h) or k != int(k) or not h or not k:
            problems.append(f"q/k outputs of {h * head_dim:g}/{k * head_dim:g} are not whole heads of {head_dim}")
        elif int(h) % int(k):
            problems.append(f"{int(h)} query heads are not a multiple of {int(k)} KV heads (GQA needs H % K == 0)")
    whole = [(int(h), int(k)) for h, k in counts if h == int(h) and k == int(k) and h and k]
    tp = [t for t in TP_SIZES if whole and all(vllm_tp_ok(h, k, t) for h, k in whole)]
    return {"query_heads": sorted({h for h, _ in whole}), "kv_heads": sorted({k for _, k in whole}),
            "gqa_ok": not problems, "problems": problems, "vllm_tp_sizes": tp}


def _dims(spec: dict) -> dict[str, int]:
    if spec["type"] == "expert":
        return {"in": spec["in"], "width": spec["width"], "out": spec["out"]}
    if spec["type"] == "lowrank":
        return {"in": spec["in"], "rank": spec["rank"], "out": spec["out"]}
    if spec["type"] == "grouped_lowrank":
        d = {"in": spec["in"]}
        for g, (r, o) in enumerate(zip(spec["ranks"], spec["outs"])):
            d[f"rank[{g}]"] = r
            d[f"out[{g}]"] = o
        return d
    return {"in": spec["in"], "out": spec["out"]}


def audit_specs(specs: dict[str, dict], head_dim: int, model_type: str = "", source: str = "",
                num_heads: int | None = None, num_kv_heads: int | None = None,
                heads: dict[int, dict[str, int]] | None = None) -> dict:
    """The audit of one spec per GEMM (:func:`gemm_specs`); ``heads``: the q/k rows per layer (:func:`head_rows`)."""
    rows = []
    for name, spec in specs.items():
        dims = _dims(spec)
        mis = {str(u): sorted(k for k, v in dims.items() if v % u) for u in AUDIT_UNITS}
        rows.append({"name": name, "type": spec["type"], "dims": dims, "misaligned": mis})
    n = len(rows)
    frac = {str(u): (sum(1 for r in rows if not r["misaligned"][str(u)]) / n if n else 1.0) for u in AUDIT_UNITS}
    return {
        "source": source,
        "model_type": model_type,
        "n_weights": n,
        "aligned_fraction": frac["8"],
        "aligned_fraction_by_unit": frac,
        "head_dim": head_dim,
        "head_dim_flash_ok": head_dim % 8 == 0 and head_dim <= 256,
        "head_dim_vllm_ok": head_dim in VLLM_HEAD_SIZES,
        "heads": head_checks(heads or {}, head_dim, num_heads, num_kv_heads) if num_heads else None,
        "weights": rows,
    }


def gemm_specs(specs: dict[str, dict]) -> dict[str, dict]:
    """One spec per GEMM: a split module's parts each (``module[role]``), an expert block's experts each
    (``module.<e>``: ``in`` = hidden, ``width``, ``out`` = hidden), every other module as it is."""
    out: dict[str, dict] = {}
    for n, spec in specs.items():
        kind = spec.get("type")
        if kind == "split":
            for role, part in zip(spec["roles"], spec["parts"]):
                out[f"{n}[{role}]"] = part
        elif kind == "experts":
            for e, w in enumerate(spec["widths"]):
                out[f"{n}.{e}"] = {"type": "expert", "in": spec["hidden"], "width": w, "out": spec["hidden"]}
        elif kind == "fused_experts":
            for e in range(spec["experts"]):
                out[f"{n}.{e}"] = {"type": "expert", "in": spec["hidden"], "width": spec["width"], "out": spec["hidden"]}
        else:
            out[n] = spec
    return out


def head_rows(layout) -> dict[int, dict[str, int]]:
    """The q and k output rows of every layer, from the layout (compressors keep them: no head is pruned)."""
    out: dict[int, dict[str, int]] = {}
    for p in layout.projections:
        if p.role in ("q", "k"):
            out.setdefault(p.layer, {})[p.role] = p.out_features
    return out


def audit_model(model: nn.Module, source: str = "") -> dict:
    from gac.compression.discovery import discover

    layout = discover(model, check_heads=False)
    specs = gemm_specs({n: module_spec(get_module(model, n)) for n in layout.modules()})
    return audit_specs(specs, layout.head_dim, layout.model_type, source, layout.num_heads, layout.num_kv_heads,
                       head_rows(layout))


def _local_or_hub(spec: str | os.PathLike) -> Path | None:
    """The local directory ``spec`` names, None for a hub id; a one-line GacError for a path that is not a model."""
    s = str(spec)
    from gac.untrusted import check_model_path

    check_model_path(s)
    p = Path(s).expanduser()
    if p.exists():
        if not p.is_dir():
            raise GacError(f"{s!r} is a file; pass a model directory (config.json), a gac checkpoint directory, a hub "
                           f"id or 'tiny'")
        return p
    if s.startswith((".", "/", "~")) or s.count("/") > 1 or os.sep in s.replace("/", "") or s.endswith("/"):
        raise GacError(f"{s!r} does not exist; check the path (or pass a hub id such as meta-llama/Meta-Llama-3-8B, "
                       f"or 'tiny')")
    return None


@transformers_lock()
def load_structure(spec: str | os.PathLike) -> nn.Module:
    """A model with the right module shapes and no weights read where avoidable (meta device)."""
    import torch

    from gac.compression.checkpoint import is_checkpoint
    from gac.compression.checkpoint_format import read_meta
    from gac.compression.checkpoint_load import build_skeleton
    from gac.fixtures import is_named, named_config

    if is_named(spec):  # its pinned architecture: audits without building (or reading) the weights
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(named_config(str(spec)))
    p = _local_or_hub(spec)
    if p is not None and is_checkpoint(p):
        return build_skeleton(read_meta(p), meta_device=True)
    if p is not None and not (p / "config.json").is_file():
        raise GacError(f"{str(spec)!r} is a directory but neither a gac checkpoint ({CHECKPOINT_FILE}) nor a Hugging "
                       f"Face model (config.json); point at the directory that holds one of them")
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        refuse_remote_code(spec)
        if p is not None:
            from gac.untrusted import hf_config

            config = hf_config(p)  # one line for a config transformers refuses, and the fields no model runs with
        else:
            from gac.hub import check_hub_model

            check_hub_model(str(spec))  # the hub behind a closed proxy: one line now, not half a minute of retries
            config = AutoConfig.from_pretrained(str(spec), **NO_REMOTE_CODE)
            from gac.untrusted import check_config_values

            check_config_values(config, repr(str(spec)))
    except (OSError, ValueError) as e:
        raise GacError(f"cannot read a model config from {str(spec)!r}: {str(e).splitlines()[0]}") from None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def weights_specs(path: str | os.PathLike, recorded: dict[str, dict]) -> dict[str, dict | None]:
    """The spec of each module of ``recorded`` (name -> the spec the checkpoint's JSON records) as the checkpoint's
    WEIGHTS say (shapes from the safetensors header; no tensor is read). The recorded spec's type says which
    tensors to look for; the shapes come from the weights alone. None for a module the weights do not hold."""
    from safetensors import safe_open

    from gac.compression.checkpoint_format import read_meta

    p = Path(path)
    meta = read_meta(p)
    wfile = p / meta["weights"]["file"]
    try:
        with safe_open(str(wfile), framework="pt", device="cpu") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # noqa: BLE001 - SafetensorError / OSError: truncated, missing or foreign
        raise GacError(f"checkpoint {str(p)!r}: cannot read the shapes in {wfile.name} ({str(e).splitlines()[0][:200]}); "
                       f"the file is missing, truncated or not safetensors — copy the checkpoint again") from None
    return {n: _spec_from_shapes(shapes, n, spec if isinstance(spec, dict) else {}) for n, spec in recorded.items()}


def _spec_from_shapes(shapes: dict, n: str, hint: dict) -> dict | None:
    kind = hint.get("type")
    if kind == "split":
        parts = []
        for i, h in enumerate(hint.get("parts") or []):
            got = _spec_from_shapes(shapes, f"{n}.parts.{i}", h if isinstance(h, dict) else {})
            if got is None:
                return None
            parts.append(got)
        return {"type": "split", "in": parts[0]["in"] if parts else None, "roles": hint.get("roles"),
                "rows": hint.get("rows"), "parts": parts}
    if kind == "experts":
        widths, e = [], 0
        while f"{n}.gate_up.{e}.weight" in shapes:
            widths.append(shapes[f"{n}.gate_up.{e}.weight"][0] // 2)
            e += 1
        if not widths:
            return None
        return {"type": "experts", "hidden": shapes[f"{n}.gate_up.0.weight"][1], "widths": widths, "act": hint.get("act")}
    if kind == "fused_experts":
        gu = shapes.get(f"{n}.gate_up_proj")
        if gu is None or len(gu) != 3:
            return None
        return {"type": "fused_experts", "experts": gu[0], "hidden": gu[2], "width": gu[1] // 2}
    if f"{n}.weight" in shapes and len(shapes[f"{n}.weight"]) == 2:
        a, b = shapes[f"{n}.weight"]
        if kind == "conv1d":  # Conv1D stores in x out
            return {"type": "conv1d", "in": a, "out": b, "bias": f"{n}.bias" in shapes}
        return {"type": "linear", "in": b, "out": a, "bias": f"{n}.bias" in shapes}
    if f"{n}.down.weight" in shapes and f"{n}.up.weight" in shapes:
        r, i = shapes[f"{n}.down.weight"]
        return {"type": "lowrank", "in": i, "out": shapes[f"{n}.up.weight"][0], "rank": r,
                "bias": f"{n}.up.bias" in shapes}
    if f"{n}.down.weight" in shapes and f"{n}.ups.0.weight" in shapes:
        i = shapes[f"{n}.down.weight"][1]
        outs, ranks, g = [], [], 0
        while f"{n}.ups.{g}.weight" in shapes:
            o, r = shapes[f"{n}.ups.{g}.weight"]
            outs.append(o)
            ranks.append(r)
            g += 1
        return {"type": "grouped_lowrank", "in": i, "outs": outs, "ranks": ranks, "bias": f"{n}.bias" in shapes}
    return None


def audit_checkpoint(path: str | os.PathLike) -> dict:
    """Audit a gac checkpoint from its weights (the shapes in the safetensors header), flagging every module whose
    spec in the editable ``gac_checkpoint.json`` disagrees with them (``config_mismatch``)."""
    from gac.compression.checkpoint_format import read_meta
    from gac.compression.checkpoint_load import build_skeleton
    from gac.compression.discovery import discover

    meta = read_meta(path)
    recorded = meta.get("modules") or {}
    try:
        skeleton = build_skeleton(meta, meta_device=True)
    except GacError as e:
        raise GacError(f"checkpoint {str(path)!r}: {e}; copy the checkpoint again from its source") from None
    layout = discover(skeleton, check_heads=False)
    from_weights = weights_specs(path, recorded)
    mismatch = []
    for n, spec in recorded.items():
        got = from_weights[n]
        if got is None:
            mismatch.append({"name": n, "json": spec, "weights": None})
        elif got != spec:
            mismatch.append({"name": n, "json": spec, "weights": got})
    specs = {n: (w if w is not None else recorded[n]) for n, w in from_weights.items()}
    rep = audit_specs(gemm_specs(specs), layout.head_dim, layout.model_type, str(path), layout.num_heads,
                      layout.num_kv_heads, head_rows(layout))
    rep["shapes_from"] = "weights"
    rep["config_mismatch"] = mismatch
    return rep


def audit(spec: str | os.PathLike) -> dict:
    from gac.compression.checkpoint import is_checkpoint
    from gac.fixtures import is_named

    if not is_named(spec):
        p = _local_or_hub(spec)
        if p is not None and is_checkpoint(p):
            return audit_checkpoint(p)
    return audit_model(load_structure(spec), source=str(spec))


def mismatch_message(rep: dict) -> str | None:
    """One line describing a checkpoint whose JSON disagrees with its weights, or None."""
    bad = rep.get("config_mismatch") or []
    if not bad:
        return None

    def dims(spec):
        return "no weights" if spec is None else " ".join(f"{k}={v}" for k, v in _dims(spec).items())

    first = bad[0]
    return (f"{rep['source']}: {CHECKPOINT_FILE} disagrees with the weights for {len(bad)} module(s), e.g. "
            f"{first['name']}: json {dims(first['json'])}, weights {dims(first['weights'])}; the audit above is read "
            f"from the weights. The checkpoint will not load: re-save it from the model (or restore its JSON)")


def format_audit(rep: dict, all_weights: bool = False) -> str:
    lines = [
        f"{rep['source'] or 'model'} ({rep['model_type']}): {rep['n_weights']} weights; aligned "
        + ", ".join(f"mod {u}: {100 * f:.1f}%" for u, f in rep["aligned_fraction_by_unit"].items()),
        f"head_dim {rep['head_dim']}: FlashAttention {'ok' if rep['head_dim_flash_ok'] else 'NOT accepted (needs %8 == 0, <= 256)'}"
        f"; vLLM head sizes {'ok' if rep['head_dim_vllm_ok'] else 'unsupported'}",
    ]
    heads = rep.get("heads")
    if heads:
        lines.append(format_heads(heads))
    lines.append(f"{'weight':<48} {'dims':<44} breaks")
    header = len(lines)
    for r in rep["weights"]:
        broken = [f"mod{u}:{','.join(v)}" for u, v in r["misaligned"].items() if v]
        if not broken and not all_weights:
            continue
        dims = " ".join(f"{k}={v}" for k, v in r["dims"].items())
        lines.append(f"{r['name']:<48} {dims:<44} {' '.join(broken) or '-'}")
    if len(lines) == header:
        lines.append("(every weight is aligned to 32)")
    return "\n".join(lines)


def format_heads(heads: dict) -> str:
    """``heads 9 query / 3 KV: GQA ok; vLLM tensor parallel TP=1 only (H % TP, K % TP or TP % K)``."""
    h = "/".join(str(x) for x in heads["query_heads"]) or "?"
    k = "/".join(str(x) for x in heads["kv_heads"]) or "?"
    gqa = "GQA ok" if heads["gqa_ok"] else "NOT accepted: " + "; ".join(heads["problems"])
    tp = heads["vllm_tp_sizes"]
    if not tp:
        serve = "vLLM: no tensor-parallel size in 1, 2, 4, 8"
    elif len(tp) == len(TP_SIZES):
        serve = "vLLM tensor parallel TP=1, 2, 4, 8 all ok"
    else:
        no = [t for t in TP_SIZES if t not in tp]
        serve = (f"vLLM tensor parallel TP={', '.join(map(str, tp))} only (not {', '.join(map(str, no))}: needs "
                 f"query heads % TP == 0 and KV heads % TP == 0, or TP % KV heads == 0)")
    return f"heads {h} query / {k} KV: {gqa}; {serve}"
