"""SVD-LLM's optional parameter update (the reference's ``SVDLLM.py --step 2``, ``whitening_local_update``).

After truncation every factorised projection ``W ~ A B`` gets a new ``A`` fitted by least squares, layer by layer:

1. the calibration samples enter layer ``l`` through the layers before it *as compressed* (the errors of earlier
   layers are what the update corrects);
2. layer ``l`` runs once with its original projections; each projection's input ``X`` there gives the target
   ``Y = X W^T`` (the original output) and ``B`` stays as truncation made it;
3. ``A = argmin ||X B^T A^T - Y||_F``, solved from the normal equations ``(B G B^T) A^T = B G W^T`` with
   ``G = X^T X`` accumulated in float64 (the reference calls ``lstsq`` on ``X B^T``: the same minimiser, without
   holding every token's row);
4. the updated layer ``l`` produces the inputs of layer ``l + 1``.

Dense units (a plan dimension ``min(out, in)``) keep their weight. Cost: one forward of the calibration samples per
layer twice (original and updated) plus one ``r x r`` solve per projection: seconds on ``tiny`` on 2 cores. ``G``
is accumulated and the normal equations are formed and solved on the model's device, in float64 (CUDA and the CPU
have it; about 7 TFLOP per calibration chunk of Llama-3-8B's down_proj, minutes on a host CPU, under a second on
an H100's float64 tensor cores), so nothing but the error numbers crosses to the host. (The
reference also ships a LoRA fine-tuning step, ``utils/LoRA.py``, on an instruction data set: that needs training
data and GPU hours, so gac does not run it.)
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from gac.compression.modules import LowRankLinear, get_module
from gac.compression.swap import replace_module
from gac.errors import GacError

log = logging.getLogger(__name__)

GRAM_DTYPE = torch.float64  # X^T X, the normal equations and the solve (CPU and CUDA both compute in float64)


@torch.no_grad()
def local_update(model: nn.Module, units: list, dims: dict, originals: dict, calib_ids: torch.Tensor, layout,
                 ridge: float = 1e-8) -> dict:
    """Refit ``A`` of every factorised unit in ``dims`` (see the module docstring). ``originals``: the dense modules
    that :meth:`Compressor.apply` replaced, by name. Returns ``{unit: (relative output error before, after)}``."""
    from gac.compression.sensitivity import LayerCache

    if calib_ids is None:
        raise GacError("SVD-LLM's update step needs the calibration token ids; prepare with calibration data "
                       "(or drop the option update)")
    by_layer: dict[int, list] = {}
    for u in units:
        if u.name in dims and u.name in originals and isinstance(get_module(model, u.name), LowRankLinear):
            layer = u.meta.get("layer")
            if not isinstance(layer, int):
                raise GacError(f"{u.name}: no layer index; the update step walks the decoder layers")
            by_layer.setdefault(layer, []).append(u)
    was = model.training
    model.eval()
    errors = {}
    try:
        cache = LayerCache(model, layout, calib_ids)
        for layer in sorted(by_layer):
            cache.advance_to(layer)  # inputs of `layer` from the compressed layers before it
            group = by_layer[layer]
            compressed = {u.name: get_module(model, u.name) for u in group}
            dev = originals[group[0].name].weight.device
            grams = {u.name: torch.zeros(u.meta["shape"][1], u.meta["shape"][1], dtype=GRAM_DTYPE, device=dev)
                     for u in group}
            hooks = []
            for u in group:
                replace_module(model, u.name, originals[u.name])

                def hook(mod, inp, out, name=u.name, grams=grams):
                    x = inp[0].detach().reshape(-1, inp[0].shape[-1]).to(GRAM_DTYPE)
                    grams[name].addmm_(x.T, x)  # on the model's device: no host copy per chunk

                hooks.append(originals[u.name].register_forward_hook(hook))
            try:
                layer_mod = cache.layers[layer]
                for a in range(0, cache.hidden.shape[0], cache.chunk):
                    layer_mod(cache.hidden[a : a + cache.chunk], **cache.kwargs[layer])
            finally:
                for h in hooks:
                    h.remove()
                for u in group:
                    replace_module(model, u.name, compressed[u.name])
            for u in group:
                errors[u.name] = _refit(compressed[u.name], originals[u.name].weight, grams[u.name], ridge)
        log.info("SVD-LLM update: refitted %d projections; mean relative output error %.4f -> %.4f", len(errors),
                 sum(e[0] for e in errors.values()) / max(1, len(errors)),
                 sum(e[1] for e in errors.values()) / max(1, len(errors)))
    finally:
        model.train(was)
    return errors


def _refit(mod: LowRankLinear, W: torch.Tensor, G: torch.Tensor, ridge: float) -> tuple[float, float]:
    """New ``A`` for ``mod`` (``A = up``, ``B = down``) from ``G = X^T X``; returns the relative output error
    ``||X (W - A B)^T|| / ||X W^T||`` before and after."""
    dev = G.device  # the model's device (local_update): the refit never leaves it
    W64 = W.detach().to(dev, GRAM_DTYPE)
    B = mod.down.weight.detach().to(dev, GRAM_DTYPE)
    A = mod.up.weight.detach().to(dev, GRAM_DTYPE)
    BG = B @ G
    lhs = BG @ B.T
    lhs = lhs + ridge * (torch.trace(lhs) / lhs.shape[0] + 1e-30) * torch.eye(lhs.shape[0], dtype=lhs.dtype,
                                                                               device=dev)
    A_new = torch.linalg.solve(lhs, BG @ W64.T).T

    def err(A_):
        D = W64 - A_ @ B
        return float(torch.sqrt(torch.clamp(torch.einsum("ij,jk,ik->", D, G, D), min=0)))

    ref = float(torch.sqrt(torch.clamp(torch.einsum("ij,jk,ik->", W64, G, W64), min=0))) or 1.0
    before, after = err(A) / ref, err(A_new) / ref
    if not torch.isfinite(A_new).all() or after > before:  # never make a projection worse on its own data
        return before, before
    mod.up.weight.copy_(A_new.to(mod.up.weight.device, mod.up.weight.dtype))
    return before, after
