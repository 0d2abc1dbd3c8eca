"""ASVD (Yuan et al. 2023): activation-aware SVD of every projection, ``W diag(S) = U Sigma V^T``, ``S^-1`` folded into B.

Its default allocation is the reference's sensitivity search (``gac.compression.allocation.sensitivity_allocation``):
a calibration-perplexity table over kept parameter ratios (``sensitivity_grid``, the reference's 0.4 ... 0.9) and a
binary search on the perplexity threshold that meets the budget; weights with no acceptable ratio stay dense.
"""

from __future__ import annotations

import torch

from gac.compression.allocation import SENSITIVITY_GRID, check_sensitivity_grid, check_sensitivity_samples
from gac.compression.compressors.base import (
    Compressor,
    Unit,
    lowrank_spec,
    lowrank_unit,
    part_specs,
    projection_unit,
    unit_projection,
)
from gac.compression.compressors.lowrank_math import (
    DEFAULT_SVD,
    SVD_METHODS,
    asvd_factors,
    asvd_scaling,
    compact_factors,
    rank_factors,
)
from gac.compression.discovery import ModelLayout, Projection, discover
from gac.compression.importance import WeightStats
from gac.compression.layouts import ROLES, role_of
from gac.compression.modules import LowRankLinear
from gac.compression.parts import is_dense, part_bias, part_weight, replace_part
from gac.compression.proxies import Proxy, check_score
from gac.errors import GacError
from gac.progress import track


class LowRankCompressor(Compressor):
    """Shared by the per-projection low-rank compressors (ASVD, SVD-LLM): one unit per projection (a role's weight:
    a whole Linear, or its rows of a fused one), each of which may stay dense (plan dimension ``min(out, in)``: the
    weight is left as it is). ``projections``: the roles to compress (None: every role the model's layout has;
    Llama's names ``q_proj`` ... are accepted too)."""

    low_rank = True

    def __init__(self, projections=None, layers=None, svd: str = DEFAULT_SVD):
        if projections is not None:
            if isinstance(projections, str) or not projections:
                raise GacError(f"projections must be a list of roles ({', '.join(ROLES)}), got {projections!r}")
            for p in projections:
                role_of(str(p))
            projections = tuple(projections)
        if svd not in SVD_METHODS:
            raise GacError(f"unknown factorisation method svd={svd!r}; choose among {', '.join(SVD_METHODS)} "
                           f"(see gac.compression.compressors.lowrank_math)")
        self.projections = projections
        self.layers = layers
        self.svd = svd

    def roles(self) -> tuple[str, ...]:
        return ROLES if self.projections is None else tuple(role_of(str(p)) for p in self.projections)

    def units(self, model, layout: ModelLayout) -> list[Unit]:
        idx = self.layer_indices(layout.num_layers)
        out = []
        for p in layout.projections_of(self.roles(), idx):
            if not is_dense(model, p):
                raise GacError(f"{p.name} is not a dense Linear; it is already compressed")
            out.append(projection_unit(p, self._unit(p), part_bias(model, p) is not None))
        if self.projections is not None and not out:
            raise GacError(f"this {layout.family} model has none of the projections {list(self.projections)}; its "
                           f"roles are {', '.join(sorted({p.role for p in layout.projections}))}")
        return out

    def _unit(self, p: Projection) -> Unit:
        """One projection's unit: low rank, or left dense where that is no larger."""
        return lowrank_unit(p.name, p.out_features, p.in_features, (p.module,), {"layer": p.layer}, dense=True)

    def score(self, model, units, stats, proxy: Proxy):
        out = {}
        for u in units:
            p = unit_projection(u)
            st = stats.get(p.module)
            out[u.name] = check_score(proxy.weight_score(u.name, part_weight(model, p),
                                                         None if st is None else st.part(u.meta.get("rows"))),
                                      u.name, proxy.name)
        return out

    def _factors(self, W: torch.Tensor, st: WeightStats | None, unit: Unit) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """(A, B, S, info): balanced factors on W's device and the k singular values S of the scaled weight."""
        raise NotImplementedError

    def factorize(self, model, units, stats, proxy):
        """Factorise on the weights' device (a GPU when the model is on one); factors are kept on the host."""
        out = {}
        for u in track(units, "factorization (SVD)", "units"):
            p = unit_projection(u)
            st = stats.get(p.module)
            W = part_weight(model, p)
            A, B, S, info = self._factors(W, None if st is None else st.part(u.meta.get("rows")), u)
            col_scale = info.pop("col_scale", None)
            if self.svd.startswith("gram") and info.get("whitening") in (None, "gram"):
                # keep the smaller factor; apply rebuilds the other from W (lowrank_math.compact_factors)
                f = compact_factors(A, B, S, col_scale)
            else:
                f = {"A": A, "B": B, "S": S}
            out[u.name] = {**{k: v.cpu() for k, v in f.items()}, **info}
            del A, B, f
        return out

    def module_specs(self, model, units, dims):
        self.check_dims(units, dims, dense_ok=True)
        return part_specs(model, {unit_projection(u): lowrank_spec(u, dims[u.name])
                                  for u in units if u.name in dims and dims[u.name] != u.d_full})

    def apply(self, model, units, dims, factors):
        old: dict = {}
        layout = None
        for u in units:
            if u.name not in dims:
                continue
            r = int(dims[u.name])
            f = factors[u.name]
            p = unit_projection(u)
            if u.is_dense(r):  # left dense: the weight stays as it is
                if not is_dense(model, p):
                    raise GacError(f"{u.name}: the plan keeps it dense, but the model holds a compressed module there")
                continue
            k = f["S"].numel() if "S" in f else f["A"].shape[1]
            if not 1 <= r <= k:
                raise GacError(f"{u.name}: rank {r} outside the factorised range 1..{k} (or {u.d_full}: dense)")
            W = part_weight(model, p)
            A, B = rank_factors(f, W, r)
            new = LowRankLinear.from_factors(A, B, bias=part_bias(model, p), dtype=W.dtype)
            del A, B
            if layout is None and not p.whole:
                layout = discover(model)
            replace_part(model, layout, p, new, old)
        return old


