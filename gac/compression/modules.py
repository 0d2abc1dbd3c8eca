"""Compressed modules: their types, their JSON specs, and the bare swap of one module in a model.

* :class:`LowRankLinear` — ``y = A (B x) + b``: ``down`` holds B (rank x in), ``up`` holds A (out x rank). ASVD and
  SVD-LLM produce it; its weight parameters are ``rank * (in + out)``.
* :class:`GroupedLowRankLinear` — PaLU's group-wise low-rank projection: one shared ``down`` (sum of ranks x in),
  one ``up`` per head group (out_g x rank_g), outputs concatenated; weights ``in * sum(r) + sum(r_g * out_g)``. Its
  latent codes ``down(x)`` are what PaLU's KV cache holds (:mod:`gac.compression.latent_cache`).
* a narrower :class:`torch.nn.Linear` — structured pruning (LLM-Pruner) keeps a subset of rows or columns.
* :class:`SplitLinear` — a fused projection (Phi-3's ``qkv_proj``, GPT-2's ``c_attn``) whose roles became separate
  modules: each part computes its own output rows (``rows``, ranges of the fused output), the outputs are put back in
  the fused order. Parts are any of the modules here.
* :class:`ExpertMLPs` — a mixture-of-experts block whose experts have their own widths (pruned expert by expert):
  per expert a ``gate_up`` Linear (H -> 2 w_e: gate rows then up rows) and a ``down`` Linear (w_e -> H), called as
  transformers 5's expert modules are (``hidden [T, H], top_k_index [T, k], top_k_weights [T, k]``).
* the model's own experts module at a narrower width (:func:`fused_experts_like`) — experts pruned to one width
  shared by all the experts of a layer stay in transformers' fused 3-D ``gate_up_proj`` [E, 2w, H] and ``down_proj``
  [E, H, w], run by the model's own forward (its grouped or batched GEMM); spec ``fused_experts``.

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
        self.keep_latent = False  # set for one call by the latent cache's hook; the codes then wait in ``latent``
        self.latent = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.down(x)
        if self.keep_latent:  # PaLU's latent cache takes the codes of this call (gac.compression.latent_cache)
            self.latent = z
        return self.from_latent(z)

    def from_latent(self, z: torch.Tensor) -> torch.Tensor:
        """The output from the latent codes ``z = down(x)`` (the group codes side by side, ``sum(ranks)`` wide)."""
        zs = z.split(self.ranks, dim=-1)
        y = torch.cat([up(zg) for up, zg in zip(self.ups, zs)], dim=-1)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, outs={self.outs}, ranks={self.ranks}"


class SplitLinear(nn.Module):
    """A fused projection computed part by part: ``y[..., rows_r] = part_r(x)`` (module docstring)."""

    def __init__(self, in_features: int, roles: list[str], rows: list, parts: list[nn.Module]):
        super().__init__()
        if not (len(roles) == len(rows) == len(parts)) or not roles:
            raise GacError(f"SplitLinear needs one row range list and one module per role, got {roles}")
        self.in_features = int(in_features)
        self.roles = [str(r) for r in roles]
        self.rows = [[[int(a), int(b)] for a, b in rr] for rr in rows]
        self.parts = nn.ModuleList(parts)
        for r, rr, m in zip(self.roles, self.rows, self.parts):
            n = sum(b - a for a, b in rr)
            if getattr(m, "out_features", None) != n or getattr(m, "in_features", None) != self.in_features:
                raise GacError(f"SplitLinear part {r}: a {getattr(m, 'in_features', '?')} -> "
                               f"{getattr(m, 'out_features', '?')} module for {n} rows of a {self.in_features}-input "
                               f"projection")
        flat = [i for rr in self.rows for a, b in rr for i in range(a, b)]
        self.out_features = len(flat)
        if sorted(flat) != list(range(self.out_features)):
            raise GacError(f"SplitLinear rows {self.rows} do not cover 0..{self.out_features - 1} exactly once")
        # the fused row each concatenated output lands on; None when concatenation is already the fused order
        self._order = None if flat == list(range(self.out_features)) else [flat.index(i) for i in range(len(flat))]
        self._index: dict = {}

    def part(self, role: str) -> nn.Module:
        return self.parts[self.roles.index(role)]

    def set_part(self, role: str, module: nn.Module) -> nn.Module:
        i = self.roles.index(role)
        old = self.parts[i]
        if getattr(module, "out_features", None) != old.out_features:
            raise GacError(f"SplitLinear part {role}: {getattr(module, 'out_features', '?')} outputs for "
                           f"{old.out_features} rows")
        self.parts[i] = module
        return old

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([p(x) for p in self.parts], dim=-1)
        if self._order is None:
            return y
        idx = self._index.get(y.device)
        if idx is None:
            idx = self._index[y.device] = torch.tensor(self._order, device=y.device)
        return y.index_select(-1, idx)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, roles={self.roles}"


class ExpertMLPs(nn.Module):
    """Gated expert MLPs of their own widths (module docstring); ``act``: the activation's transformers name."""

    def __init__(self, hidden: int, widths: list[int], act: str, dtype=None, device=None):
        super().__init__()
        from transformers.activations import ACT2FN

        if not widths or min(widths) < 1:
            raise GacError(f"ExpertMLPs needs every expert width >= 1, got {widths}")
        if act not in ACT2FN:
            raise GacError(f"unknown expert activation {act!r}")
        self.hidden, self.widths, self.act = int(hidden), [int(w) for w in widths], str(act)
        self.num_experts = len(self.widths)
        self.act_fn = ACT2FN[self.act]
        self.gate_up = nn.ModuleList(nn.Linear(hidden, 2 * w, bias=False, dtype=dtype, device=device) for w in widths)
        self.down = nn.ModuleList(nn.Linear(w, hidden, bias=False, dtype=dtype, device=device) for w in widths)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            top = int(top_k_index.max()) if top_k_index.numel() else -1
            if top >= self.num_experts:  # its tokens would get no MLP output at all, silently
                raise GacError(f"the router picked expert {top}, but this ExpertMLPs holds {self.num_experts} experts "
                               f"(0..{self.num_experts - 1}): the router and the experts come from different models; "
                               f"re-save the checkpoint from the model")
            mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = int(e[0])
            if e == self.num_experts:
                continue
            pos, tok = torch.where(mask[e])
            gate, up = self.gate_up[e](hidden_states[tok]).chunk(2, dim=-1)
            h = self.down[e](self.act_fn(gate) * up) * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, widths={self.widths}, act={self.act}"


