"""SVD-LLM (Wang et al. 2025): truncation-aware data whitening with the Cholesky factor of X^T X.

``update=True`` adds the reference's optional parameter update (``SVDLLM.py --step 2``): after truncation each
projection's ``A`` is refitted by least squares, layer by layer, on inputs that went through the compressed layers
before it (:mod:`gac.compression.compressors.local_update`). Off by default, as in the reference (``--step 1``).
"""

from __future__ import annotations

from gac.compression.compressors.asvd import LowRankCompressor
from gac.compression.compressors.lowrank_math import DEFAULT_SVD, svdllm_factors
from gac.compression.discovery import PROJECTIONS
from gac.compression.modules import get_module
from gac.errors import GacError


class SVDLLM(LowRankCompressor):
    """``eps``: relative regulariser of X^T X before Cholesky (grown tenfold on failure, then an eigh fallback).
    ``svd``: the factorisation method (:data:`~gac.compression.compressors.lowrank_math.SVD_METHODS`). With the Gram
    methods a projection with ``out <= in`` (q, k, v, o, down on Llama) is factorised from its output Gram ``Y^T Y``,
    collected in calibration instead of X^T X (no Cholesky, and no in x in matrix for down_proj).
    ``update``: run the reference's parameter-update step after truncation (module docstring)."""

    name = "svd_llm"
    default_proxy = "magnitude"
    needs_xtx = True
    default_allocation = "uniform"  # the reference truncates every weight to the same parameter ratio

    def __init__(self, projections=PROJECTIONS, layers=None, eps: float = 1e-6, update: bool = False,
                 svd: str = DEFAULT_SVD):
        super().__init__(projections, layers, svd)
        if not eps > 0:
            raise GacError(f"SVD-LLM eps must be > 0, got {eps}")
        if not isinstance(update, bool):
            raise GacError(f"SVD-LLM update must be true or false, got {update!r}")
        self.eps = float(eps)
        self.update = update

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
        xtx, yty = set(), set()
        for n in self.stat_modules(units):
            w = get_module(model, n).weight
            (yty if self.uses_output_gram(*w.shape) else xtx).add(n)
        return xtx, yty

    def _factors(self, W, st, unit):
        if st is None or (st.xtx is None and st.yty is None):
            raise GacError(f"SVD-LLM needs X^T X for {unit.name}; calibration did not record it")
        trace = None if st.act_sq is None else float(st.act_sq.sum())
        A, B, how, S = svdllm_factors(W, st.xtx, max_rank=unit.d_cap, eps=self.eps, name=unit.name, method=self.svd,
                                      yty=st.yty, trace=trace, return_sigma=True)
        return A, B, S, {"whitening": how}
