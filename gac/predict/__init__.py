"""Predicted GPU latency from shapes and kernel-level data (``gac predict``, ``gac bench --predict GPU``).

- :mod:`.kernels`: GEMM (tile and wave quantization, alignment tiers), FlashAttention-2 SDPA (head-dim templates, the
  padding copy of a misaligned head dim) and bandwidth-bound element-wise kernel models;
- :mod:`.calibrate`: their constants fitted to a hardware profile's kernel sweeps (the published A100/H100 ones);
- :mod:`.predictor`: the kernel list of a model's prefill from its shapes, the CPU-issue/GPU queue, :class:`Predictor`.
"""

from gac.predict.calibrate import calibrate
from gac.predict.kernels import Calibration, gemm_ms, sdpa_ms, tier_factor
from gac.predict.predictor import GPUS, Prediction, Predictor, model_kernels, simulate

__all__ = ["GPUS", "Calibration", "Prediction", "Predictor", "calibrate", "gemm_ms", "model_kernels", "sdpa_ms",
           "simulate", "tier_factor"]
