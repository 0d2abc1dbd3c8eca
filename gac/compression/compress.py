"""The compression pipeline: score -> unconstrained d* -> aligned plan -> apply, with reusable scored state.

>>> prepared = prepare(model, tokenizer, "asvd", calibration=Calibration("wikitext2", 32, 2048))
>>> for ratio in (0.15, 0.30):
...     for strategy in ("unaligned", "gac"):
...         compressed, plan, report = prepared.compress(ratio, strategy)   # no re-scoring, no new SVD

:func:`prepare` collects calibration statistics, importance scores and the compressor's factorisation once;
:meth:`Prepared.compress` runs only allocation, alignment and the (cheap) layer swap per ratio and strategy.
:func:`compress_model` is the one-shot form (``gac compress``). :func:`prepare` lives in :mod:`.preparation`, the
:class:`Prepared` state in :mod:`.prepared`, :class:`Calibration` in :mod:`.calibration`.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import torch
from torch import nn

from gac.align import STRATEGIES, Plan
from gac.align.candidates import DEFAULT_UNIT, CandidateFilter, check_unit, check_window
from gac.align.targets import check_ratio
from gac.compression.allocation import resolve_allocation
from gac.compression.calibration import Calibration
from gac.compression.compressors import Compressor, get_compressor
from gac.compression.preparation import check_probe_samples, check_sensitivity_reach, prepare
from gac.compression.prepared import COMPRESS_WINDOW
from gac.errors import unknown_name
from gac.registry import DEFAULT_KNAPSACK_SCORE


def compress_model(
    model: nn.Module,
    tokenizer=None,
    compressor: str | Compressor = "asvd",
    ratio: float = 0.15,
    strategy: str = "gac",
    proxy: str | None = None,
    unit: int = DEFAULT_UNIT,
    window: int = COMPRESS_WINDOW,
    calibration: Calibration | None = None,
    calib_ids: torch.Tensor | None = None,
    candidate_filter: CandidateFilter | None = None,
    cache: dict | None = None,
    allocation: str | None = None,
    compressor_options: dict | None = None,
    knapsack_score: str = DEFAULT_KNAPSACK_SCORE,
    sensitivity_limit_s: float | None | str = "env",
) -> tuple[nn.Module, Plan, dict]:
    """One-shot compression. Without ``cache`` the model is compressed in place; with a ``cache`` dict, the
    scored state is stored there (keyed by compressor, options, proxy, calibration and allocation) and reused by
    later calls on the same model, which then return compressed copies. ``allocation`` and
    ``sensitivity_limit_s``: see :func:`prepare`."""
    check_ratio(ratio)  # before any calibration work
    check_unit(unit)
    check_window(window)
    if strategy not in STRATEGIES:
        raise unknown_name("strategy", strategy, STRATEGIES)
    comp = get_compressor(compressor, **(compressor_options or {}))
    resolved = resolve_allocation(allocation, comp)
    check_sensitivity_reach(resolved, comp, ratio)
    n_cal = int(calib_ids.shape[0]) if calib_ids is not None else (calibration or Calibration()).n_samples
    check_probe_samples(resolved, comp, n_cal)
    key = None
    if cache is not None:
        key = json.dumps([id(model), str(compressor), compressor_options or {}, proxy, asdict(calibration) if calibration
                          else None, None if calib_ids is None else [list(calib_ids.shape), int(calib_ids.sum())], allocation],
                         sort_keys=True, default=str)
    prepared = cache.get(key) if cache is not None else None
    if prepared is None:
        prepared = prepare(model, tokenizer, comp, proxy, calibration, calib_ids, allocation,
                           sensitivity_limit_s=sensitivity_limit_s)
        if cache is not None:
            cache[key] = prepared
    return prepared.compress(ratio, strategy, unit, window, candidate_filter, copy_model=cache is not None,
                             knapsack_score=knapsack_score)
