"""Compressed modules: their types, their JSON specs, and the bare swap of one module in a model.

* :class:`LowRankLinear` — ``y = A (B x) + b``: ``down`` holds B (rank x in), ``up`` holds A (out x rank). ASVD and
  SVD-LLM produce it; its weight parameters are ``rank * (in + out)``.
* :class:`GroupedLowRankLinear` — PaLU's group-wise low-rank projection: one shared ``down`` (sum of ranks x in),
  one ``up`` per head group (out_g x rank_g), outputs concatenated; weights ``in * sum(r) + sum(r_g * out_g)``.
* a narrower :class:`torch.nn.Linear` — structured pruning (LLM-Pruner) keeps a subset of rows or columns.

Every module is described by a JSON-able *spec* (:func:`module_spec`) and rebuilt from it (:func:`build_module`):
a gac checkpoint records the spec of every projection, so a reload rebuilds the compressed structure before any
weight is read. :func:`set_module` is the bare swap; compression swaps through
:func:`gac.compression.swap.replace_module`, which also keeps ``save_pretrained`` safe.
Biases are carried unchanged and are not counted as compressed weights (:func:`weight_params`).
"""

from __future__ import annotations

import torch
from torch import nn

from gac.errors import GacError


class LowRankLinear(nn.Module):
    """``y = up(down(x))``: a rank-``rank`` factorisation ``W ~ A @ B`` of an ``out x in`` Linear."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = False, dtype=None, device=None):
        super().__init__()
        if rank < 1:
            raise GacError(f"LowRankLinear needs rank >= 1, got {rank}")
        self.in_features, self.out_features, self.rank = int(in_features), int(out_features), int(rank)
        self.down = nn.Linear(in_features, rank, bias=False, dtype=dtype, device=device)
        self.up = nn.Linear(rank, out_features, bias=bias, dtype=dtype, device=device)

    @classmethod
    def from_factors(cls, A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None, dtype=None) -> LowRankLinear:
        """Build from ``A`` (out x r) and ``B`` (r x in); ``bias`` (out) is copied as is."""
        out_f, r = A.shape
        r2, in_f = B.shape
        if r != r2:
            raise GacError(f"factor shapes do not chain: A {tuple(A.shape)}, B {tuple(B.shape)}")
        dtype = dtype or (bias.dtype if bias is not None else A.dtype)
        m = cls(in_f, out_f, r, bias=bias is not None, dtype=dtype, device=A.device)
        with torch.no_grad():
            m.down.weight.copy_(B.to(dtype))
            m.up.weight.copy_(A.to(dtype))
            if bias is not None:
                m.up.bias.copy_(bias.to(dtype))
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


class GroupedLowRankLinear(nn.Module):
    """PaLU-style group-wise low rank: ``y = concat_g(up_g(down(x)[slice_g])) + b``."""

    def __init__(self, in_features: int, outs: list[int], ranks: list[int], bias: bool = False, dtype=None, device=None):
        super().__init__()
        if len(outs) != len(ranks) or not outs:
            raise GacError(f"GroupedLowRankLinear needs one rank per group, got outs={outs} ranks={ranks}")
        if min(ranks) < 1:
            raise GacError(f"GroupedLowRankLinear needs every rank >= 1, got {ranks}")
        self.in_features, self.outs, self.ranks = int(in_features), [int(o) for o in outs], [int(r) for r in ranks]
        self.out_features = sum(self.outs)
        self.down = nn.Linear(in_features, sum(self.ranks), bias=False, dtype=dtype, device=device)
        self.ups = nn.ModuleList(nn.Linear(r, o, bias=False, dtype=dtype, device=device) for r, o in zip(self.ranks, self.outs))
        self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype, device=device)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zs = self.down(x).split(self.ranks, dim=-1)
        y = torch.cat([up(z) for up, z in zip(self.ups, zs)], dim=-1)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, outs={self.outs}, ranks={self.ranks}"


def module_spec(m: nn.Module) -> dict:
    """The JSON-able shape description of a (possibly compressed) projection."""
    if isinstance(m, LowRankLinear):
        return {"type": "lowrank", "in": m.in_features, "out": m.out_features, "rank": m.rank, "bias": m.up.bias is not None}
    if isinstance(m, GroupedLowRankLinear):
        return {"type": "grouped_lowrank", "in": m.in_features, "outs": list(m.outs), "ranks": list(m.ranks),
                "bias": m.bias is not None}
    if isinstance(m, nn.Linear):
        return {"type": "linear", "in": m.in_features, "out": m.out_features, "bias": m.bias is not None}
    raise GacError(f"cannot describe module of type {type(m).__name__}; gac knows Linear, LowRankLinear, GroupedLowRankLinear")


def build_module(spec: dict, dtype=None, device=None) -> nn.Module:
    """An (uninitialised-valued) module of the shape ``spec`` describes."""
    kind = spec.get("type")
    try:
        if kind == "lowrank":
            return LowRankLinear(spec["in"], spec["out"], spec["rank"], bias=spec["bias"], dtype=dtype, device=device)
        if kind == "grouped_lowrank":
            return GroupedLowRankLinear(spec["in"], spec["outs"], spec["ranks"], bias=spec["bias"], dtype=dtype, device=device)
        if kind == "linear":
            return nn.Linear(spec["in"], spec["out"], bias=spec["bias"], dtype=dtype, device=device)
    except KeyError as e:
        raise GacError(f"module spec {spec} lacks the key {e}; the checkpoint config is damaged") from None
    raise GacError(f"unknown module spec type {kind!r} in {spec}; known: linear, lowrank, grouped_lowrank")


def weight_params(m: nn.Module) -> int:
    """Parameters in the weight matrices of a projection (biases excluded)."""
    if isinstance(m, nn.Linear):
        return m.weight.numel()
    if isinstance(m, LowRankLinear):
        return m.down.weight.numel() + m.up.weight.numel()
    if isinstance(m, GroupedLowRankLinear):
        return m.down.weight.numel() + sum(u.weight.numel() for u in m.ups)
    raise GacError(f"cannot count weights of module type {type(m).__name__}")


def get_module(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise GacError(f"model has no module named {name!r}") from None


def set_module(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Put ``new`` at dotted path ``name``; return the old module. The bare swap: compression swaps through
    :func:`gac.compression.swap.replace_module`, which also guards ``save_pretrained``."""
    parent_name, _, child = name.rpartition(".")
    parent = get_module(model, parent_name) if parent_name else model
    if not hasattr(parent, child):
        raise GacError(f"model has no module named {name!r}")
    old = getattr(parent, child)
    setattr(parent, child, new)
    return old
