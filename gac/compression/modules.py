"""Compressed modules and the one place where a model's layers are swapped.

* :class:`LowRankLinear` — ``y = A (B x) + b``: ``down`` holds B (rank x in), ``up`` holds A (out x rank). ASVD and
  SVD-LLM produce it; its weight parameters are ``rank * (in + out)``.
* :class:`GroupedLowRankLinear` — PaLU's group-wise low-rank projection: one shared ``down`` (sum of ranks x in),
  one ``up`` per head group (out_g x rank_g), outputs concatenated; weights ``in * sum(r) + sum(r_g * out_g)``.
* a narrower :class:`torch.nn.Linear` — structured pruning (LLM-Pruner) keeps a subset of rows or columns.

Every module is described by a JSON-able *spec* (:func:`module_spec`) and rebuilt from it (:func:`build_module`):
a gac checkpoint records the spec of every projection, so a reload rebuilds the compressed structure before any
weight is read. :func:`replace_module` is the only function in gac that swaps a module inside a model.
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


def replace_module(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Swap the module at dotted path ``name`` for ``new``; return the old one. The only swap in gac."""
    parent_name, _, child = name.rpartition(".")
    parent = get_module(model, parent_name) if parent_name else model
    if not hasattr(parent, child):
        raise GacError(f"model has no module named {name!r}")
    old = getattr(parent, child)
    setattr(parent, child, new)
    guard_save_pretrained(model)
    return old


# ----------------------------------------------------------------------------------------- the save_pretrained trap


def hf_loadable(model: nn.Module) -> bool:
    """Would ``from_pretrained`` on a folder written by ``save_pretrained`` rebuild this model's every weight?

    True when the model's parameters (names and shapes) are exactly those of its architecture built from its own
    config; false for a model with low-rank or pruned layers, whose weights transformers would random-initialise."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            ref = AutoModelForCausalLM.from_config(model.config)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot rebuild is not loadable either
        return False
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return shapes == {k: tuple(v.shape) for k, v in ref.state_dict().items()}


def save_pretrained(self, save_directory, *args, **kwargs):
    """``save_pretrained`` of a model gac has compressed (installed by :func:`guard_save_pretrained`).

    A model whose parameters still match its architecture is saved by transformers as usual. Otherwise a standard
    folder would load with random weights, so this writes a **gac checkpoint** instead (load it with
    ``gac.models.load_model(path)``; ``from_pretrained`` on it fails loudly), or refuses what cannot be redirected
    (``push_to_hub=True``, a custom ``state_dict``)."""
    import logging

    if hf_loadable(self):
        return type(self).save_pretrained(self, save_directory, *args, **kwargs)
    fix = ("save it with gac.compression.checkpoint.save_checkpoint(model, tokenizer, path) and load it with "
           "gac.models.load_model(path)")
    if kwargs.get("push_to_hub"):
        raise GacError(f"this model has gac-compressed layers: save_pretrained(push_to_hub=True) would upload a "
                       f"folder that from_pretrained loads with random weights; {fix} (then upload that folder)")
    if kwargs.get("state_dict") is not None or args:
        raise GacError(f"this model has gac-compressed layers: save_pretrained with a custom state_dict or "
                       f"positional options cannot be redirected to a gac checkpoint; {fix}")
    from gac.compression.checkpoint import save_checkpoint

    out = save_checkpoint(self, None, save_directory, merge=True)
    logging.getLogger(__name__).warning(
        "model.save_pretrained(%r) wrote a gac checkpoint: this model has gac-compressed layers, which a standard "
        "transformers folder would reload with random weights. Load it with gac.models.load_model(%r) (or "
        "gac.compression.checkpoint.load_checkpoint); transformers' from_pretrained refuses it.", str(out), str(out))
    return None


def guard_save_pretrained(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` safe once gac has changed the model's layers (see :func:`save_pretrained`)."""
    import types

    if hasattr(type(model), "save_pretrained") and hasattr(model, "config") and \
            getattr(model.__dict__.get("save_pretrained"), "__func__", None) is not save_pretrained:
        model.save_pretrained = types.MethodType(save_pretrained, model)
