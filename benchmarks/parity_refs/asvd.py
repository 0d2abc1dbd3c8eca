"""ASVD as its authors ship it (hahnyuan/ASVD4LLM), re-implemented independently of gac for benchmarks/parity.py.

Written from the paper (Yuan et al. 2023, "ASVD: Activation-aware Singular Value Decomposition for Compressing Large
Language Models") and the reference repository's procedure (``asvd.py`` -> ``act_aware_utils.calib_input_distribution``
-> ``sensitivity.calib_sensitivity_ppl`` -> ``binary_search.binary_search_truncation_rank``, ``modules/svd_linear``),
with its default settings: ``scaling_method=abs_mean``, ``alpha=0.5``, ``sigma_fuse=UV``, ``rank_align=1``,
``sensitivity_metric=ppl``, kept-parameter-ratio grid 0.4 ... 0.9. Nothing here imports gac's compression code.

1. Activation scale per Linear: the sum over calibration samples of ``mean_t |x_t|`` (per input channel).
2. A Linear at kept parameter ratio p: rank ``r = int(p * out * in) // (out + in)``; ``S = scale ** alpha + 1e-6``;
   ``U, s, V = torch.svd_lowrank(W * S, q=r)`` (randomised, the reference's call; ``svd="exact"`` swaps in a full
   SVD truncated to ``r`` to isolate the factoriser); ``V /= S``; the two factors take ``sqrt(s)`` each.
3. Sensitivity: for every Linear and ratio, calibration perplexity with that Linear alone replaced.
4. Every (Linear, ratio, ppl) sorted by ppl descending; binary search on the cut ``mid`` (entries from ``mid`` on are
   accepted, each Linear keeps its smallest accepted ratio, none accepted: dense) against the kept-parameter ratio
   target ``1 - rho`` counted nominally (``sum numel * ratio``); the final model uses the *last probed* ``mid``, as
   the reference does (it can be one entry over the target).

Units: the seven projections of every decoder layer, the units gac compresses. (The reference walks every
``nn.Linear`` of the model, ``lm_head`` included; leaving it out keeps the parameter counts comparable.)
"""

from __future__ import annotations

import copy

import torch
from torch import nn

