"""PaLU-style low-rank K/V projections per head group (Chang et al. 2025).

Each K and V projection is split into groups of ``group_size`` KV heads (the largest divisor of the KV head count
not above ``group_size``; PaLU's G-LRD uses 4); every group gets its own rank, allocated by Fisher importance by
default and aligned by gac. A group ``W_g`` (group_size * head_dim x hidden) is factorised by truncated SVD; the
compressed projection is a :class:`~gac.compression.modules.GroupedLowRankLinear` (one shared down-projection to the latent,
one up-projection per group), so ``params(r_g) = r_g * (hidden + group_size * head_dim)``.
"""

from __future__ import annotations

import torch
from torch import nn

from gac.compression.compressors.base import Compressor, Unit, lowrank_unit, parse_layers
from gac.compression.compressors.lowrank_math import svd_factors
from gac.compression.discovery import ModelLayout
from gac.compression.importance import Proxy, check_score
from gac.compression.modules import GroupedLowRankLinear, get_module, replace_module
from gac.errors import GacError


class PaLU(Compressor):
    name = "palu"
    default_proxy = "fisher"
    supports_sensitivity = False

    def __init__(self, layers=None, group_size: int = 4, projections=("k_proj", "v_proj")):
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise GacError(f"PaLU group_size must be a positive number of KV heads, got {group_size!r}")
        bad = [p for p in projections if p not in ("k_proj", "v_proj")]
        if bad or not projections:
            raise GacError(f"PaLU compresses k_proj and/or v_proj, got {list(projections)}")
        self.layers, self.group_size, self.projections = layers, group_size, tuple(projections)

    def units(self, model, layout: ModelLayout) -> list[Unit]:
        n_kv, hd = layout.num_kv_heads, layout.head_dim
        gs = max(d for d in range(1, min(self.group_size, n_kv) + 1) if n_kv % d == 0)
        out = []
        for i in parse_layers(self.layers, layout.num_layers):
            for p in self.projections:
                name = layout.layers[i].name(p)
                mod = get_module(model, name)
                if not isinstance(mod, nn.Linear):
                    raise GacError(f"{name} is a {type(mod).__name__}, not a dense Linear; it is already compressed")
                if mod.out_features != n_kv * hd:
                    raise GacError(f"{name}: out_features {mod.out_features} != num_kv_heads * head_dim ({n_kv} * {hd})")
                rows = gs * hd
                for g in range(n_kv // gs):
                    out.append(lowrank_unit(f"{name}.group{g}", rows, mod.in_features, (name,),
                                            {"layer": i, "module": name, "group": g, "rows": [g * rows, (g + 1) * rows],
                                             "heads": gs}))
        return out

    def score(self, model, units, stats, proxy: Proxy):
        cache: dict[str, torch.Tensor] = {}
        scores = {}
        for u in units:
            m = u.meta["module"]
            if m not in cache:
                cache[m] = proxy.row_energy(m, get_module(model, m).weight, stats.get(m))
            a, b = u.meta["rows"]
            e = float(cache[m][a:b].sum())
            scores[u.name] = check_score(proxy.group_score(e, u.dense_params), u.name, proxy.name)
        return scores

    def factorize(self, model, units, stats, proxy):
        out = {}
        for u in units:
            W = get_module(model, u.meta["module"]).weight
            a, b = u.meta["rows"]
            A, B = svd_factors(W[a:b], max_rank=u.d_cap, name=u.name)
            out[u.name] = {"A": A, "B": B}
        return out

    def module_specs(self, model, units, dims):
        self.check_dims(units, dims)
        by_module: dict[str, list[Unit]] = {}
        for u in units:
            by_module.setdefault(u.meta["module"], []).append(u)
        out = {}
        for m, us in by_module.items():
            chosen = [u for u in us if u.name in dims]
            if not chosen:
                continue
            if len(chosen) != len(us):
                raise GacError(f"PaLU applies a whole projection at once: {m} needs a rank for each of its {len(us)} groups")
            us = sorted(us, key=lambda u: u.meta["group"])
            mod = get_module(model, m)
            out[m] = {"type": "grouped_lowrank", "in": mod.in_features,
                      "outs": [u.meta["rows"][1] - u.meta["rows"][0] for u in us],
                      "ranks": [int(dims[u.name]) for u in us], "bias": mod.bias is not None}
        return out

    def apply(self, model, units, dims, factors):
        by_module: dict[str, list[Unit]] = {}
        for u in units:
            by_module.setdefault(u.meta["module"], []).append(u)
        old = {}
        for m, us in by_module.items():
            chosen = [u for u in us if u.name in dims]
            if not chosen:
                continue
            if len(chosen) != len(us):
                raise GacError(f"PaLU applies a whole projection at once: {m} needs a rank for each of its {len(us)} groups")
            us = sorted(us, key=lambda u: u.meta["group"])
            mod = get_module(model, m)
            W = mod.weight
            ranks = [int(dims[u.name]) for u in us]
            new = GroupedLowRankLinear(mod.in_features, [u.meta["rows"][1] - u.meta["rows"][0] for u in us], ranks,
                                       bias=mod.bias is not None, dtype=W.dtype, device=W.device)
            with torch.no_grad():
                new.down.weight.copy_(torch.cat([factors[u.name]["B"][:r] for u, r in zip(us, ranks)]).to(W))
                for up, u, r in zip(new.ups, us, ranks):
                    up.weight.copy_(factors[u.name]["A"][:, :r].to(W))
                if mod.bias is not None:
                    new.bias.copy_(mod.bias)
            old[m] = replace_module(model, m, new)
        return old
