"""Alignment audit of any supported model or gac checkpoint: which dimensions break which alignment rule.

For every projection in the decoder layers the audit lists its GEMM dimensions (``in``, ``out``, and the ``rank``
of low-rank factors or the per-group ranks of PaLU projections) and, for each unit in (8, 16, 32), the dimensions
that are not multiples of it (paper Table 4: 8 for cuBLAS tier-1 kernels and SDPA's FlashAttention backend,
16 for Tensor Core K and L2 sectors, 32 for FA2 templates). It also checks the attention ``head_dim`` against
FlashAttention (``head_dim % 8 == 0`` and ``<= 256``) and the head sizes vLLM serves. A weight counts as aligned
at unit u when all its dimensions are multiples of u; the aligned fraction is over weights.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from gac.compression.modules import get_module, module_spec
from gac.errors import GacError

AUDIT_UNITS = (8, 16, 32)
VLLM_HEAD_SIZES = (64, 80, 96, 112, 128, 256)


def _dims(spec: dict) -> dict[str, int]:
    if spec["type"] == "lowrank":
        return {"in": spec["in"], "rank": spec["rank"], "out": spec["out"]}
    if spec["type"] == "grouped_lowrank":
        d = {"in": spec["in"]}
        for g, (r, o) in enumerate(zip(spec["ranks"], spec["outs"])):
            d[f"rank[{g}]"] = r
            d[f"out[{g}]"] = o
        return d
    return {"in": spec["in"], "out": spec["out"]}


def audit_specs(specs: dict[str, dict], head_dim: int, model_type: str = "", source: str = "") -> dict:
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
        "weights": rows,
    }


def audit_model(model: nn.Module, source: str = "") -> dict:
    from gac.compression.discovery import PROJECTIONS, discover

    layout = discover(model)
    specs = {n: module_spec(get_module(model, n)) for n in layout.linear_names(PROJECTIONS)}
    return audit_specs(specs, layout.head_dim, layout.model_type, source)


def load_structure(spec: str | os.PathLike) -> nn.Module:
    """A model with the right module shapes and no weights read where avoidable (meta device)."""
    import torch

    p = Path(spec)
    from gac.compression.checkpoint import build_skeleton, is_checkpoint, read_meta

    if p.is_dir() and is_checkpoint(p):
        return build_skeleton(read_meta(p), meta_device=True)
    if str(spec) in ("tiny", "tiny-untrained"):
        from gac.fixtures import load_tiny

        return load_tiny(trained=str(spec) == "tiny")[0]
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(spec))
    except (OSError, ValueError) as e:
        raise GacError(f"cannot read a model config from {str(spec)!r}: {str(e).splitlines()[0]}") from None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def audit(spec: str | os.PathLike) -> dict:
    return audit_model(load_structure(spec), source=str(spec))


def format_audit(rep: dict, all_weights: bool = False) -> str:
    lines = [
        f"{rep['source'] or 'model'} ({rep['model_type']}): {rep['n_weights']} weights; aligned "
        + ", ".join(f"mod {u}: {100 * f:.1f}%" for u, f in rep["aligned_fraction_by_unit"].items()),
        f"head_dim {rep['head_dim']}: FlashAttention {'ok' if rep['head_dim_flash_ok'] else 'NOT accepted (needs %8 == 0, <= 256)'}"
        f"; vLLM head sizes {'ok' if rep['head_dim_vllm_ok'] else 'unsupported'}",
        f"{'weight':<48} {'dims':<44} breaks",
    ]
    for r in rep["weights"]:
        broken = [f"mod{u}:{','.join(v)}" for u, v in r["misaligned"].items() if v]
        if not broken and not all_weights:
            continue
        dims = " ".join(f"{k}={v}" for k, v in r["dims"].items())
        lines.append(f"{r['name']:<48} {dims:<44} {' '.join(broken) or '-'}")
    if len(lines) == 3:
        lines.append("(every weight is aligned to 32)")
    return "\n".join(lines)