def fused_experts_like(like: nn.Module, width: int, gate_up: torch.Tensor | None = None,
                       down: torch.Tensor | None = None, dtype=None, device=None) -> nn.Module:
    """A module of ``like``'s own class (its forward, activation and experts implementation) whose 3-D expert
    parameters are ``width`` wide: ``gate_up`` [E, 2 width, H] and ``down`` [E, H, width] when given (taken as they
    are: pass tensors of their own, not views of ``like``'s), uninitialised otherwise. ``like`` itself is left as it is (a probe can put it back)."""
    import copy

    if not is_fused_experts(like):
        raise GacError(f"fused experts are rebuilt from the model's own experts module (3-D gate_up_proj and "
                       f"down_proj), not from a {type(like).__name__}")
    E, _, H = like.gate_up_proj.shape
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise GacError(f"fused experts need a whole width >= 1, got {width!r}")
    dtype = dtype or like.gate_up_proj.dtype
    device = device if device is not None else like.gate_up_proj.device
    want = {"gate_up_proj": (E, 2 * width, H), "down_proj": (E, H, width)}
    new = copy.copy(like)  # the same class and attributes; its own parameter, buffer and child dicts below
    new._parameters, new._buffers, new._modules = dict(like._parameters), dict(like._buffers), dict(like._modules)
    for name, t in (("gate_up_proj", gate_up), ("down_proj", down)):
        if t is not None and tuple(t.shape) != want[name]:
            raise GacError(f"fused experts {name}: shape {tuple(t.shape)}, expected {want[name]}")
        data = torch.empty(want[name], dtype=dtype, device=device) if t is None else t.detach().to(device=device, dtype=dtype)
        new._parameters[name] = nn.Parameter(data, requires_grad=like._parameters[name].requires_grad)
    if hasattr(new, "intermediate_dim"):  # transformers' experts record their width (their forward reads the shapes)
        new.intermediate_dim = int(width)
    return new


def _is_conv1d(m: nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and getattr(m, "weight", None) is not None


def is_fused_experts(m: nn.Module) -> bool:
    """transformers 5's experts block: 3-D ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I] parameters."""
    gu, dn = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    return isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter) and gu.dim() == 3 and dn.dim() == 3


