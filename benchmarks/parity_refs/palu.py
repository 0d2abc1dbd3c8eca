"""PaLU's reference procedure, re-implemented independently of gac's compressor (parity row for issue #13).

Written from the paper (Chang et al., "Palu: KV-Cache Compression with Low-Rank Projection", ICLR 2025) and the
authors' ``shadowpa0327/Palu`` defaults (``compress.py``: ``--search_method fisher_uniform``, ``--decompose_method
whiten``, ``--head_group_size 4``; ``palu/rank_search.py``, ``palu/decomposition.py``,
``palu/model/modules/svd_linear.py``). It shares no compression code with gac; it uses only plain torch.

1. **Fisher information** of every k_proj / v_proj weight element: ``sqrt(mean_s g_s^2)`` with ``g_s`` the gradient
   of calibration sample ``s`` (batch size 1). The reference feeds ``input_ids = x[:, :-1]`` and ``labels = x[:, 1:]``
   to a Hugging Face model, which shifts the labels once more: its loss predicts the token two places ahead. That
   quirk is kept (``double_shift=True``).
2. **Rank search** ``fisher_uniform``: one score per projection (the mean of its Fisher), the projection's rank
   ``target * F_p / sum F`` (floored, capped at its full rank, the leftover handed out one rank at a time in the
   reference's order, a whole pass at a time), split evenly over the projection's head groups (integer division),
   each group's rank rounded to the nearest multiple of 32 (Python ``round``; at least 32).
3. **Whitened decomposition** per head group: Cholesky factor ``L`` of the float64 ``X^T X`` of the projection's
   calibration inputs (on failure: add ``(1e-3 - lambda_min) I``), cast to float32; SVD of ``W_g L``;
   ``up = U_r sqrt(S_r)``, ``down = sqrt(S_r) V_r^T L^-1``; one shared down-projection, one up-projection per group.

The reference states its target as a rank ratio (``--param_ratio_target``: the kept fraction of the K/V ranks, the
KV-cache size). To run it at a *parameter* compression ratio ``rho`` like every other row, the rank ratio is set so
that the search's unrounded ranks hold ``(1 - rho)`` of the dense K/V parameters:
``rank_ratio = (1 - rho) * sum_p out_p * in_p / sum_p out_p * (in_p + rows_p)`` (rows_p = group_size * head_dim);
``kept_params`` is then counted on the rounded ranks.

    python benchmarks/parity_refs/palu.py --ratios 0.15 0.30        # rows of the parity protocol (see --help)
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

BLOCK = 32  # rounding_search_result's block_size


class HeadwiseLowRank(nn.Module):
    """One latent projection ``down`` (in -> sum of ranks), one ``up`` per head group (rank -> group rows)."""

    def __init__(self, in_features: int, group_rows: int, ranks: list[int], bias: bool, dtype, device):
        super().__init__()
        self.ranks = list(ranks)
        self.down = nn.Linear(in_features, sum(ranks), bias=False, dtype=dtype, device=device)
        self.ups = nn.ModuleList(nn.Linear(r, group_rows, bias=bias, dtype=dtype, device=device) for r in ranks)

    def forward(self, x):
        z = self.down(x)
        parts, o = [], 0
        for r, up in zip(self.ranks, self.ups):
            parts.append(up(z[..., o : o + r]))
            o += r
        return torch.cat(parts, dim=-1)


def _kv(model):
    out = []
    for i, layer in enumerate(model.model.layers):
        for p in ("k_proj", "v_proj"):
            out.append((f"model.layers.{i}.self_attn.{p}", layer.self_attn, p))
    return out


def fisher_info(model, calib_ids: torch.Tensor, double_shift: bool = True) -> dict[str, torch.Tensor]:
    """Per element ``sqrt(mean_s g_s^2)`` for every k_proj / v_proj weight (one sample per backward)."""
    kv = _kv(model)
    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    weights = {n: getattr(parent, attr).weight for n, parent, attr in kv}
    for w in weights.values():
        w.requires_grad_(True)
    acc = {n: torch.zeros_like(w, dtype=torch.float32) for n, w in weights.items()}
    model.eval()
    try:
        for s in range(calib_ids.shape[0]):
            x = calib_ids[s : s + 1]
            inp, lab = (x[:, :-1], x[:, 1:]) if double_shift else (x, x)
            with torch.enable_grad():
                model(input_ids=inp, labels=lab, use_cache=False).loss.backward()
            for n, w in weights.items():
                acc[n] += w.grad.detach().float().pow(2)
                w.grad = None
    finally:
        for p, f in flags.items():
            p.requires_grad_(f)
            p.grad = None
    return {n: a.div(calib_ids.shape[0]).sqrt() for n, a in acc.items()}


@torch.no_grad()
def input_gram(model, calib_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """``X^T X`` (float64) of the inputs of every k_proj / v_proj over the calibration samples."""
    kv = _kv(model)
    gram: dict[str, torch.Tensor] = {}
    hooks = []
    for n, parent, attr in kv:
        def hook(mod, args, _n=n):
            x = args[0].detach().double().reshape(-1, args[0].shape[-1])
            gram[_n] = gram[_n] + x.T @ x if _n in gram else x.T @ x
        hooks.append(getattr(parent, attr).register_forward_pre_hook(hook))
    model.eval()
    try:
        for s in range(calib_ids.shape[0]):
            model(input_ids=calib_ids[s : s + 1], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return gram


def cholesky_scale(gram: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The reference's scaling matrix: Cholesky of the raw X^T X; on failure shift the spectrum to 1e-3."""
    try:
        return torch.linalg.cholesky(gram).float(), "cholesky"
    except RuntimeError:
        lam = torch.linalg.eigvalsh(gram)[0]
        g = gram + (-lam + 1e-3) * torch.eye(gram.shape[0], dtype=gram.dtype)
        return torch.linalg.cholesky(g).float(), "cholesky (shifted)"


