"""SVD-LLM (Wang et al. 2025): truncation-aware data whitening with the Cholesky factor of X^T X."""

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
    collected in calibration instead of X^T X (no Cholesky, and no in x in matrix for down_proj)."""

    name = "svd_llm"
    default_proxy = "magnitude"
    needs_xtx = True

    def __init__(self, projections=PROJECTIONS, layers=None, eps: float = 1e-6, svd: str = DEFAULT_SVD):
        super().__init__(projections, layers, svd)
        if not eps > 0:
            raise GacError(f"SVD-LLM eps must be > 0, got {eps}")
        self.eps = float(eps)

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