def module_spec(m: nn.Module) -> dict:
    """The JSON-able shape description of a (possibly compressed) projection."""
    if isinstance(m, SplitLinear):
        return {"type": "split", "in": m.in_features, "roles": list(m.roles), "rows": [list(map(list, r)) for r in m.rows],
                "parts": [module_spec(p) for p in m.parts]}
    if isinstance(m, ExpertMLPs):
        return {"type": "experts", "hidden": m.hidden, "widths": list(m.widths), "act": m.act}
    if is_fused_experts(m):
        E, two_i, H = m.gate_up_proj.shape
        return {"type": "fused_experts", "experts": int(E), "hidden": int(H), "width": int(two_i) // 2}
    if _is_conv1d(m):
        return {"type": "conv1d", "in": int(m.weight.shape[0]), "out": int(m.weight.shape[1]), "bias": m.bias is not None}
    if isinstance(m, LowRankLinear):
        return {"type": "lowrank", "in": m.in_features, "out": m.out_features, "rank": m.rank, "bias": m.up.bias is not None}
    if isinstance(m, GroupedLowRankLinear):
        return {"type": "grouped_lowrank", "in": m.in_features, "outs": list(m.outs), "ranks": list(m.ranks),
                "bias": m.bias is not None}
    if isinstance(m, nn.Linear):
        return {"type": "linear", "in": m.in_features, "out": m.out_features, "bias": m.bias is not None}
    raise GacError(f"cannot describe module of type {type(m).__name__}; gac knows Linear, Conv1D, LowRankLinear, "
                   f"GroupedLowRankLinear, SplitLinear, ExpertMLPs")


def build_module(spec: dict, dtype=None, device=None, like: nn.Module | None = None) -> nn.Module:
    """An (uninitialised-valued) module of the shape ``spec`` describes. ``like``: the module the spec replaces (a
    ``fused_experts`` spec is the model's own experts class at another width, built from it)."""
    kind = spec.get("type")
    try:
        if kind == "fused_experts":
            if like is None or not is_fused_experts(like):
                raise GacError("a fused_experts spec replaces the model's own experts module (3-D gate_up_proj and "
                               "down_proj); there is none at its place")
            E, _, H = like.gate_up_proj.shape
            if (spec["experts"], spec["hidden"]) != (int(E), int(H)):
                raise GacError(f"it holds {spec['experts']} experts of hidden size {spec['hidden']}, but the model's "
                               f"router picks among {int(E)} experts of hidden size {int(H)} (its base_config): the "
                               f"experts and the router come from different models")
            return fused_experts_like(like, spec["width"], dtype=dtype, device=device)
        if kind == "lowrank":
            return LowRankLinear(spec["in"], spec["out"], spec["rank"], bias=spec["bias"], dtype=dtype, device=device)
        if kind == "grouped_lowrank":
            return GroupedLowRankLinear(spec["in"], spec["outs"], spec["ranks"], bias=spec["bias"], dtype=dtype, device=device)
        if kind == "linear":
            return nn.Linear(spec["in"], spec["out"], bias=spec["bias"], dtype=dtype, device=device)
        if kind == "split":
            parts = [build_module(p, dtype=dtype, device=device) for p in spec["parts"]]
            return SplitLinear(spec["in"], spec["roles"], spec["rows"], parts)
        if kind == "experts":
            return ExpertMLPs(spec["hidden"], spec["widths"], spec["act"], dtype=dtype, device=device)
        if kind == "conv1d":
            from transformers.pytorch_utils import Conv1D

            m = Conv1D(spec["out"], spec["in"]).to(dtype=dtype, device=device)
            if not spec["bias"]:
                m.bias = None
            return m
    except KeyError as e:
        raise GacError(f"module spec {spec} lacks the key {e}; the checkpoint config is damaged") from None
    raise GacError(f"unknown module spec type {kind!r} in {spec}; known: linear, conv1d, lowrank, grouped_lowrank, "
                   f"split, experts, fused_experts")


def weight_params(m: nn.Module) -> int:
    """Parameters in the weight matrices of a projection (biases excluded)."""
    if isinstance(m, nn.Linear) or _is_conv1d(m):
        return m.weight.numel()
    if isinstance(m, SplitLinear):
        return sum(weight_params(p) for p in m.parts)
    if isinstance(m, ExpertMLPs):
        return sum(g.weight.numel() + d.weight.numel() for g, d in zip(m.gate_up, m.down))
    if is_fused_experts(m):
        return m.gate_up_proj.numel() + m.down_proj.numel()
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