def fisher_uniform(fisher_mean: dict[str, float], full_rank: dict[str, int], target_rank: float,
                   groups: int) -> dict[str, list[int]]:
    """The reference's ``fisher_uniform`` search: projection ranks, then per group (split, rounded to 32)."""
    total_f = sum(fisher_mean.values())
    sel = {n: full_rank[n] for n in fisher_mean}
    flt = {}
    for n, f in fisher_mean.items():
        flt[n] = target_rank * f / total_f
        sel[n] = min(sel[n], math.floor(flt[n]))
    order = sorted(fisher_mean, key=lambda n: flt[n] - sel[n])
    dif = target_rank - sum(sel.values())
    while dif > 0:
        if all(sel[n] == full_rank[n] for n in order):
            break  # every projection at full rank (the reference would loop forever)
        for n in order:
            if sel[n] == full_rank[n]:
                continue
            sel[n] += 1
            dif -= 1
            if dif == 0:
                break
    return {n: [max(1, round((v // groups) / BLOCK)) * BLOCK for _ in range(groups)] for n, v in sel.items()}


def whiten_factors(W: torch.Tensor, L: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_per_head_whiten_decomposition_from_weight``: float32 SVD of ``W L``; (up, down) at ``rank``."""
    Linv = torch.linalg.inv(L.float())
    U, S, Vt = torch.linalg.svd(W.float() @ L.float(), full_matrices=False)
    V = Vt @ Linv
    r = torch.sqrt(S[:rank])
    return U[:, :rank] * r[None, :], r[:, None] * V[:rank]


def reference(model, tokenizer, calib_ids: torch.Tensor, ratio: float, group_size: int | None = None,
              double_shift: bool = True) -> dict:
    """PaLU's default procedure at parameter compression ratio ``ratio`` on a copy of ``model``."""
    cfg = model.config
    n_kv = cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    gs = group_size or min(4, n_kv)
    if n_kv % gs:
        raise ValueError(f"num_key_value_heads {n_kv} not divisible by head_group_size {gs}")
    groups, rows = n_kv // gs, gs * hd
    m = copy.deepcopy(model).float()
    kv = _kv(m)
    fisher = fisher_info(m, calib_ids, double_shift)
    fmean = {n: float(f.mean()) for n, f in fisher.items()}
    full = {n: getattr(p, a).out_features for n, p, a in kv}
    dense = sum(getattr(p, a).weight.numel() for _, p, a in kv)
    at_full = sum(getattr(p, a).out_features * (getattr(p, a).in_features + rows) for _, p, a in kv)
    rank_ratio = (1.0 - ratio) * dense / at_full
    ranks = fisher_uniform(fmean, full, sum(full.values()) * rank_ratio, groups)
    gram = input_gram(m, calib_ids)
    kept, how = 0, set()
    for n, parent, attr in kv:
        lin = getattr(parent, attr)
        L, h = cholesky_scale(gram[n])
        how.add(h)
        W = lin.weight.detach().float().reshape(groups, rows, lin.in_features)
        new = HeadwiseLowRank(lin.in_features, rows, ranks[n], lin.bias is not None, lin.weight.dtype, lin.weight.device)
        downs = []
        with torch.no_grad():
            for g, r in enumerate(ranks[n]):
                up, down = whiten_factors(W[g], L, r)
                new.ups[g].weight.copy_(up)
                if lin.bias is not None:
                    new.ups[g].bias.copy_(lin.bias.reshape(groups, rows)[g])
                downs.append(down)
            new.down.weight.copy_(torch.cat(downs))
        setattr(parent, attr, new)
        kept += sum(r * (lin.in_features + rows) for r in ranks[n])
    notes = (f"PaLU reference: fisher_uniform (rank ratio {rank_ratio:.4f}, double-shift loss {double_shift}), "
             f"whiten ({', '.join(sorted(how))}), head groups of {gs} KV heads, ranks rounded to {BLOCK}; "
             f"ranks {ranks}")
    return {"model": m, "kept_params": int(kept), "dense_params": int(dense), "notes": notes}

