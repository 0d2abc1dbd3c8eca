"""Predicted latency tables for a GPU gac does not have: target -> {candidate dim: ms} from the kernel models.

The same kernels :mod:`gac.profiling.latency_tables` measures, timed by the predictor's calibrated models instead
(:func:`gac.predict.gemm_ms`, :func:`gac.predict.sdpa_ms`; fp16, ``T = batch * seq_len`` tokens):

==============  ===================================================================================================
kind            predicted at d
==============  ===================================================================================================
``lowrank``     ``gemm(T, N=d, K=in) + gemm(T, N=out, K=d)``; the dense option ``gemm(T, N=out, K=in)``
``width``       the kernels :func:`gac.profiling.sweeps.width_kernels` names, as measured: ``2 gemm(T, N=d,
                K=hidden) + gemm(T, N=hidden, K=d)`` and the gate product, ``stream(3 T d)`` (bandwidth-bound)
``head_dim``    ``sdpa(batch, heads, seq_len, d)``, causal, with the padding copy of a head dim off a multiple of 8
==============  ===================================================================================================

These are GPU times: they add up over a prefill only where the GPU is busy. Where it waits for the CPU to issue
kernels (a small batch x sequence, when a kernel takes less than the predictor's issue interval) the plan's real
latency is the launch queue's, not the sum; :func:`predicted_latency_tables` logs how many candidates are that short.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gac.align.targets import Target
from gac.errors import GacError

log = logging.getLogger(__name__)

#: kernels one candidate of a target launches (for the launch-bound check; width: width_kernels's four)
_KERNELS = {"lowrank": 2, "dense": 1, "width": 4, "head_dim": 1}


def _shape(t: Target) -> dict:
    from gac.profiling.sweeps import target_shape

    shape = target_shape(t)
    if shape is None:
        raise GacError(f"target {t.name!r} has kind {t.kind!r}: no kernels are known for it, so no latency can be "
                       f"predicted; give its latencies in the table yourself or give it a kernel kind")
    if t.kind == "lowrank" and t.shape is not None:  # the pinned (out, in) wins over the one solved from the meta
        shape = {"out": int(t.shape[0]), "in": int(t.shape[1])}
    return shape


def predicted_latency_tables(
    targets: Sequence[Target],
    cands: Sequence[Sequence[int]],
    gpu="h100",
    batch: int = 1,
    seq_len: int = 1024,
) -> dict[str, dict[int, float]]:
    """``{target name: {dim: predicted ms}}`` for every candidate; ``gpu`` is a name the predictor knows (``a100``,
    ``h100``) or a :class:`gac.predict.Predictor` (built once, reused)."""
    from gac.predict import Predictor, gemm_ms, sdpa_ms

    if batch < 1 or seq_len < 1:
        raise GacError(f"batch and seq_len must be positive, got batch={batch} seq_len={seq_len}")
    pred = gpu if isinstance(gpu, Predictor) else Predictor(gpu)
    cal = pred.cal
    tokens = batch * seq_len
    memo: dict[tuple, float] = {}
    tables: dict[str, dict[int, float]] = {}
    short = total = 0
    for t, cs in zip(targets, cands):
        shape = _shape(t)
        row = {}
        for d in cs:
            d = int(d)
            if t.is_dense(d):
                key = ("dense", shape["in"], shape["out"])
            else:
                key = (t.kind, *sorted(shape.items()), d)
            if key not in memo:
                if key[0] == "dense":
                    memo[key] = gemm_ms(cal, tokens, shape["out"], shape["in"])
                elif t.kind == "lowrank":
                    memo[key] = gemm_ms(cal, tokens, d, shape["in"]) + gemm_ms(cal, tokens, shape["out"], d)
                elif t.kind == "width":
                    memo[key] = _width_ms(cal, tokens, shape["hidden"], d)
                else:  # head_dim
                    memo[key] = sdpa_ms(cal, batch, shape["heads"], seq_len, d, True)
            row[d] = float(memo[key])
            total += 1
            kernels = _KERNELS["dense" if key[0] == "dense" else t.kind]
            short += row[d] < kernels * float(pred.issue_ms)
        tables[t.name] = row
    if short:
        log.warning("%d of %d predicted candidate latencies are shorter than their kernels' launch interval on %s "
                    "(%.4f ms per kernel) at batch %d x seq_len %d: there the GPU waits for the CPU and latencies do "
                    "not add up; a latency budget is meaningful where the GPU is busy (larger batch or sequence)",
                    short, total, pred.gpu, pred.issue_ms, batch, seq_len)
    return tables


def _width_ms(cal, tokens: int, hidden: int, d: int) -> float:
    """A width target at ``d``: its kernels (:func:`gac.profiling.sweeps.width_kernels`) by the kernel models, in
    fp16 (:data:`gac.predict.predictor.ELEM` bytes an element)."""
    from gac.predict import gemm_ms
    from gac.predict.kernels import stream_ms
    from gac.predict.predictor import ELEM
    from gac.profiling.sweeps import width_kernels

    return sum(gemm_ms(cal, *size) if op == "gemm" else stream_ms(cal, ELEM * size[0])
               for _, op, size in width_kernels(tokens, hidden, d))