GRID = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ALPHA = 0.5
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Factored(nn.Module):
    """``y = A (B x) + b``."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor, bias):
        super().__init__()
        self.B = nn.Linear(B.shape[1], B.shape[0], bias=False)
        self.A = nn.Linear(A.shape[1], A.shape[0], bias=bias is not None)
        with torch.no_grad():
            self.B.weight.copy_(B)
            self.A.weight.copy_(A)
            if bias is not None:
                self.A.bias.copy_(bias)

    def forward(self, x):
        return self.A(self.B(x))


def _projections(model):
    """(full name, parent module, attribute, Linear) for the seven projections of every decoder layer."""
    out = []
    for name, mod in model.named_modules():
        for child_name, child in mod.named_children():
            if child_name in PROJ and isinstance(child, nn.Linear):
                out.append((f"{name}.{child_name}", mod, child_name, child))
    return out


@torch.no_grad()
def _activation_scales(model, calib_ids, linears):
    scales = {id(lin): torch.zeros(lin.in_features, dtype=torch.float32) for _, _, _, lin in linears}
    hooks = []
    def make_hook(key):
        def hook(mod, inp, out):
            scales[key] += inp[0].detach().abs().float().mean(dim=-2).reshape(-1, inp[0].shape[-1]).sum(0).cpu()
        return hook

    for _, _, _, lin in linears:
        hooks.append(lin.register_forward_hook(make_hook(id(lin))))
    try:
        for i in range(calib_ids.shape[0]):
            model(input_ids=calib_ids[i : i + 1])
    finally:
        for h in hooks:
            h.remove()
    return scales


def _factor(lin: nn.Linear, scale: torch.Tensor, ratio: float, svd: str = "lowrank") -> nn.Module:
    rank = int(lin.weight.numel() * ratio) // (lin.in_features + lin.out_features)
    S = scale ** ALPHA + 1e-6
    W = lin.weight.detach().float() * S[None, :]
    if svd == "lowrank":  # the authors' call: randomised, q=rank, no oversampling, two power iterations
        U, s, V = torch.svd_lowrank(W, q=rank)
    elif svd == "exact":  # the same truncation from a full SVD (float64): isolates the factoriser in a parity run
        U, s, Vh = torch.linalg.svd(W.double(), full_matrices=False)
        U, s, V = U[:, :rank].float(), s[:rank].float(), Vh[:rank].T.float()
    else:
        raise ValueError(f"svd={svd!r}: lowrank (the authors') or exact")
    V = V / S[:, None]
    root = s.sqrt()
    return _Factored(U * root[None, :], (V * root[None, :]).T, lin.bias)


@torch.no_grad()
def _calib_ppl(model, calib_ids) -> float:
    nll = []
    for i in range(calib_ids.shape[0]):
        x = calib_ids[i : i + 1]
        logits = model(input_ids=x[:, :-1]).logits
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))
        nll.append(loss * x.shape[1])
    return float(torch.exp(torch.stack(nll).sum() / (len(nll) * calib_ids.shape[1])))


@torch.no_grad()
def reference(model, tokenizer, calib_ids, ratio: float, table: dict | None = None,
              probe_samples: int | None = None, svd: str = "lowrank") -> dict:
    """ASVD at compression ratio ``ratio`` (the fraction of the projections' parameters removed). ``table``: a
    sensitivity table from an earlier call on the same model and calibration (it does not depend on the ratio).
    ``probe_samples``: the sensitivity perplexities on the first N calibration samples only (the authors use all;
    a shorter calibration for the table on a larger model, issue 24), the activation scales on all of them.
    ``svd``: ``lowrank`` (the authors' randomised ``torch.svd_lowrank``) or ``exact`` (a full SVD truncated to the
    same rank, everything else unchanged): what the factoriser alone changes."""
    torch.manual_seed(0)
    model = copy.deepcopy(model).eval()
    linears = _projections(model)
    scales = _activation_scales(model, calib_ids, linears)
    if table is None:
        table = {}
        for name, parent, attr, lin in linears:
            table[name] = {}
            for p in GRID:
                setattr(parent, attr, _factor(lin, scales[id(lin)], p, svd))
                table[name][p] = _calib_ppl(model, calib_ids if probe_samples is None else calib_ids[:probe_samples])
            setattr(parent, attr, lin)
    entries = sorted(((n, p, v) for n, row in table.items() for p, v in row.items() if p < 1), key=lambda e: -e[2])
    numel = {n: lin.weight.numel() for n, _, _, lin in linears}
    target = 1 - ratio

    def min_ratios(mid):
        r = {n: 1 for n in numel}
        for n, p, _ in entries[mid:]:
            r[n] = min(r[n], p)
        return r

    low, high, mid = 0, len(entries) - 1, 0
    while low < high:
        mid = (low + high) // 2
        r = min_ratios(mid)
        now = sum(numel[n] * r[n] for n in numel) / sum(numel.values())
        if now > target:
            high = mid
        else:
            low = mid + 1
    chosen = min_ratios(mid)
    kept = 0
    n_dense = 0
    for name, parent, attr, lin in linears:
        p = chosen[name]
        if p == 1:
            kept += lin.weight.numel()
            n_dense += 1
            continue
        new = _factor(lin, scales[id(lin)], p, svd)
        setattr(parent, attr, new)
        kept += new.A.weight.numel() + new.B.weight.numel()
    return {
        "model": model,
        "kept_params": int(kept),
        "dense_params": int(sum(numel.values())),
        "notes": f"{n_dense}/{len(linears)} weights dense; last probed cut {mid} of {len(entries)}; nominal kept "
                 f"{sum(numel[n] * chosen[n] for n in numel) / sum(numel.values()):.4f} vs target {target:.4f}",
        "table": table,
    }
