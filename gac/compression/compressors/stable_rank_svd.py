"""Plain truncated SVD with the stable-rank allocation: what the GAC authors' Table 5 script ran as "ASVD".

The authors' ``scripts/asvd_gac_experiment.py`` (``JihaoXin/GAC``) imports nothing from ASVD: it allocates ranks with
a data-free stable-rank score (:mod:`gac.compression.stable_rank`) and factorises every projection with a plain
truncated SVD, ``W ~ U_r sqrt(S_r) . sqrt(S_r) V_r^T``, with no activation scaling. This compressor is that procedure,
named for what it is, so the paper's numbers can be reproduced beside real ASVD (``asvd``); it is never a default.

How it differs from gac's per-projection low-rank compressors (``asvd``, ``svd_llm``):

* no calibration data: the score and the factors read the weights only (the default proxy ``magnitude`` needs
  nothing; the score ignores the proxy: it is always the authors' stable-rank "fisher");
* no weight stays dense: a unit's largest rank is ``min(out, in)`` (the authors' ``max_rank``), above the break-even
  rank, because the allocation factorises even the weights it keeps whole (at their break-even rank);
* its allocation is ``stable_rank`` (:func:`gac.compression.stable_rank.stable_rank_targets`), whose budget is the
  cost of the ranks it chose.

``svd``: the factorisation method; default ``"exact"`` (a full float64 SVD; the authors' is a full float32 SVD, the
difference is float rounding). ``sensitivity_grid``: the kept ratios of the stable-rank table (the authors' 0.4 ...
0.9).
"""

from __future__ import annotations

from gac.compression.allocation import SENSITIVITY_GRID, check_sensitivity_grid
from gac.compression.compressors.asvd import LowRankCompressor
from gac.compression.compressors.base import Unit, lowrank_spec, part_specs, unit_projection
from gac.compression.compressors.lowrank_math import svd_factors
from gac.compression.parts import part_weight
from gac.compression.stable_rank import stable_rank, stable_rank_bytes, stable_rank_fisher

STABLE_RANK_ALLOCATION = "stable_rank"


class StableRankSVD(LowRankCompressor):
    """Stable-rank allocation + plain truncated SVD (module docstring)."""

    name = "stable_rank_svd"
    default_proxy = "magnitude"
    default_allocation = STABLE_RANK_ALLOCATION
    supports_sensitivity = False

    def __init__(self, projections=None, layers=None, svd: str = "exact", sensitivity_grid=SENSITIVITY_GRID):
        super().__init__(projections, layers, svd)
        self.sensitivity_grid = check_sensitivity_grid(sensitivity_grid)

    def _unit(self, p) -> Unit:
        """No dense option, and the rank cap is ``min(out, in)`` (the authors' ``max_rank``)."""
        o, i = p.out_features, p.in_features
        return Unit(p.name, "lowrank", o + i, o * i, min(o, i), self.factor_rank(o, i), (p.module,),
                    {"shape": [o, i], "layer": p.layer})

    def factor_rank(self, out_features: int, in_features: int) -> int:
        """Every weight is factorised at full rank ``min(out, in)`` (its cap): the factors held until apply are
        ``min(out, in) * (out + in)`` floats, above the weight itself (twice a square one)."""
        return min(out_features, in_features)

    def scoring_bytes(self, linears, dtype_bytes):
        """The stable rank of every Linear (the allocation ranks the LM head too) is one SVD at a time: the largest
        Linear's (:func:`~gac.compression.stable_rank.stable_rank_bytes`), while every factor is held."""
        return max((stable_rank_bytes(o, i, dtype_bytes) for o, i in linears), default=0)

    def score(self, model, units, stats, proxy):
        return {u.name: stable_rank_fisher(stable_rank(part_weight(model, unit_projection(u))), self.sensitivity_grid)
                for u in units}

    def _factors(self, W, st, unit):
        A, B, S = svd_factors(W, max_rank=unit.d_cap, name=unit.name, method=self.svd, return_sigma=True)
        return A, B, S, {}

    def module_specs(self, model, units, dims):
        self.check_dims(units, dims)
        return part_specs(model, {unit_projection(u): lowrank_spec(u, dims[u.name]) for u in units if u.name in dims})