class ASVD(LowRankCompressor):
    """Activation-aware SVD. ``alpha``: exponent of the per-channel scale ``mean|X|^alpha`` (paper default 0.5).

    Every projection of every layer by default (Llama's seven: 224 weights on Llama-3-8B, as in the GAC paper). ``svd``: the
    factorisation method (:data:`~gac.compression.compressors.lowrank_math.SVD_METHODS`; ``"exact"`` is the full
    float64 SVD). ``sensitivity_grid``: the kept parameter ratios of the sensitivity table (each in (0, 1]; 1 means
    dense). ``sensitivity_samples``: the sensitivity probes run on the first N calibration samples only (None: all of
    them, the reference; the activation statistics always use all). A probe costs time linear in its tokens (on
    SmolLM2-135M the table is ~20 s per probe token on this project's 2-core CPU); what fewer samples change in the
    chosen allocation is measured in docs/scale.md.
    """

    name = "asvd"
    default_proxy = "activation"
    needs_act = True
    default_allocation = "sensitivity"

    def __init__(self, projections=None, layers=None, alpha: float = 0.5, sensitivity_grid=SENSITIVITY_GRID,
                 svd: str = DEFAULT_SVD, sensitivity_samples: int | None = None):
        super().__init__(projections, layers, svd)
        self.alpha = float(alpha)
        self.sensitivity_grid = check_sensitivity_grid(sensitivity_grid)
        self.sensitivity_samples = check_sensitivity_samples(sensitivity_samples)

    def _factors(self, W, st, unit):
        if st is None or st.act_abs is None:
            raise GacError(f"ASVD needs activation statistics for {unit.name}; calibration did not record them")
        act = st.act_abs_mean()
        A, B, S = asvd_factors(W, act, self.alpha, max_rank=unit.d_cap, name=unit.name, method=self.svd,
                               return_sigma=True)
        return A, B, S, {"col_scale": asvd_scaling(act, self.alpha, unit.name)}
