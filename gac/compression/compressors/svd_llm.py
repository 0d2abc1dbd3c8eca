"""SVD-LLM (Wang et al. 2025): truncation-aware data whitening with the Cholesky factor of X^T X.

``update=True`` adds the reference's optional parameter update (``SVDLLM.py --step 2``): after truncation each
projection's ``A`` is refitted by least squares, layer by layer, on inputs that went through the compressed layers
before it (:mod:`gac.compression.compressors.local_update`). Off by default, as in the reference (``--step 1``).
"""

from __future__ import annotations

from gac.compression.compressors.asvd import LowRankCompressor
from gac.compression.compressors.lowrank_math import svdllm_factors
from gac.compression.discovery import PROJECTIONS
from gac.errors import GacError


class SVDLLM(LowRankCompressor):
    """``eps``: relative regulariser of X^T X before Cholesky (grown tenfold on failure, then an eigh fallback).
    ``update``: run the reference's parameter-update step after truncation (module docstring)."""

    name = "svd_llm"
    default_proxy = "magnitude"
    needs_xtx = True
    default_allocation = "uniform"  # the reference truncates every weight to the same parameter ratio

    def __init__(self, projections=PROJECTIONS, layers=None, eps: float = 1e-6, update: bool = False):
        super().__init__(projections, layers)
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

    def _factors(self, W, st, unit):
        if st is None or st.xtx is None:
            raise GacError(f"SVD-LLM needs X^T X for {unit.name}; calibration did not record it")
        A, B, how = svdllm_factors(W, st.xtx, max_rank=unit.d_cap, eps=self.eps, name=unit.name)
        return A, B, {"whitening": how}
