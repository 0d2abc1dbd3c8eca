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

Mixture-of-experts layers (the reference has none), option ``expert_width``:

* ``"shared"`` (default): one width per layer for all its experts, a single target whose cost per channel is
  ``E * 3 H`` (every expert loses the channel count). Each expert keeps its *own* top channels at that width: an
  expert's channels are its own neurons, channel c of one expert has nothing to do with channel c of another, so
  one channel set shared across experts would mean nothing. The importance of keeping width w is the sum over the
  experts of each one's w best channels, so the target's error curve at rank k is the sum over experts of each
  one's k-th largest channel energy: the group choice is exact (keeping w channels in each expert can keep no more
  importance than that). The pruned experts stay in the model's own fused 3-D ``gate_up_proj`` / ``down_proj``
  (narrower), run by its own forward.
* ``"per_expert"``: each expert its own width (a target per expert), installed as
  :class:`~gac.compression.modules.ExpertMLPs` (one Linear pair per expert, run in a loop).
"""

from __future__ import annotations

import math

import torch

from gac.compression.compressors.base import Compressor, Unit, parse_layers
from gac.compression.compressors.pruning_math import channel_order, kept_channels, prune_cols, prune_rows
from gac.compression.discovery import ModelLayout
from gac.compression.modules import ExpertMLPs, fused_experts_like, get_module
from gac.compression.parts import is_dense, linear_from, part_bias, part_weight
from gac.compression.proxies import Proxy, check_score
from gac.compression.swap import replace_module
from gac.errors import GacError, unknown_name
from gac.progress import track

LAYER_PRESETS = ("reference", "paper")
#: how the experts of a mixture-of-experts layer are pruned (module docstring); the first is the default
EXPERT_WIDTHS = ("shared", "per_expert")


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
    scored_roles = ("gate", "up", "down", "fc_in", "fc_out", "experts_gate_up", "experts_down")  # the MLP's
    default_proxy = "taylor"
    default_allocation = "uniform"

    def __init__(self, layers=None, expert_width: str = EXPERT_WIDTHS[0]):
        if isinstance(layers, str) and layers not in LAYER_PRESETS and not any(c.isdigit() for c in layers):
            raise unknown_name("LLM-Pruner layers (a preset, or a slice such as '3:31')", layers, LAYER_PRESETS)
        if expert_width not in EXPERT_WIDTHS:
            raise GacError(f"LLM-Pruner expert_width={expert_width!r}: choose 'shared' (one width per layer for all "
                           f"its experts, kept in the model's fused expert tensors) or 'per_expert' (each expert its "
                           f"own width, looped ExpertMLPs)")
        self.layers = layers
        self.expert_width = expert_width

    def layer_indices(self, n_layers: int) -> list[int]:
        if self.layers is None or self.layers in LAYER_PRESETS:
            return parse_layers(None, n_layers, default=layer_range(self.layers or "reference", n_layers))
        return parse_layers(self.layers, n_layers)

    def units(self, model, layout: ModelLayout) -> list[Unit]:
        idx = self.layer_indices(layout.num_layers)
        out = []
        for i in idx:
            block = layout.experts_of(i)
            mlp = layout.mlp_of(i)
            if block is not None:
                out.extend(self._expert_units(model, block))
                if not mlp:  # no shared expert beside the experts
                    continue
            if set(mlp) == {"gate", "up", "down"}:
                ins, outs = (mlp["gate"], mlp["up"]), mlp["down"]
            elif set(mlp) == {"fc_in", "fc_out"}:
                ins, outs = (mlp["fc_in"],), mlp["fc_out"]
            else:
                raise GacError(f"layer {i} of this {layout.family} model has no dense MLP LLM-Pruner can prune")
            for p in ins + (outs,):
                if not is_dense(model, p):
                    raise GacError(f"{p.name} is not a dense Linear; LLM-Pruner prunes dense MLPs only")
            width = ins[0].out_features
            if any(p.out_features != width for p in ins) or outs.in_features != width:
                raise GacError(f"layer {i}: MLP widths disagree ({', '.join(str(p.out_features) for p in ins)}, "
                               f"{outs.in_features})")
            ppd = sum(p.in_features for p in ins) + outs.out_features
            name = outs.module.rpartition(".")[0]
            projs = ins + (outs,)
            parts = tuple(dict.fromkeys((p.module, None if p.whole else p.role) for p in projs))
            out.append(Unit(name, "width", ppd, ppd * width, width, width, tuple(dict.fromkeys(p.module for p in projs)),
                            {"layer": i, "ins": ins, "out": outs}, parts=parts))
        return out

    def _expert_units(self, model, block) -> list[Unit]:
        """The width units of a mixture-of-experts block (its experts' gate and up rows, their down columns): one for
        all its experts (``expert_width="shared"``) or one per expert."""
        mod = get_module(model, block.module)
        if not hasattr(mod, block.gate_up):
            raise GacError(f"{block.module} is already pruned expert by expert; LLM-Pruner prunes the experts of a "
                           f"model whose experts are the model's own 3-D tensors")
        H, w, E = block.hidden, block.width, block.num_experts
        keys = (block.gate_up_key, block.down_key)
        if self.expert_width == "shared":
            return [Unit(block.module, "width", E * 3 * H, E * 3 * H * w, w, w, keys,
                         {"layer": block.layer, "block": block, "experts": tuple(range(E)), "shared": True},
                         parts=tuple((block.module, f"expert{e}") for e in range(E)))]
        return [Unit(f"{block.module}.{e}", "width", 3 * H, 3 * H * w, w, w, keys,
                     {"layer": block.layer, "block": block, "experts": (e,)}, parts=((block.module, f"expert{e}"),))
                for e in range(E)]

    @staticmethod
    def _expert_pieces(model, b, e: int, stats, name: str):
        """The pieces (see :meth:`_pieces`) of expert ``e`` of block ``b``."""
        mod = get_module(model, b.module)
        gu, dn = getattr(mod, b.gate_up)[e], getattr(mod, b.down)[e]
        w = b.width
        sgu, sdn = stats.get(b.gate_up_key), stats.get(b.down_key)
        sgu = None if sgu is None else sgu.expert(e)
        sdn = None if sdn is None else sdn.expert(e)
        return [(f"{name}.gate", gu[:w], None if sgu is None else sgu.part(list(range(w))), "row"),
                (f"{name}.up", gu[w:], None if sgu is None else sgu.part(list(range(w, 2 * w))), "row"),
                (f"{name}.down", dn, sdn, "col")]

    def _pieces(self, model, u, stats):
        """``(name, W, stats, side)`` of each weight a unit prunes: ``side`` "row" (its rows are the channels) or
        "col" (its columns are); an experts unit's, expert after expert."""
        if "block" in u.meta:
            b = u.meta["block"]
            return [p for e in u.meta["experts"] for p in self._expert_pieces(model, b, e, stats, f"{b.module}.{e}")]
        out = []
        for p in u.meta["ins"]:
            st = stats.get(p.module)
            out.append((p.name, part_weight(model, p), None if st is None else st.part(None if p.whole else p.row_index()),
                        "row"))
        p = u.meta["out"]
        out.append((p.name, part_weight(model, p), stats.get(p.module), "col"))
        return out

    def score(self, model, units, stats, proxy: Proxy):
        scores = {}
        for u in units:
            num = den = 0.0
            for n, W, st, _ in self._pieces(model, u, stats):
                num += check_score(proxy.weight_score(n, W, st), n, proxy.name) * W.numel()
                den += W.numel()
            scores[u.name] = num / den
        return scores

    def factorize(self, model, units, stats, proxy: Proxy):
        out = {}
        for u in track(units, "channel ranking", "units"):
            if u.meta.get("shared"):  # one width for all the experts (module docstring)
                b = u.meta["block"]
                ranked = [self._ranked(self._expert_pieces(model, b, e, stats, f"{b.module}.{e}"), proxy,
                                       f"{b.module}.{e}") for e in u.meta["experts"]]
                out[u.name] = {"orders": torch.stack([o for o, _ in ranked]),
                               "energy": torch.stack([en for _, en in ranked]).sum(0)}
                continue
            order, energy = self._ranked(self._pieces(model, u, stats), proxy, u.name)
            out[u.name] = {"order": order, "energy": energy}
        return out

    @staticmethod
    def _ranked(pieces, proxy: Proxy, name: str):
        """``(order, energy)``: the channels most important first, and their importance in that order."""
        e = 0
        for n, W, st, side in pieces:
            e = e + (proxy.row_energy(n, W, st) if side == "row" else proxy.col_energy(n, W, st)).double().cpu()
        order = channel_order(e, name)
        return order, e[order]

    def error_curve(self, unit, factors):
        return factors.get(unit.name, {}).get("energy")

    def _expert_widths(self, units, dims) -> dict:
        """block -> (its units in expert order, the width of each expert) for the blocks ``dims`` prunes expert by
        expert (the shared width's blocks are not here)."""
        by: dict = {}
        for u in units:
            if "block" in u.meta and not u.meta.get("shared"):
                by.setdefault(u.meta["block"], []).append(u)
        out = {}
        for b, us in by.items():
            if any(u.name in dims for u in us):
                us = sorted(us, key=lambda u: u.meta["experts"][0])
                out[b] = (us, [int(dims.get(u.name, b.width)) for u in us])
        return out

    @staticmethod
    def _shared_blocks(units, dims) -> list:
        """The units ``dims`` prunes that give all the experts of a block one width."""
        return [u for u in units if u.name in dims and u.meta.get("shared")]

    def _act(self, model) -> str:
        from gac.compression.discovery import text_config

        act = getattr(text_config(model.config), "hidden_act", None)
        if not isinstance(act, str):
            raise GacError("the model's config names no hidden_act for its experts")
        return act

    def module_specs(self, model, units, dims):
        self.check_dims(units, dims)
        out = {}
        for u in units:
            if u.name in dims and "block" not in u.meta:
                w = int(dims[u.name])
                ins = u.meta["ins"]
                for m in dict.fromkeys(p.module for p in ins):
                    n = sum(1 for p in ins if p.module == m)
                    bias = part_bias(model, next(p for p in ins if p.module == m)) is not None
                    out[m] = {"type": "linear", "in": ins[0].in_features, "out": n * w, "bias": bias}
                p = u.meta["out"]
                out[p.module] = {"type": "linear", "in": w, "out": p.out_features, "bias": part_bias(model, p) is not None}
        for b, (_, widths) in self._expert_widths(units, dims).items():
            out[b.module] = {"type": "experts", "hidden": b.hidden, "widths": widths, "act": self._act(model)}
        for u in self._shared_blocks(units, dims):
            b = u.meta["block"]
            out[b.module] = {"type": "fused_experts", "experts": b.num_experts, "hidden": b.hidden,
                             "width": int(dims[u.name])}
        return out

    def apply(self, model, units, dims, factors):
        old = {}
        for u in units:
            if u.name not in dims or "block" in u.meta:
                continue
            keep = kept_channels(factors[u.name]["order"], int(dims[u.name]))
            ins, outp = u.meta["ins"], u.meta["out"]
            with torch.no_grad():
                new = {}
                for m in dict.fromkeys(p.module for p in ins):  # a packed gate|up keeps its halves: gate rows, up rows
                    ps = [p for p in ins if p.module == m]
                    ws = [prune_rows(part_weight(model, p), keep) for p in ps]
                    bs = [part_bias(model, p) for p in ps]
                    bias = None if bs[0] is None else torch.cat([b[keep.to(b.device)] for b in bs])
                    new[m] = linear_from(torch.cat(ws) if len(ws) > 1 else ws[0], bias)
                new[outp.module] = linear_from(prune_cols(part_weight(model, outp), keep), part_bias(model, outp))
            for m, mod in new.items():
                old[m] = replace_module(model, m, mod)
        for b, (us, widths) in self._expert_widths(units, dims).items():
            mod = get_module(model, b.module)
            gu, dn = getattr(mod, b.gate_up), getattr(mod, b.down)
            new = ExpertMLPs(b.hidden, widths, self._act(model), dtype=gu.dtype, device=gu.device)
            with torch.no_grad():
                for u, w in zip(us, widths):
                    e = u.meta["experts"][0]
                    keep = (kept_channels(factors[u.name]["order"], w) if u.name in dims
                            else torch.arange(b.width)).to(gu.device)
                    new.gate_up[e].weight.copy_(torch.cat([gu[e][keep], gu[e][b.width + keep]]))
                    new.down[e].weight.copy_(dn[e][:, keep])
            old[b.module] = replace_module(model, b.module, new)
        for u in self._shared_blocks(units, dims):
            b, w = u.meta["block"], int(dims[u.name])
            mod = get_module(model, b.module)
            gu, dn = getattr(mod, b.gate_up), getattr(mod, b.down)
            # each expert's own w best channels, in their original order: [E, w]
            keep = torch.stack([kept_channels(o, w) for o in factors[u.name]["orders"]]).to(gu.device)
            rows = keep[:, :, None].expand(-1, -1, gu.shape[2])
            with torch.no_grad():
                new_gu = torch.cat([gu.gather(1, rows), gu.gather(1, rows + b.width)], dim=1)  # gate rows, then up rows
                new_dn = dn.gather(2, keep[:, None, :].expand(-1, dn.shape[1], -1))
            old[b.module] = replace_module(model, b.module, fused_experts_like(mod, w, new_gu, new_dn))
        return old
