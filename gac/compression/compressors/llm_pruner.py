"""LLM-Pruner: structured pruning of MLP intermediate channels (Ma et al. 2023; reference ``horseee/LLM-Pruner``).

One unit per pruned layer: its MLP width d (gate_proj as the root; the same channels leave up_proj rows and
down_proj columns), ``params(d) = d * (hidden_in(gate) + hidden_in(up) + hidden_out(down))``. Attention heads are
not pruned (the GAC paper prunes the MLP only; the reference's block-wise mode also prunes heads).

What reproduces the reference's defaults (``hf_prune.py`` / ``llama3.py`` with ``--pruner_type taylor``), and what
gac adds as named options:

* **importance**: proxy ``taylor``, the reference's default ``--taylor param_first``: channel ``c`` scores
  ``sum_j |w_cj g_cj|`` over gate_proj row c, plus the same over up_proj row c, plus ``sum_i |w_ic g_ic|`` over
  down_proj column c (``--grouping_strategy sum``), where ``g`` is *one* gradient of the mean next-token loss over
  the calibration batch (gac sums per-sample gradients, which for equal-length samples is that gradient exactly).
  The paper's Table 1 proxy ``gradient`` (``|dL/dh_c . h_c|`` per output channel, per sample) and the others stay
  selectable.
* **allocation**: ``uniform``: every pruned layer keeps the same fraction of its channels (the reference's
  ``--pruning_ratio`` is a per-layer ``ch_sparsity``; global pruning is off by default). ``proportional`` (gac's
  Eq. 2 rule) is an option.
* **layers** (``layers``): default ``"reference"``: the reference's ``--block_mlp_layer_start 3
  --block_mlp_layer_end 31``, i.e. ``range(3, 31)`` = layers 3..30 of a 32-layer Llama, scaled to the depth L as
  ``range(floor(3 L / 32), L - ceil(L / 32))`` (the first ~10% and the last ~3% of the layers stay dense; tiny's 4
  layers: 0..2). ``"paper"``: the GAC paper's "layers 3-31 (29/32)", ``range(floor(3 L / 32), L)``. A python slice
  string (``"3:"``), a ``(start, end)`` pair or a list of indices also work.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gac.compression.compressors.base import Compressor, Unit, parse_layers
from gac.compression.compressors.pruning_math import channel_order, kept_channels, prune_cols, prune_rows
from gac.compression.discovery import ModelLayout
from gac.compression.modules import get_module
from gac.compression.proxies import Proxy, check_score
from gac.compression.swap import replace_module
from gac.errors import GacError, unknown_name
from gac.progress import track


def _linear_from(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    out_f, in_f = weight.shape
    m = nn.Linear(in_f, out_f, bias=bias is not None, dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        m.weight.copy_(weight)
        if bias is not None:
            m.bias.copy_(bias)
    return m


LAYER_PRESETS = ("reference", "paper")


def layer_range(preset: str, n_layers: int) -> range:
    """The pruned layers of a preset for an ``n_layers``-deep model (module docstring)."""
    start = (3 * n_layers) // 32
    if preset == "paper":
        return range(start, n_layers)
    if preset == "reference":
        return range(start, n_layers - math.ceil(n_layers / 32))
    raise unknown_name("LLM-Pruner layer preset", str(preset), LAYER_PRESETS)


class LLMPruner(Compressor):
    name = "llm_pruner"
    default_proxy = "taylor"
    default_allocation = "uniform"

    def __init__(self, layers=None):
        if isinstance(layers, str) and layers not in LAYER_PRESETS and not any(c.isdigit() for c in layers):
            raise unknown_name("LLM-Pruner layers (a preset, or a slice such as '3:31')", layers, LAYER_PRESETS)
        self.layers = layers

    def layer_indices(self, n_layers: int) -> list[int]:
        if self.layers is None or self.layers in LAYER_PRESETS:
            return parse_layers(None, n_layers, default=layer_range(self.layers or "reference", n_layers))
        return parse_layers(self.layers, n_layers)

    def units(self, model, layout: ModelLayout) -> list[Unit]:
        idx = self.layer_indices(layout.num_layers)
        out = []
        for i in idx:
            li = layout.layers[i]
            g, u, d = (get_module(model, li.name(p)) for p in ("gate_proj", "up_proj", "down_proj"))
            for m in (g, u, d):
                if not isinstance(m, nn.Linear):
                    raise GacError(f"{li.mlp} holds a {type(m).__name__}; LLM-Pruner prunes dense MLPs only")
            width = g.out_features
            if u.out_features != width or d.in_features != width:
                raise GacError(f"{li.mlp}: gate/up/down widths disagree ({g.out_features}, {u.out_features}, {d.in_features})")
            ppd = g.in_features + u.in_features + d.out_features
            out.append(Unit(li.mlp, "width", ppd, ppd * width, width, width,
                            (li.name("gate_proj"), li.name("up_proj"), li.name("down_proj")), {"layer": i}))
        return out

    def score(self, model, units, stats, proxy: Proxy):
        scores = {}
        for u in units:
            num = den = 0.0
            for n in u.modules:
                W = get_module(model, n).weight
                num += check_score(proxy.weight_score(n, W, stats.get(n)), n, proxy.name) * W.numel()
                den += W.numel()
            scores[u.name] = num / den
        return scores

    def factorize(self, model, units, stats, proxy: Proxy):
        out = {}
        for u in track(units, "channel ranking", "units"):
            gn, un, dn = u.modules
            e = (
                proxy.row_energy(gn, get_module(model, gn).weight, stats.get(gn))
                + proxy.row_energy(un, get_module(model, un).weight, stats.get(un))
                + proxy.col_energy(dn, get_module(model, dn).weight, stats.get(dn))
            )
            e = e.double().cpu()
            order = channel_order(e, u.name)
            out[u.name] = {"order": order, "energy": e[order]}
        return out

    def error_curve(self, unit, factors):
        return factors.get(unit.name, {}).get("energy")

    def module_specs(self, model, units, dims):
        self.check_dims(units, dims)
        out = {}
        for u in units:
            if u.name in dims:
                w = int(dims[u.name])
                g, up, d = (get_module(model, n) for n in u.modules)
                out[u.modules[0]] = {"type": "linear", "in": g.in_features, "out": w, "bias": g.bias is not None}
                out[u.modules[1]] = {"type": "linear", "in": up.in_features, "out": w, "bias": up.bias is not None}
                out[u.modules[2]] = {"type": "linear", "in": w, "out": d.out_features, "bias": d.bias is not None}
        return out

    def apply(self, model, units, dims, factors):
        old = {}
        for u in units:
            if u.name not in dims:
                continue
            keep = kept_channels(factors[u.name]["order"], int(dims[u.name]))
            gn, un, dn = u.modules
            g, up, d = (get_module(model, n) for n in u.modules)
            with torch.no_grad():
                new_g = _linear_from(prune_rows(g.weight, keep), None if g.bias is None else g.bias[keep.to(g.bias.device)])
                new_u = _linear_from(prune_rows(up.weight, keep), None if up.bias is None else up.bias[keep.to(up.bias.device)])
                new_d = _linear_from(prune_cols(d.weight, keep), d.bias)
            old[gn] = replace_module(model, gn, new_g)
            old[un] = replace_module(model, un, new_u)
            old[dn] = replace_module(model, dn, new_d)
        return old
