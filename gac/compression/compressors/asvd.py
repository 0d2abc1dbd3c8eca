"""ASVD (Yuan et al. 2023): activation-aware SVD of every projection, ``W diag(S) = U Sigma V^T``, ``S^-1`` folded into B.

Its default allocation is the reference's sensitivity search (``gac.compression.allocation.sensitivity_allocation``):
a calibration-perplexity table over kept parameter ratios (``sensitivity_grid``, the reference's 0.4 ... 0.9) and a
binary search on the perplexity threshold that meets the budget; weights with no acceptable ratio stay dense.
"""

from __future__ import annotations

import torch
from torch import nn

from gac.compression.allocation import SENSITIVITY_GRID, check_sensitivity_grid
from gac.compression.compressors.base import Compressor, Unit, lowrank_unit, parse_layers
from gac.compression.compressors.lowrank_math import asvd_factors
from gac.compression.discovery import PROJECTIONS, ModelLayout
from gac.compression.importance import Proxy, WeightStats, check_score
from gac.compression.modules import LowRankLinear, get_module, replace_module
from gac.errors import GacError


class LowRankCompressor(Compressor):
    """Shared by the per-projection low-rank compressors (ASVD, SVD-LLM): one unit per Linear, each of which may
    stay dense (plan dimension ``min(out, in)``: the Linear is left as it is)."""

    def __init__(self, projections=PROJECTIONS, layers=None):
        bad = [p for p in projections if p not in PROJECTIONS]
        if bad or not projections:
            raise GacError(f"unknown projections {bad}; choose among {', '.join(PROJECTIONS)}")
        self.projections = tuple(projections)
        self.layers = layers

    def units(self, model, layout: ModelLayout) -> list[Unit]:
        idx = parse_layers(self.layers, layout.num_layers)
        out = []
        for name in layout.linear_names(self.projections, idx):
            mod = get_module(model, name)
            if not isinstance(mod, nn.Linear):
                raise GacError(f"{name} is a {type(mod).__name__}, not a dense Linear; it is already compressed")
            out.append(lowrank_unit(name, mod.out_features, mod.in_features, (name,), {"layer": layout.layer_of(name)},
                                    dense=True))
        return out

    def score(self, model, units, stats, proxy: Proxy):
        return {
            u.name: check_score(proxy.weight_score(u.name, get_module(model, u.name).weight, stats.get(u.name)), u.name, proxy.name)
            for u in units
        }

    def _factors(self, W: torch.Tensor, st: WeightStats | None, unit: Unit) -> tuple[torch.Tensor, torch.Tensor, dict]:
        raise NotImplementedError

    def factorize(self, model, units, stats, proxy):
        out = {}
        for u in units:
            W = get_module(model, u.name).weight
            A, B, info = self._factors(W, stats.get(u.name), u)
            out[u.name] = {"A": A.cpu(), "B": B.cpu(), **info}
        return out

    def module_specs(self, model, units, dims):
        self.check_dims(units, dims, dense_ok=True)
        out = {}
        for u in units:
            if u.name in dims and dims[u.name] != u.d_full:  # at d_full (a dense candidate) the Linear stays
                mod = get_module(model, u.name)
                out[u.name] = {"type": "lowrank", "in": mod.in_features, "out": mod.out_features,
                               "rank": int(dims[u.name]), "bias": mod.bias is not None}
        return out

    def apply(self, model, units, dims, factors):
        old = {}
        for u in units:
            if u.name not in dims:
                continue
            r = int(dims[u.name])
            f = factors[u.name]
            if u.is_dense(r):  # left dense: the Linear stays as it is
                if not isinstance(get_module(model, u.name), nn.Linear):
                    raise GacError(f"{u.name}: the plan keeps it dense, but the model holds a compressed module there")
                continue
            if not 1 <= r <= f["A"].shape[1]:
                raise GacError(f"{u.name}: rank {r} outside the factorised range 1..{f['A'].shape[1]} "
                               f"(or {u.d_full}: dense)")
            mod = get_module(model, u.name)
            W = mod.weight
            new = LowRankLinear.from_factors(
                f["A"][:, :r].to(W.device), f["B"][:r].to(W.device), bias=mod.bias, dtype=W.dtype
            )
            old[u.name] = replace_module(model, u.name, new)
        return old


class ASVD(LowRankCompressor):
    """Activation-aware SVD. ``alpha``: exponent of the per-channel scale ``mean|X|^alpha`` (paper default 0.5).

    All seven projections of every layer by default (224 weights on Llama-3-8B, as in the GAC paper).
    ``sensitivity_grid``: the kept parameter ratios of the sensitivity table (each in (0, 1]; 1 means dense).
    """

    name = "asvd"
    default_proxy = "activation"
    needs_act = True
    default_allocation = "sensitivity"

    def __init__(self, projections=PROJECTIONS, layers=None, alpha: float = 0.5, sensitivity_grid=SENSITIVITY_GRID):
        super().__init__(projections, layers)
        self.alpha = float(alpha)
        self.sensitivity_grid = check_sensitivity_grid(sensitivity_grid)

    def _factors(self, W, st, unit):
        if st is None or st.act_abs is None:
            raise GacError(f"ASVD needs activation statistics for {unit.name}; calibration did not record them")
        A, B = asvd_factors(W, st.act_abs_mean(), self.alpha, max_rank=unit.d_cap, name=unit.name)
        return A, B, {}
