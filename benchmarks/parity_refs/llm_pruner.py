"""LLM-Pruner's reference procedure (MLP channels), re-implemented independently of gac (parity row for issue #13).

Written from the paper (Ma et al., "LLM-Pruner: On the Structural Pruning of Large Language Models", NeurIPS 2023)
and the authors' ``horseee/LLM-Pruner`` defaults (``hf_prune.py`` / ``llama3.py`` with ``--pruner_type taylor
--block_wise``: ``--taylor param_first``, ``--grouping_strategy sum``, ``--block_mlp_layer_start 3
--block_mlp_layer_end 31``, ``--iterative_steps 1``, no ``--global_pruning``; ``LLMPruner/pruner/hf_llama_pruner.py``
``TaylorImportance``; ``torch_pruning/pruner/algorithms/metapruner.py`` ``prune_local``). It shares no compression
code with gac; it uses only plain torch.

1. **One gradient**: the whole calibration batch in one forward, ``loss = model(x, labels=x).loss`` (the mean
   next-token loss over the batch), one backward.
2. **Importance** (``param_first``, group reduction ``sum``): channel ``c`` of an MLP scores
   ``sum_j |W_gate[c, j] G_gate[c, j]| + sum_j |W_up[c, j] G_up[c, j]| + sum_i |W_down[i, c] G_down[i, c]|``.
3. **Pruning** (local, one step): every layer of ``range(3, 31)`` (for an L-layer model
   ``range(floor(3 L / 32), L - ceil(L / 32))``) drops its ``width - int(width * (1 - ratio))`` least important
   channels from gate/up rows and down columns.

Only the MLPs are pruned: the reference's block-wise mode also prunes attention heads in the same layers, gac's
LLM-Pruner (like the GAC paper) prunes MLP channels only, and the parity rows compare the same units.

    python benchmarks/parity_refs/llm_pruner.py --ratios 0.15 0.30      # rows of the parity protocol (see --help)
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


def default_layers(n_layers: int) -> list[int]:
    """``range(3, 31)`` of a 32-layer Llama, scaled to ``n_layers``."""
    return list(range((3 * n_layers) // 32, n_layers - math.ceil(n_layers / 32)))


def channel_importance(model, calib_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """``param_first`` importance of every MLP channel of ``layers`` from one batch-mean gradient."""
    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad():
            model(input_ids=calib_ids, labels=calib_ids, use_cache=False).loss.backward()
        out = {}
        with torch.no_grad():
            for i in layers:
                mlp = model.model.layers[i].mlp
                g, u, d = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
                out[i] = ((g * g.grad).abs().sum(1) + (u * u.grad).abs().sum(1) + (d * d.grad).abs().sum(0)).double()
    finally:
        model.zero_grad(set_to_none=True)
        for p, f in flags.items():
            p.requires_grad_(f)
    return out


def _narrow(lin: nn.Linear, idx: torch.Tensor, dim: int) -> nn.Linear:
    W = lin.weight.detach().index_select(dim, idx)
    new = nn.Linear(W.shape[1], W.shape[0], bias=lin.bias is not None, dtype=W.dtype, device=W.device)
    with torch.no_grad():
        new.weight.copy_(W)
        if lin.bias is not None:
            new.bias.copy_(lin.bias if dim == 1 else lin.bias.index_select(0, idx))
    return new


def reference(model, tokenizer, calib_ids: torch.Tensor, ratio: float, layers: list[int] | None = None) -> dict:
    """LLM-Pruner's default procedure (MLP channels) at channel ratio ``ratio`` on a copy of ``model``."""
    m = copy.deepcopy(model)
    m.eval()
    layers = default_layers(len(m.model.layers)) if layers is None else list(layers)
    imp = channel_importance(m, calib_ids, layers)
    kept = dense = 0
    widths = {}
    for i in layers:
        mlp = m.model.layers[i].mlp
        width = mlp.gate_proj.out_features
        n_pruned = width - int(width * (1 - ratio))
        pruned = torch.argsort(imp[i])[:n_pruned]
        mask = torch.ones(width, dtype=torch.bool)
        mask[pruned] = False
        keep = mask.nonzero().flatten().to(mlp.gate_proj.weight.device)
        per_channel = mlp.gate_proj.in_features + mlp.up_proj.in_features + mlp.down_proj.out_features
        mlp.gate_proj = _narrow(mlp.gate_proj, keep, 0)
        mlp.up_proj = _narrow(mlp.up_proj, keep, 0)
        mlp.down_proj = _narrow(mlp.down_proj, keep, 1)
        kept += per_channel * int(keep.numel())
        dense += per_channel * width
        widths[i] = int(keep.numel())
    notes = (f"LLM-Pruner reference: param_first Taylor on one batch-mean gradient ({calib_ids.shape[0]} x "
             f"{calib_ids.shape[1]} tokens), local uniform pruning of the MLPs of layers {layers[0]}..{layers[-1]}; "
             f"widths {widths}; attention heads not pruned")
    return {"model": m, "kept_params": int(kept), "dense_params": int(dense), "notes": notes}

