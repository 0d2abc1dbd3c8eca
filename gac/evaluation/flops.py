"""FLOPs of one prefill forward, counted from the module shapes (no tracing, no weights).

Convention (a multiply-add is 2 FLOPs; ``T = batch * seq_len`` tokens):

* ``nn.Linear(in, out)``: ``2 T in out``;
* :class:`~gac.compression.modules.LowRankLinear` (rank r): ``2 T r (in + out)``;
* :class:`~gac.compression.modules.GroupedLowRankLinear`: ``2 T (in * sum(r_g) + sum(r_g out_g))``;
* a pruned MLP is three narrower ``nn.Linear``: counted as such; a ``Conv1D`` (GPT-2) as the Linear it is; a
  split fused projection as its parts;
* a mixture-of-experts block (3-D expert parameters, or gac's per-expert :class:`~gac.compression.modules.ExpertMLPs`):
  each token runs ``top_k`` experts (``config.num_experts_per_tok``); routing is not known from shapes, so every
  expert is taken to see ``T top_k / E`` tokens: ``2 T top_k mean_e(3 H w_e)``;
* attention per decoder layer: scores ``Q K^T`` and values ``P V``, ``2 * 2 * batch * heads * S * S * head_dim``
  — the full ``S x S`` square: the causal half is **not** subtracted (SDPA's math and memory-efficient kernels
  compute the whole square; FlashAttention skips the masked tiles, about half);
* ``lm_head``: ``2 T hidden vocab`` (a prefill without cache computes logits at every position).

Not counted: biases, norms, activations, rotary embeddings, softmax, residual adds, the embedding lookup.
"""

from __future__ import annotations

from torch import nn

CONVENTION = ("2 FLOPs per multiply-add; Linear 2*T*in*out, low rank 2*T*r*(in+out), grouped low rank "
              "2*T*(in*sum(r)+sum(r*out)); attention QK^T and PV over the full SxS (causal half not subtracted); "
              "lm_head at every position; biases, norms, activations, rotary, softmax not counted")


def linear_flops(module: nn.Module, tokens: int) -> int:
    """FLOPs of one projection module (Linear, LowRankLinear, GroupedLowRankLinear) over ``tokens`` tokens."""
    from gac.compression.modules import GroupedLowRankLinear, LowRankLinear

    if isinstance(module, LowRankLinear):
        return 2 * tokens * module.rank * (module.in_features + module.out_features)
    if isinstance(module, GroupedLowRankLinear):
        return 2 * tokens * (module.in_features * sum(module.ranks) + sum(r * o for r, o in zip(module.ranks, module.outs)))
    if isinstance(module, nn.Linear):
        return 2 * tokens * module.in_features * module.out_features
    if type(module).__name__ == "Conv1D":
        return 2 * tokens * module.weight.numel()
    raise TypeError(f"not a projection module: {type(module).__name__}")


def experts_flops(block, tokens: int, top_k: int) -> int:
    """FLOPs of a mixture-of-experts block over ``tokens`` tokens, each routed to ``top_k`` experts (module docstring)."""
    from gac.compression.modules import ExpertMLPs

    if isinstance(block, ExpertMLPs):
        widths, hidden = block.widths, block.hidden
    else:
        E, two_i, hidden = block.gate_up_proj.shape
        widths = [two_i // 2] * E
    return round(2 * tokens * top_k * sum(3 * hidden * w for w in widths) / len(widths))


def attention_flops(batch: int, seq_len: int, heads: int, head_dim: int) -> int:
    """``Q K^T`` plus ``P V`` of one layer over the full ``S x S`` square."""
    return 2 * 2 * batch * heads * seq_len * seq_len * head_dim


def prefill_flops(model: nn.Module, batch: int, seq_len: int) -> dict:
    """``{"linear", "attention", "lm_head", "total"}`` FLOPs of one prefill forward (see the module docstring).

    ``linear`` covers every projection inside the decoder (q/k/v/o, gate/up/down, compressed or not).
    """
    from gac.compression.discovery import discover, text_config
    from gac.compression.modules import GroupedLowRankLinear, LowRankLinear

    tokens = batch * seq_len
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = lm_head = 0
    inside: list[str] = []
    layout = discover(model)
    experts = {e.module for e in layout.experts}
    top_k = int(getattr(text_config(model.config), "num_experts_per_tok", 0) or 0)
    for name, m in model.named_modules():
        if any(name.startswith(p) for p in inside):
            continue
        if name in experts:
            linear += experts_flops(m, tokens, top_k)
            inside.append(name + ".")
            continue
        if m is not head and not name.startswith(layout.layers_path + "."):
            continue  # not the decoder's (a multimodal model's vision tower)
        if isinstance(m, (LowRankLinear, GroupedLowRankLinear, nn.Linear)) or type(m).__name__ == "Conv1D":
            f = linear_flops(m, tokens)
            if m is head:
                lm_head += f
            else:
                linear += f
            if not isinstance(m, nn.Linear):
                inside.append(name + ".")
    attention = layout.num_layers * attention_flops(batch, seq_len, layout.num_heads, layout.head_dim)
    return {"linear": linear, "attention": attention, "lm_head": lm_head, "total": linear + attention + lm_head}
