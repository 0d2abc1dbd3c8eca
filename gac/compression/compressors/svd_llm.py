"""SVD-LLM (Wang et al. 2025): truncation-aware data whitening with the Cholesky factor of X^T X."""

from __future__ import annotations

from gac.compression.compressors.asvd import LowRankCompressor
from gac.compression.compressors.lowrank_math import svdllm_factors
from gac.compression.discovery import PROJECTIONS
from gac.errors import GacError


class SVDLLM(LowRankCompressor):
    """``eps``: relative regulariser of X^T X before Cholesky (grown tenfold on failure, then an eigh fallback)."""

    name = "svd_llm"
    default_proxy = "magnitude"
    needs_xtx = True
    default_allocation = "uniform"  # the reference truncates every weight to the same parameter ratio

    def __init__(self, projections=PROJECTIONS, layers=None, eps: float = 1e-6):
        super().__init__(projections, layers)
        if not eps > 0:
            raise GacError(f"SVD-LLM eps must be > 0, got {eps}")
        self.eps = float(eps)

    def _factors(self, W, st, unit):
        if st is None or st.xtx is None:
            raise GacError(f"SVD-LLM needs X^T X for {unit.name}; calibration did not record it")
        A, B, how = svdllm_factors(W, st.xtx, max_rank=unit.d_cap, eps=self.eps, name=unit.name)
        return A, B, {"whitening": how}
