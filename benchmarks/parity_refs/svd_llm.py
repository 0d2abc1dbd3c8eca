"""SVD-LLM as its authors ship it (AIoT-MLSys-Lab/SVD-LLM, ``SVDLLM.py --step 1``), re-implemented independently of
gac for benchmarks/parity.py.

Written from the paper (Wang et al., ICLR 2025, "SVD-LLM: Truncation-aware Singular Value Decomposition for Large
Language Model Compression") and the reference's ``profle_svdllm`` + ``whitening``: truncation-aware data
whitening, every projection at the same parameter ratio. Nothing here imports gac's compression code.

1. ``X^T X`` per projection: the sum over calibration samples of ``x^T x`` (float32 hooks, as the reference).
2. ``L = cholesky(X^T X)`` in float64; when it fails the reference shifts by ``(-lambda_min + 1e-6) I``.
3. ``W L = U s V^T`` (float32 SVD); rank ``r = int(out * in * (1 - rho) / (out + in))``;
   ``A = U_r sqrt(s_r)``, ``B = sqrt(s_r) V_r^T L^-1``.

With ``update=True`` it also runs the reference's optional ``--step 2`` (``whitening_local_update``): layer by layer,
the inputs of each layer come from the already compressed layers before it, and each projection's ``A`` is refit by
least squares so that ``A (B x)`` matches the original projection's output on those inputs.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Factored(nn.Module):
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


def _projections(root):
    out = []
    for name, mod in root.named_modules():
        for child_name, child in mod.named_children():
            if child_name in PROJ and isinstance(child, nn.Linear):
                out.append((f"{name}.{child_name}", mod, child_name, child))
    return out


@torch.no_grad()
def _gram(model, calib_ids, linears):
    grams = {id(lin): torch.zeros(lin.in_features, lin.in_features) for *_, lin in linears}
    hooks = []
    def make_hook(key):
        def hook(mod, inp, out):
            x = inp[0].detach().float().reshape(-1, inp[0].shape[-1])
            grams[key] += (x.T @ x).cpu()
        return hook

    for *_, lin in linears:
        hooks.append(lin.register_forward_hook(make_hook(id(lin))))
    try:
        for i in range(calib_ids.shape[0]):
            model(input_ids=calib_ids[i : i + 1])
    finally:
        for h in hooks:
            h.remove()
    return grams


def _cholesky(G: torch.Tensor) -> torch.Tensor:
    G = G.double()
    try:
        return torch.linalg.cholesky(G)
    except RuntimeError:
        lam = torch.linalg.eigvalsh(G)[0]
        return torch.linalg.cholesky(G + (-lam + 1e-6) * torch.eye(G.shape[0], dtype=G.dtype))


def _truncate(lin: nn.Linear, L: torch.Tensor, kept: float):
    W = lin.weight.detach().float()
    Linv = torch.linalg.inv(L).float()
    U, s, Vh = torch.linalg.svd(W @ L.float(), full_matrices=False)
    r = int(W.shape[0] * W.shape[1] * kept / (W.shape[0] + W.shape[1]))
    root = s[:r].sqrt()
    return U[:, :r] * root[None, :], root[:, None] * (Vh[:r] @ Linv), s[:r], U[:, :r], Vh[:r] @ Linv


@torch.no_grad()
def reference(model, tokenizer, calib_ids, ratio: float, update: bool = False) -> dict:
    """SVD-LLM (whitening only: the reference's step 1) at compression ratio ``ratio``; ``update=True`` adds step 2."""
    model = copy.deepcopy(model).eval()
    linears = _projections(model)
    grams = _gram(model, calib_ids, linears)
    kept_ratio = 1 - ratio
    if not update:
        kept = 0
        for _, parent, attr, lin in linears:
            A, B, *_ = _truncate(lin, _cholesky(grams[id(lin)]), kept_ratio)
            setattr(parent, attr, _Factored(A, B, lin.bias))
            kept += A.numel() + B.numel()
        note = "step 1 (whitening) only, the reference's default"
    else:
        kept = _local_update(model, calib_ids, linears, grams, kept_ratio)
        note = "step 1 + step 2 (sequential least-squares update of U)"
    dense = sum(lin.weight.numel() for *_, lin in linears)
    return {"model": model, "kept_params": int(kept), "dense_params": int(dense), "notes": note}


def _local_update(model, calib_ids, linears, grams, kept_ratio) -> int:
    """The reference's whitening_local_update: per decoder layer, inputs from the compressed layers before it."""
    layers = model.model.layers
    captured = []

    def catch(mod, args, kwargs):
        captured.append((args[0].detach(), dict(kwargs)))
        raise _Stop

    h = layers[0].register_forward_pre_hook(catch, with_kwargs=True)
    for i in range(calib_ids.shape[0]):
        with contextlib.suppress(_Stop):
            model(input_ids=calib_ids[i : i + 1], use_cache=False)
    h.remove()
    by_layer = {}
    for name, parent, attr, lin in linears:
        idx = int(name.split("layers.")[1].split(".")[0])
        by_layer.setdefault(idx, []).append((name, parent, attr, lin))
    kept = 0
    for li, layer in enumerate(layers):
        items = by_layer.get(li, [])
        trunc = {id(lin): _truncate(lin, _cholesky(grams[id(lin)]), kept_ratio) for *_, lin in items}
        xs = {id(lin): [] for *_, lin in items}
        ys = {id(lin): [] for *_, lin in items}
        def make_hook(key, xs=xs, ys=ys):
            def hook(mod, inp, res):
                xs[key].append(inp[0].detach().float().reshape(-1, inp[0].shape[-1]))
                ys[key].append(res.detach().float().reshape(-1, res.shape[-1]))
            return hook

        hooks = [lin.register_forward_hook(make_hook(id(lin))) for *_, lin in items]
        for x, kw in captured:
            layer(x, **kw)
        for hk in hooks:
            hk.remove()
        for _, parent, attr, lin in items:
            A, B, s, U, V = trunc[id(lin)]
            X = torch.cat(xs[id(lin)])
            Y = torch.cat(ys[id(lin)])
            Z = (X @ V.T) * s[None, :]  # X V^T Sigma
            Ut = torch.linalg.lstsq(Z, Y).solution  # (r x out): the updated U^T
            root = s.sqrt()
            A_new = Ut.T * root[None, :]
            B_new = root[:, None] * V
            setattr(parent, attr, _Factored(A_new, B_new, lin.bias))
            kept += A_new.numel() + B_new.numel()
        nxt = []
        for x, kw in captured:  # the next layer's inputs come from this (now compressed) layer
            out = layer(x, **kw)
            nxt.append((out[0] if isinstance(out, tuple) else out, kw))
        captured = nxt
    return kept


class _Stop(Exception):
    pass
