"""The compressor lifecycle shared by every algorithm.

A compressor is a small class (this module) plus pure tensor math in a sibling module:

1. ``units(model, layout)`` — the compressible units (one gac :class:`~gac.align.targets.Target` each, ratio-free);
2. ``score(model, units, stats, proxy)`` — per-parameter importance ``s_i`` of each unit under a proxy;
3. ``factorize(model, units, stats, proxy)`` — whatever makes *any* dimension cheap to apply later (SVD factors,
   a channel order); computed once, reused for every ratio and strategy;
4. ``apply(model, dims, factors)`` — swap the layers for the chosen dimensions (through :func:`gac.compression.swap.replace_module`).

Low-rank units cap ``d_max`` at the *break-even rank*, rounded down to a multiple of the alignment unit, so ``d_max``
itself is aligned. A unit with a **dense option** (``dense_option``: ASVD's and SVD-LLM's per-projection units) may
also stay unfactorised: its plan dimension is then ``d_full = min(out, in)`` at a cost of ``out * in``, and its cap is
the largest rank whose factors ``r * (out + in)`` hold strictly fewer parameters than the dense weight — a rank at or
above break-even is never useful beside the dense weight, which is exact and no larger. Units without a dense
option (PaLU's head groups share one down-projection) cap at the largest rank holding no more parameters than the
dense weight, and are always factorised. Either way the plan's parameter count is exactly the compressed model's
weight count.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from gac.compression.discovery import ModelLayout
from gac.compression.importance import WeightStats
from gac.compression.proxies import Proxy
from gac.errors import GacError


@dataclass(frozen=True)
class Unit:
    """A ratio-free compressible unit; :meth:`target` turns it into a gac Target once d* is known."""

    name: str
    kind: str  # "lowrank" | "width" | "head_dim" | "generic"
    params_per_dim: int
    dense_params: int  # weight parameters before compression
    d_full: int  # the uncompressed dimension (min(out, in) for low rank, the width for pruning)
    d_cap: int  # the largest useful dimension (break-even rank for low rank)
    modules: tuple[str, ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    dense_option: bool = False  # may stay unfactorised (plan dimension d_full, cost dense_params)
    # the weights it covers as (module, part): part None is the whole module, a role is that role's rows of a fused
    # module, "expert<e>" one expert of an expert block (gac.compression.parts.part_params); empty: its whole modules
    parts: tuple = ()

    @property
    def projection_key(self) -> str:
        """The projection the unit is (part of): units of one projection share it (PaLU's head groups)."""
        p = self.meta.get("projection")
        return p.name if p is not None else ",".join(self.modules)

    @property
    def weight_parts(self) -> tuple:
        return self.parts or tuple((m, None) for m in self.modules)

    def d_max(self, unit: int) -> int:
        if self.kind == "lowrank":
            aligned = (self.d_cap // unit) * unit
            return aligned if aligned >= unit else self.d_cap
        return self.d_cap

    @property
    def dense_dim(self) -> int | None:
        """The plan dimension that means "left dense" (``d_full``), or None without a dense option."""
        return self.d_full if self.dense_option else None

    def is_dense(self, d: int) -> bool:
        return self.dense_option and int(d) == self.d_full


def lowrank_unit(name: str, out_f: int, in_f: int, modules: tuple[str, ...], meta: dict | None = None,
                 dense: bool = False) -> Unit:
    """A low-rank unit for an ``out_f x in_f`` weight; ``dense``: it may stay unfactorised (see the module docstring)."""
    ppd, size = out_f + in_f, out_f * in_f
    full = min(out_f, in_f)
    cap = max(1, min(full - 1, (size - 1) // ppd)) if dense else max(1, min(full, size // ppd))
    return Unit(name, "lowrank", ppd, size, full, cap, modules,
                {"shape": [out_f, in_f], **(meta or {})}, dense_option=dense)


def projection_unit(p, unit: Unit, bias: bool = False) -> Unit:
    """``unit`` as the unit of projection ``p`` (a :class:`~gac.compression.discovery.Projection`): the projection
    is kept in its meta (with its rows of a fused module and whether it has a bias) and its part recorded."""
    meta = {**unit.meta, "projection": p, "role": p.role, "rows": None if p.whole else p.row_index(), "bias": bias}
    return replace(unit, meta=meta, parts=((p.module, None if p.whole else p.role),))


def lowrank_spec(u: Unit, rank: int) -> dict:
    """The spec of the :class:`~gac.compression.modules.LowRankLinear` a projection unit becomes at ``rank``."""
    out_f, in_f = u.meta["shape"]
    return {"type": "lowrank", "in": in_f, "out": out_f, "rank": int(rank), "bias": bool(u.meta.get("bias", False))}


def unit_projection(u: Unit):
    """The projection a unit made by :func:`projection_unit` compresses."""
    p = u.meta.get("projection")
    if p is None:
        raise GacError(f"unit {u.name} covers no single projection")
    return p


def part_specs(model: nn.Module, changed: dict) -> dict[str, dict]:
    """Module specs for a plan that gives each projection in ``changed`` (a
    :class:`~gac.compression.discovery.Projection` -> the spec of its new module) a new module: a whole projection's
    module takes its spec; a fused module with a changed part becomes a ``split`` spec whose other parts stay dense
    Linears of their rows (what :func:`gac.compression.parts.replace_part` builds)."""
    from gac.compression.discovery import discover
    from gac.compression.modules import get_module

    out: dict[str, dict] = {}
    fused: dict[str, dict[str, dict]] = {}
    for p, spec in changed.items():
        if p.whole:
            out[p.module] = spec
        else:
            fused.setdefault(p.module, {})[p.role] = spec
    if fused:
        layout = discover(model)
        for module, new in fused.items():
            projs = [p for p in layout.projections if p.module == module]
            bias = getattr(get_module(model, module), "bias", None) is not None
            out[module] = {"type": "split", "in": projs[0].in_features, "roles": [p.role for p in projs],
                           "rows": [[list(r) for r in p.rows] for p in projs],
                           "parts": [new.get(p.role, {"type": "linear", "in": p.in_features, "out": p.out_features,
                                                      "bias": bias}) for p in projs]}
    return out


def parse_layers(layers, n_layers: int, default: range | None = None) -> list[int]:
    """``None`` -> default (all layers); ``"3:"``/``"3:31"``/``"0::2"`` (python slice, end exclusive) or ``"5"``;
    ``(start, end)``; a list of indices. Anything else, a step of 0 or a selection of no layer: :class:`GacError`."""
    form = "give a python slice such as '3:' or '3:31' (end exclusive), one index, or a list of indices"
    if layers is None:
        idx = list(default if default is not None else range(n_layers))
    elif isinstance(layers, str):
        try:
            parts = [int(p) if p.strip() else None for p in layers.split(":")]
        except ValueError:
            raise GacError(f"layer range {layers!r} is not a layer selection; {form}") from None
        if len(parts) > 3 or (len(parts) == 1 and parts[0] is None):
            raise GacError(f"layer range {layers!r} is not a layer selection; {form}")
        if len(parts) == 3 and parts[2] == 0:
            raise GacError(f"layer range {layers!r} has a step of 0; {form}")
        idx = list(range(n_layers)[slice(*parts)]) if len(parts) in (2, 3) else [parts[0]]
    elif isinstance(layers, tuple) and len(layers) == 2 and all(
            x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in layers):
        idx = list(range(n_layers)[slice(*layers)])
    elif isinstance(layers, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        idx = list(layers)
    else:
        raise GacError(f"layer selection {layers!r} is not a layer selection; {form}")
    bad = [i for i in idx if not 0 <= i < n_layers]
    if bad or not idx:
        raise GacError(f"layer selection {layers!r} gives {idx}; the model has layers 0..{n_layers - 1}")
    return sorted(set(idx))


class Compressor:
    """Base class; subclasses set the class attributes and implement the four lifecycle methods."""

    def layer_indices(self, n_layers: int) -> list[int]:
        """The decoder layers this compressor touches in an ``n_layers``-deep model (its ``layers`` option);
        :class:`GacError` for a selection of no layer or of layers the model lacks, checkable before loading."""
        return parse_layers(getattr(self, "layers", None), n_layers)

    name: str = ""
    default_proxy: str = "magnitude"
    needs_act: bool = False  # factorisation needs per-channel activation statistics
    needs_xtx: bool = False  # factorisation needs X^T X
    # with needs_xtx, the float64 Grams one layer's factorisation holds (the memory estimate reads it: footprint.py):
    # "inputs": X^T X of each distinct input (q/k/v, o, gate/up, down); "kv": of the k/v projections' shared input;
    # "whitening": SVD-LLM's, by its svd method (gram: X^T X where out > in, Y^T Y where out <= in), and a tall
    # projection's factorisation goes through the whitening in float64
    xtx_of: str = "inputs"
    # the roles the gradient pass scores (its statistics modules); None: those the compressor's projections name
    scored_roles: tuple[str, ...] | None = None
    low_rank: bool = False  # its units are low-rank factorisations (the memory estimate counts them: footprint.py)
    supports_sensitivity: bool = True
    # the d* rule that reproduces the method's reference implementation (gac.compression.allocation.ALLOCATIONS)
    default_allocation: str = "proportional"
    sensitivity_grid: tuple[float, ...] | None = None  # kept-parameter ratios probed by allocation="sensitivity"

    keeps_calibration: bool = False  # the calibration token ids are kept with the prepared state (for after_apply)
    # the gradient pass's loss predicts the token this many places ahead (PaLU's fisher_loss="two_ahead": 2)
    gradient_tokens_ahead: int = 1

    def factor_rank(self, out_features: int, in_features: int) -> int:
        """The rank of the factors a low-rank compressor holds for an ``out x in`` weight from its factorisation until
        apply (what the memory estimate counts, :mod:`gac.compression.footprint`): by default the break-even rank
        ``out * in // (out + in)``, its units' cap."""
        return max(1, out_features * in_features // (out_features + in_features))

    def scoring_bytes(self, linears: list[tuple[int, int]], dtype_bytes: int) -> int:
        """Peak bytes its scores or its allocation take at once beyond the weights and the factors, given the
        ``(out, in)`` of the Linears they read (the memory estimate's; :mod:`gac.compression.footprint` passes every
        Linear of the model, the LM head included) and the weights' bytes per element. By default none: the
        proxies' scores read statistics the estimate already counts."""
        return 0

    def after_apply(self, model: nn.Module, units: list[Unit], dims: dict[str, int], originals: dict, calib_ids,
                    layout: ModelLayout) -> dict:
        """A step after :meth:`apply` (SVD-LLM's parameter update); ``originals``: the modules apply replaced.
        Returns extra report fields. The default does nothing."""
        return {}

    def options(self) -> dict:
        """The constructor arguments, for the checkpoint recipe."""
        sig = inspect.signature(type(self).__init__)
        return {k: _jsonable(getattr(self, k)) for k in sig.parameters if k != "self"}

    def units(self, model: nn.Module, layout: ModelLayout) -> list[Unit]:
        raise NotImplementedError

    def score(self, model: nn.Module, units: list[Unit], stats: dict[str, WeightStats], proxy: Proxy) -> dict[str, float]:
        raise NotImplementedError

    def factorize(self, model: nn.Module, units: list[Unit], stats: dict[str, WeightStats], proxy: Proxy) -> dict:
        raise NotImplementedError

    def apply(self, model: nn.Module, units: list[Unit], dims: dict[str, int], factors: dict) -> dict[str, nn.Module]:
        """Swap the modules of the units in ``dims``; return the replaced modules by name (to undo a probe)."""
        raise NotImplementedError

    def module_specs(self, model: nn.Module, units: list[Unit], dims: dict[str, int]) -> dict[str, dict]:
        """The :func:`~gac.compression.modules.module_spec` of every module :meth:`apply` would install for ``dims``,
        by module name, read from shapes alone (no factors, no weights): what :mod:`gac.compression.structure`
        builds a plan's model from. Units not in ``dims`` stay as they are (as in :meth:`apply`)."""
        raise GacError(f"compressor {self.name!r} cannot describe its modules from a plan (no module_specs); "
                       f"implement {type(self).__name__}.module_specs to build its structure from shapes")

    def check_dims(self, units: list[Unit], dims: dict[str, int], dense_ok: bool = False) -> None:
        """A plan's ``dims`` name only these units, each an integer in ``1..d_cap`` (the range :meth:`apply` accepts);
        with ``dense_ok`` a low-rank unit may also sit at ``d_full`` = min(out, in): its weight kept unfactorised (how
        plans write a dense candidate)."""
        by_name = {u.name: u for u in units}
        unknown = [n for n in dims if n not in by_name]
        if unknown:
            more = f" (+{len(unknown) - 3} more)" if len(unknown) > 3 else ""
            raise GacError(
                f"plan targets {unknown[:3]}{more} do not exist in this architecture for {self.name} (its {len(units)} "
                f"targets look like {repr(units[0].name) if units else 'nothing'}); the plan was made for another model, "
                f"compressor or compressor options — bench it with the model and options it was made for")
        for n, d in dims.items():
            u = by_name[n]
            dense = dense_ok and u.kind == "lowrank" and d == u.d_full
            if isinstance(d, bool) or not isinstance(d, int) or not (1 <= d <= u.d_cap or dense):
                raise GacError(f"plan dim {d!r} for {n} is outside its valid range 1..{u.d_cap} ({u.kind}); the plan "
                               f"does not fit this architecture")

    def error_curve(self, unit: Unit, factors: dict):
        """Per-dimension error of dropping dimension k (descending), in the compressor's own metric, or None.

        Low rank: the squared singular values ``sigma_k^2`` of the (scaled / whitened) weight, read from the balanced
        factors (``||A[:, k]||^2 = sigma_k``). Pruning overrides this with the ranked channel energies.
        """
        f = factors.get(unit.name, {})
        S = f.get("S")
        if S is not None:  # the singular values, stored by the factorisation: no pass over A
            return S.double().pow(2)
        A = f.get("A")
        if A is None:
            return None
        return torch.linalg.vector_norm(A, dim=0).double().pow(4)

    def marginal_score(self, unit: Unit, d_star: float, factors: dict, align_unit: int) -> float | None:
        """Error per parameter of the aligned step that brackets d*: mean error of dimensions
        ``[floor_u(d*), floor_u(d*) + u)`` divided by ``params_per_dim``."""
        curve = self.error_curve(unit, factors)
        if curve is None or curve.numel() == 0:
            return None
        lo = int(d_star // align_unit) * align_unit
        hi = min(lo + align_unit, curve.numel())
        lo = max(0, min(lo, hi - 1))
        return float(curve[lo:hi].mean()) / unit.params_per_dim

    def stat_modules(self, units: list[Unit]) -> list[str]:
        return sorted({m for u in units for m in u.modules})

    def stat_requests(self, model: nn.Module, units: list[Unit]) -> tuple[set[str], set[str]]:
        """Which modules calibration must collect ``X^T X`` for, and which the output Gram ``Y^T Y`` (out x out) for.
        Default: X^T X for every statistics module when :attr:`needs_xtx`, no output Grams."""
        return (set(self.stat_modules(units)) if self.needs_xtx else set()), set()


def _jsonable(v):
    if isinstance(v, (tuple, list, range)):
        return [_jsonable(x) for x in v]
    return v
