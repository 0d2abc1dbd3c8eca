"""A role's weight inside a model: read it as ``out x in``, count it, and put a compressed module in its place.

Compressors work on :class:`~gac.compression.discovery.Projection` s, not module names: a projection may be a whole
``nn.Linear``, the rows of a fused module (Phi-3's ``qkv_proj[k]``), rows interleaved per head (GPT-NeoX), or a
transposed ``Conv1D`` (GPT-2). These functions hide the difference:

* :func:`part_weight` / :func:`part_bias` — the projection's weight as an ``out x in`` tensor and its bias;
* :func:`replace_part` — install a module for one projection: the module itself for a whole one; for part of a fused
  module, the fused module first becomes a :class:`~gac.compression.modules.SplitLinear` whose other parts stay dense
  (their rows of the original weight, unchanged) and then takes the new part;
* :func:`part_params` — the weight parameters one projection (or one expert of an expert block) holds now, so the
  plan's parameter count is checked against the model whatever the fusion;
* :func:`stat_tensor` — the parameter a gradient statistic is taken of (a module's weight, or a 3-D expert
  parameter), with the axis of its rows.
"""

from __future__ import annotations

import torch
from torch import nn

from gac.compression.discovery import ModelLayout, Projection
from gac.compression.modules import ExpertMLPs, SplitLinear, get_module, weight_params
from gac.compression.swap import replace_module
from gac.errors import GacError


def module_weight(mod: nn.Module) -> torch.Tensor:
    """A linear module's weight as ``out x in`` (a view: a ``Conv1D`` stores ``in x out``)."""
    w = mod.weight
    return w.t() if type(mod).__name__ == "Conv1D" else w


def _rows(t: torch.Tensor, proj: Projection) -> torch.Tensor:
    if proj.rows is None:
        return t
    if len(proj.rows) == 1:
        a, b = proj.rows[0]
        return t[a:b]
    return torch.cat([t[a:b] for a, b in proj.rows])


def part_weight(model: nn.Module, proj: Projection) -> torch.Tensor:
    """The projection's weight, ``out_features x in_features``, from the model as it is (dense modules only)."""
    mod = get_module(model, proj.module)
    if isinstance(mod, SplitLinear):
        mod = mod.part(proj.role)
        if not isinstance(mod, nn.Linear):
            raise GacError(f"{proj.name} is a {type(mod).__name__}, not a dense Linear; it is already compressed")
        return mod.weight
    if not (isinstance(mod, nn.Linear) or type(mod).__name__ == "Conv1D"):
        raise GacError(f"{proj.module} is a {type(mod).__name__}, not a dense Linear; it is already compressed")
    return _rows(module_weight(mod), proj)


def part_bias(model: nn.Module, proj: Projection) -> torch.Tensor | None:
    mod = get_module(model, proj.module)
    if isinstance(mod, SplitLinear):
        b = getattr(mod.part(proj.role), "bias", None)
        return b if isinstance(b, torch.Tensor) else None
    b = getattr(mod, "bias", None)
    return None if b is None else _rows(b, proj)


def is_dense(model: nn.Module, proj: Projection) -> bool:
    """Whether the projection is still an uncompressed weight (a dense module, or a dense part of a split one)."""
    mod = get_module(model, proj.module)
    if isinstance(mod, SplitLinear):
        mod = mod.part(proj.role)
    return isinstance(mod, nn.Linear) or type(mod).__name__ == "Conv1D"


def linear_from(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` holding a copy of ``weight`` (out x in) and ``bias``."""
    out_f, in_f = weight.shape
    m = nn.Linear(in_f, out_f, bias=bias is not None, dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        m.weight.copy_(weight)
        if bias is not None:
            m.bias.copy_(bias)
    return m


def _split(model: nn.Module, layout: ModelLayout, module: str) -> SplitLinear:
    """The fused ``module`` as a :class:`SplitLinear` of dense parts (the same numbers, one Linear per role)."""
    mod = get_module(model, module)
    projs = [p for p in layout.projections if p.module == module]
    if not projs or any(p.whole for p in projs):
        raise GacError(f"{module} is not a fused projection of this layout")
    parts = [linear_from(_rows(module_weight(mod), p).detach(), None if mod.bias is None else _rows(mod.bias, p).detach())
             for p in projs]
    return SplitLinear(projs[0].in_features, [p.role for p in projs], [p.rows for p in projs], parts)


def replace_part(model: nn.Module, layout: ModelLayout, proj: Projection, new: nn.Module,
                 originals: dict | None = None) -> None:
    """Install ``new`` for ``proj`` (module docstring). ``originals``: the module found at ``proj.module`` before
    this call is recorded there under the module's name, unless an earlier call recorded it (to undo a probe)."""
    cur = get_module(model, proj.module)
    if originals is not None:
        originals.setdefault(proj.module, cur)
    if proj.whole:
        replace_module(model, proj.module, new)
        return
    split = cur if isinstance(cur, SplitLinear) else _split(model, layout, proj.module)
    split.set_part(proj.role, new)
    if split is not cur:
        replace_module(model, proj.module, split)


def part_params(model: nn.Module, module: str, part: str | None, layout: ModelLayout | None = None) -> int:
    """Weight parameters of one part of a module as the model holds it now: ``part`` None (the whole module), a
    role of a fused module, or ``expert<e>`` of an expert block. ``layout``: the model's (found when needed)."""
    mod = get_module(model, module)
    if part is None:
        return weight_params(mod)
    if part.startswith("expert"):
        e = int(part.removeprefix("expert"))
        if isinstance(mod, ExpertMLPs):
            return mod.gate_up[e].weight.numel() + mod.down[e].weight.numel()
        return mod.gate_up_proj[e].numel() + mod.down_proj[e].numel()
    if isinstance(mod, SplitLinear):
        return weight_params(mod.part(part))
    if isinstance(mod, nn.Linear) or type(mod).__name__ == "Conv1D":  # a fused module still whole: its rows
        from gac.compression.discovery import discover

        p = next((p for p in (layout or discover(model)).projections if p.module == module and p.role == part), None)
        if p is not None:
            return p.out_features * p.in_features
    raise GacError(f"{module} holds no separate part {part!r}")


def stat_tensor(model: nn.Module, key: str) -> tuple[torch.Tensor, int]:
    """``(parameter, row_axis)``: what a gradient statistic keyed ``key`` is taken of — a module's weight (rows on
    axis 0; a ``Conv1D``'s on axis 1) or a 3-D expert parameter ``<experts module>.<name>`` ([E, out, in]: rows on
    axis 1, per expert)."""
    try:
        mod = model.get_submodule(key)
    except AttributeError:
        mod = None
    if mod is not None and isinstance(getattr(mod, "weight", None), torch.Tensor):
        return mod.weight, (1 if type(mod).__name__ == "Conv1D" else 0)
    parent, _, leaf = key.rpartition(".")
    p = getattr(get_module(model, parent), leaf, None) if parent else None
    if isinstance(p, nn.Parameter) and p.dim() == 3:
        return p, 1
    raise GacError(f"no weight to take statistics of at {key!r}")
