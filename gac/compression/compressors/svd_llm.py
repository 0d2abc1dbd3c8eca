"""SVD-LLM (Wang et al. 2025): truncation-aware data whitening with the Cholesky factor of X^T X.

``update=True`` adds the reference's optional parameter update (``SVDLLM.py --step 2``): after truncation each
projection's ``A`` is refitted by least squares, layer by layer, on inputs that went through the compressed layers
before it (:mod:`gac.compression.compressors.local_update`). Off by default, as in the reference (``--step 1``).
"""

from __future__ import annotations

from gac.compression.compressors.asvd import LowRankCompressor
from gac.compression.compressors.base import unit_projection
from gac.compression.compressors.lowrank_math import DEFAULT_SVD, svdllm_factors
from gac.errors import GacError


class SVDLLM(LowRankCompressor):
    """``eps``: relative regulariser of X^T X before Cholesky (grown tenfold on failure, then an eigh fallback).
    ``svd``: the factorisation method (:data:`~gac.compression.compressors.lowrank_math.SVD_METHODS`). With the Gram
    methods a projection with ``out <= in`` (q, k, v, o, down on Llama) is factorised from its output Gram ``Y^T Y``
    (of ``X W^T``: the output less its bias), collected in calibration instead of X^T X (no Cholesky, and no in x in
    matrix for down_proj).
    ``update``: run the reference's parameter-update step after truncation (module docstring)."""

    name = "svd_llm"
    default_proxy = "magnitude"
    needs_xtx = True
    xtx_of = "whitening"
    default_allocation = "uniform"  # the reference truncates every weight to the same parameter ratio

    def __init__(self, projections=None, layers=None, eps: float = 1e-6, update: bool = False,
                 svd: str = DEFAULT_SVD):
        super().__init__(projections, layers, svd)
        if not eps > 0:
            raise GacError(f"SVD-LLM eps must be > 0, got {eps}")
        if not isinstance(update, bool):
            raise GacError(f"SVD-LLM update must be true or false, got {update!r}")
        self.eps = float(eps)
        self.update = update

    def units(self, model, layout):
        units = super().units(model, layout)
        fused = [u.name for u in units if not unit_projection(u).whole]
        if self.update and fused:
            raise GacError(f"SVD-LLM's update refits whole projections, and this {layout.family} model fuses them "
                           f"({fused[0]} is part of a fused weight); run it with update=false")
        return units

    @property
    def keeps_calibration(self) -> bool:
        return self.update

    def after_apply(self, model, units, dims, originals, calib_ids, layout) -> dict:
        if not self.update:
            return {}
        from gac.compression.compressors.local_update import local_update

        errors = local_update(model, units, dims, originals, calib_ids, layout)
        return {"update_error": {k: {"before": a, "after": b} for k, (a, b) in errors.items()}}

    def uses_output_gram(self, out_features: int, in_features: int) -> bool:
        return self.svd.startswith("gram") and out_features <= in_features

    def stat_requests(self, model, units):
        """X^T X of a module's input, or its output Gram when every projection of it is factorised from that (a
        fused module's Gram is taken whole; each role reads its rows)."""
        xtx, yty = set(), set()
        for u in units:
            p = unit_projection(u)
            (yty if self.uses_output_gram(p.out_features, p.in_features) else xtx).add(p.module)
        return xtx, yty - xtx

    def _factors(self, W, st, unit):
        if st is None or (st.xtx is None and st.yty is None):
            raise GacError(f"SVD-LLM needs X^T X for {unit.name}; calibration did not record it")
        trace = None if st.act_sq is None else float(st.act_sq.sum())
        A, B, how, S = svdllm_factors(W, st.xtx, max_rank=unit.d_cap, eps=self.eps, name=unit.name, method=self.svd,
                                      yty=st.yty, trace=trace, return_sigma=True)
        return A, B, S, {"whitening": how}
