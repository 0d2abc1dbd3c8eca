"""The stable-rank allocation: a data-free per-weight score fed to a sensitivity-style binary search.

This is the allocation the GAC authors' Table 5 script ran under the label "ASVD" (``JihaoXin/GAC``,
``scripts/asvd_gac_experiment.py``); it is not ASVD's (ASVD's table holds calibration perplexities, see
:mod:`gac.compression.allocation`). It is offered as the ``stable_rank_svd`` compressor's allocation so that the
authors' numbers can be reproduced; gac never uses it by default.

1. Every ``nn.Linear`` of the model (``lm_head`` and any other Linear outside the decoder layers included) gets the
   stable-rank score ``sr = sqrt(||W||_F^2 / (||W||_2^2 + 1e-8))``, computed in float32, and one table entry
   ``sr * (1 - p)`` for each kept parameter ratio ``p`` of the grid (0.4 ... 0.9).
2. The entries are sorted by score, highest first (stable: ties keep ``named_modules`` order); a cut at ``m`` accepts
   the entries from ``m`` on, and each Linear keeps its smallest accepted ratio, or 1.0 when it has none.
3. The kept ratio of a cut is nominal, ``sum_l |W_l| p_l / sum_l |W_l|`` over every Linear; the binary search (over
   cuts ``0 .. n - 1``) ends at the first cut whose ratio is above the target kept ratio ``1 - ratio``, so the
   allocation keeps slightly more than the target.
4. A compressed weight's rank is ``max(1, int(|W| p) // (out + in))``: at ``p = 1`` the break-even rank, still
   factorised (no weight stays dense). Linears that are not units (``lm_head``) take part in steps 1-3 only.
5. The budget handed to alignment is the parameter cost of those ranks, ``sum r (out + in)`` over the units, not
   ``(1 - ratio) |W|``; each unit's knapsack score is its largest table entry (``sr * (1 - min grid)``), the
   authors' "fisher".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gac.align.candidates import DEFAULT_UNIT
from gac.align.targets import Target
from gac.compression.allocation import SENSITIVITY_GRID, check_sensitivity_grid
from gac.errors import GacError

#: LAPACK's own buffers in svdvals, as a share of the float32 copy it factorises: measured 83 MiB of host memory
#: outside torch's tensors beside the 640 MiB copy of gemma3's 262144 x 640 LM head
STABLE_RANK_LAPACK = 0.15


@torch.no_grad()
def stable_rank(W: torch.Tensor) -> float:
    """``sqrt(||W||_F^2 / (||W||_2^2 + 1e-8))`` in float32 (the authors' arithmetic, so allocations match bit for bit)."""
    from gac.compression.compressors.lowrank_math import lapack_threads

    w = W.detach().float()
    fro2 = torch.norm(w, p="fro") ** 2  # the authors' call (same reduction, same bits)
    with lapack_threads(w):
        top = torch.linalg.svdvals(w)[0]
    return float(((fro2 / (top**2 + 1e-8)) ** 0.5).item())


def stable_rank_bytes(out_features: int, in_features: int, dtype_bytes: int) -> int:
    """Peak bytes :func:`stable_rank` takes beyond an ``out x in`` weight: the float32 copy LAPACK's SVD overwrites
    (``svdvals`` clones its input), a float32 copy of the weight first when it is not float32, and LAPACK's own
    buffers beside them (:data:`STABLE_RANK_LAPACK` of the copy)."""
    copies = 1 if dtype_bytes == 4 else 2
    return int(4 * out_features * in_features * (copies + STABLE_RANK_LAPACK))


def stable_rank_fisher(sr: float, grid: Sequence[float] = SENSITIVITY_GRID) -> float:
    """A weight's knapsack score: its largest table entry ``max_p sr * (1 - p)``."""
    return max(sr * (1 - p) for p in grid)


def authors_rank(dense: int, params_per_dim: int, kept: float) -> int:
    """``max(1, int(|W| * kept) // (out + in))``."""
    return max(1, int(dense * kept) // params_per_dim)


def linear_table(model: nn.Module) -> list[tuple[str, int, float]]:
    """``(name, |W|, stable rank)`` of every weight the authors' procedure ranks, in ``named_modules`` order: every
    projection of the model's layout (each role of a fused module apart, under its projection name) and every other
    ``nn.Linear`` (the LM head: the authors' script ranks every Linear of the model)."""
    from gac.compression.discovery import discover
    from gac.compression.parts import part_weight

    lay = discover(model)
    by_module: dict[str, list] = {}
    for p in lay.projections:
        by_module.setdefault(p.module, []).append(p)
    out = []
    for n, m in model.named_modules():
        if n in by_module:
            for p in by_module[n]:
                w = part_weight(model, p)
                out.append((p.name, w.numel(), stable_rank(w)))
        elif isinstance(m, nn.Linear) and not any(n.startswith(k + ".") for k in by_module):
            out.append((n, m.weight.numel(), stable_rank(m.weight)))
    return out


def stable_rank_kept(table: Sequence[tuple[str, int, float]], kept_target: float,
                     grid: Sequence[float] = SENSITIVITY_GRID) -> dict[str, float]:
    """Steps 2-3 of the module docstring: ``{linear name: kept ratio}`` for the target kept ratio ``kept_target``."""
    if not table:
        raise GacError("the stable-rank allocation found no nn.Linear in the model")
    grid = [float(g) for g in check_sensitivity_grid(grid)]
    entries = [(n, p, sr * (1 - p)) for n, _, sr in table for p in grid if p < 1]
    entries = sorted(entries, key=lambda e: -e[2])
    size = {n: numel for n, numel, _ in table}
    total = sum(size.values())

    def kept(m: int) -> dict[str, float]:
        r = {n: 1.0 for n, _, _ in table}
        for n, p, _ in entries[m:]:
            r[n] = min(r[n], p)
        return r

    low, high = 0, len(entries) - 1
    while low < high:
        mid = (low + high) // 2
        now = sum(size[n] * p for n, p in kept(mid).items()) / total
        if now > kept_target:
            high = mid
        else:
            low = mid + 1
    return kept(low)


def stable_rank_targets(prepared, ratio: float, unit: int = DEFAULT_UNIT,
                        grid: Sequence[float] | None = None) -> tuple[list[Target], int]:
    """The targets (d* = the stable-rank ranks, score = the authors' fisher) and budget (their cost) for ``ratio``
    (the fraction of parameters removed; the search's target kept ratio is ``1 - ratio``), from a
    :class:`~gac.compression.prepared.Prepared` of the ``stable_rank_svd`` compressor.

    The stable ranks of every Linear are computed once per prepared state (on its still dense model) and kept on it.
    """
    grid = tuple(check_sensitivity_grid(grid if grid is not None
                                        else getattr(prepared.compressor, "sensitivity_grid", None) or SENSITIVITY_GRID))
    table = getattr(prepared, "_stable_rank_table", None)
    if table is None:
        table = linear_table(prepared.model)
        from gac.compression.compressors.base import unit_projection
        from gac.compression.parts import is_dense

        for u in prepared.units:
            if not is_dense(prepared.model, unit_projection(u)):
                raise GacError(f"{u.name} is no longer a dense Linear; the stable-rank table needs the dense model "
                               f"(prepare again)")
        prepared._stable_rank_table = table
    kept = stable_rank_kept(table, 1 - ratio, grid)
    sr = {n: s for n, _, s in table}
    targets, budget = [], 0
    for u in prepared.units:
        if u.name not in kept:
            raise GacError(f"unit {u.name} is not an nn.Linear of the model; the stable-rank allocation covers "
                           f"per-Linear low-rank units only")
        dm = u.d_max(unit)
        r = authors_rank(u.dense_params, u.params_per_dim, kept[u.name])
        budget += u.params_per_dim * r
        targets.append(Target(u.name, float(min(r, dm)), stable_rank_fisher(sr[u.name], grid), u.params_per_dim,
                              d_max=dm, kind=u.kind, meta=prepared._kernel_meta(u)))
    return targets, budget
