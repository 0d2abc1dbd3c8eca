"""Targets: the compressible units that gac assigns one dimension each.

A target is one weight (or a coupled group of weights) whose parameter count is linear in the
dimension gac chooses: ``params(d) = params_per_dim * d``.

=====================  =========================================  ======================
compressor             dimension d                                params_per_dim
=====================  =========================================  ======================
low-rank (ASVD, SVD)   rank r of ``W ~ A @ B`` (A: out x r)         out + in
MLP width (pruning)    intermediate width shared by gate/up/down   3 * hidden
K/V head group (PaLU)  rank of the group's low-rank projection     its own (out + in)
=====================  =========================================  ======================

``kind`` names the kernels the dimension ends up in, so a hardware profile can veto dimensions that
are slow on the target GPU (see :mod:`gac.align.candidates`):

- ``"lowrank"``: d is N of the first GEMM (x @ B^T) and K of the second (h @ A^T);
- ``"width"``: d is N of gate/up and K of down;
- ``"head_dim"``: d is the per-head dimension seen by scaled-dot-product attention;
- ``"generic"``: no kernel information (only alignment rules apply).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gac.errors import GacError

KINDS = ("generic", "lowrank", "width", "head_dim")


@dataclass(frozen=True)
class Target:
    """One compressible unit.

    Args:
        name: unique name, e.g. ``"model.layers.3.self_attn.q_proj"``.
        d_star: the compressor's unconstrained (continuous) dimension d*.
        score: importance s >= 0 per parameter (a higher score keeps more parameters).
        params_per_dim: parameters added per unit of dimension.
        d_max: the largest dimension allowed (the uncompressed one), or None for no bound.
        candidates: explicit candidate dimensions; None lets :func:`gac.align.candidates.candidate_set` build them.
        kind: which kernels the dimension reaches (see module docstring).
        meta: free-form information a compressor attaches (shapes, layer index); not used by the solver.
    """

    name: str
    d_star: float
    score: float
    params_per_dim: int
    d_max: int | None = None
    candidates: tuple[int, ...] | None = None
    kind: str = "generic"
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        where = f"target {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise GacError(f"a target has an empty or non-string name ({self.name!r}); give every target a unique name")
        if _is_bool(self.params_per_dim) or not isinstance(self.params_per_dim, int) or self.params_per_dim <= 0:
            raise GacError(f"{where}: params_per_dim must be a positive integer, got {self.params_per_dim!r}")
        if _is_bool(self.d_star) or not isinstance(self.d_star, (int, float)) or not math.isfinite(self.d_star):
            raise GacError(f"{where}: d_star must be a finite number, got {self.d_star!r}")
        if self.d_star < 0:
            raise GacError(f"{where}: d_star must be >= 0, got {self.d_star}")
        if _is_bool(self.score) or not isinstance(self.score, (int, float)) or not math.isfinite(self.score):
            raise GacError(
                f"{where}: score must be a finite number, got {self.score!r}; importance scores with NaN or inf "
                f"usually come from NaN activations or gradients in calibration"
            )
        if self.score < 0:
            raise GacError(f"{where}: score must be >= 0 (importance per parameter), got {self.score}")
        if self.d_max is not None:
            if _is_bool(self.d_max) or not isinstance(self.d_max, int) or self.d_max <= 0:
                raise GacError(f"{where}: d_max must be a positive integer or absent, got {self.d_max!r}")
            if self.d_star > self.d_max:
                raise GacError(
                    f"{where}: d_star {self.d_star} exceeds d_max {self.d_max}; the unconstrained dimension cannot "
                    f"be larger than the uncompressed one"
                )
        if self.kind not in KINDS:
            raise GacError(f"{where}: unknown kind {self.kind!r}; known: {', '.join(KINDS)}")
        if self.candidates is not None:
            cands = tuple(self.candidates)
            if not cands:
                raise GacError(f"{where}: the candidate list is empty; give at least one dimension or omit the key")
            for c in cands:
                if _is_bool(c) or not isinstance(c, int) or c <= 0:
                    raise GacError(f"{where}: candidates must be positive integers, got {c!r}")
                if self.d_max is not None and c > self.d_max:
                    raise GacError(f"{where}: candidate {c} exceeds d_max {self.d_max}")
            object.__setattr__(self, "candidates", tuple(sorted(set(cands))))

    def params(self, d: int) -> int:
        """Parameters of this target at dimension ``d``."""
        return self.params_per_dim * int(d)

    @property
    def params_star(self) -> float:
        """Parameters at the unconstrained dimension d* (a float)."""
        return self.params_per_dim * self.d_star


def _is_bool(x) -> bool:
    return isinstance(x, bool)


def check_unique(targets: Sequence[Target]) -> None:
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise GacError(f"duplicate target name {t.name!r}; target names must be unique")
        seen.add(t.name)


def check_ratio(ratio) -> float:
    """A compression ratio rho in (0, 1), or a GacError that says so."""
    if _is_bool(ratio) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or not 0 < ratio < 1:
        raise GacError(
            f"compression ratio must be a number in (0, 1) (the fraction of parameters removed, e.g. 0.15), got {ratio!r}"
        )
    return float(ratio)


def budget_for_ratio(total_params: int, ratio: float) -> int:
    """The parameter budget B = floor((1 - ratio) * |W|) of the paper's Eq. 1.

    ``ratio`` is the compression ratio rho: the fraction of the parameters to remove, in (0, 1).
    """
    check_ratio(ratio)
    if total_params <= 0:
        raise GacError(f"total parameter count must be positive, got {total_params}")
    return int(math.floor((1.0 - ratio) * total_params))
