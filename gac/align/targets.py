"""Targets: the compressible units that gac assigns one dimension each.

A target is one weight (or a coupled group of weights) whose parameter count is linear in the
dimension gac chooses: ``params(d) = params_per_dim * d``.

A low-rank target may also carry a **dense option** (``dense_params = out * in``): the weight left unfactorised.
Its dimension in a plan is the dense weight's own rank ``dense_dim = min(out, in)`` and its cost is ``out * in``,
not ``params_per_dim * dense_dim``: parameters are then not linear in d for that one candidate. Ranks whose
factors would hold as many parameters as the dense weight are never useful beside it, so ``d_max`` defaults to the
largest rank strictly cheaper than dense, and must stay below ``dense_dim``. ``d_star == dense_dim`` means the
compressor keeps the weight dense (ASVD's sensitivity search does this for its most sensitive weights).

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
        dense_params: the cost of leaving the weight unfactorised (``out * in``); None: no dense option.
            Only for ``kind="lowrank"`` (for a width or a head group the uncompressed dimension is already a
            candidate at its linear cost).
        shape: ``(out, in)`` of the weight, when known; with it ``params_per_dim`` must be ``out + in`` and
            ``dense_params`` must be ``out * in``.
    """

    name: str
    d_star: float
    score: float
    params_per_dim: int
    d_max: int | None = None
    candidates: tuple[int, ...] | None = None
    kind: str = "generic"
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    dense_params: int | None = None
    shape: tuple[int, int] | None = None

    def __post_init__(self):
        where = f"target {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise GacError(f"a target has an empty or non-string name ({self.name!r}); give every target a unique name")
        if _is_bool(self.params_per_dim) or not isinstance(self.params_per_dim, int) or self.params_per_dim <= 0:
            raise GacError(f"{where}: params_per_dim must be a positive integer, got {self.params_per_dim!r}")
        try:
            check_d_star(self.d_star)
        except GacError as e:
            raise GacError(f"{where}: {e}") from None
        if _is_bool(self.score) or not isinstance(self.score, (int, float)) or not math.isfinite(self.score):
            raise GacError(
                f"{where}: score must be a finite number, got {self.score!r}; importance scores with NaN or inf "
                f"usually come from NaN activations or gradients in calibration"
            )
        if self.score < 0:
            raise GacError(f"{where}: score must be >= 0 (importance per parameter), got {self.score}")
        if self.kind not in KINDS:
            raise GacError(f"{where}: unknown kind {self.kind!r}; known: {', '.join(KINDS)}")
        self._check_dense(where)
        if self.d_max is not None:
            if _is_bool(self.d_max) or not isinstance(self.d_max, int) or self.d_max <= 0:
                raise GacError(f"{where}: d_max must be a positive integer or absent, got {self.d_max!r}")
            if self.dense_params is not None and self.d_max >= self.dense_dim:
                raise GacError(
                    f"{where}: d_max {self.d_max} must be below the dense weight's rank min(out, in) = "
                    f"{self.dense_dim}: with a dense option the unfactorised weight is the full-rank candidate; "
                    f"give d_max at most {self.dense_dim - 1} (or omit it: the largest rank cheaper than dense)"
                )
            if self.d_star > self.d_max and not self.dense_star:
                raise GacError(
                    f"{where}: d_star {self.d_star} exceeds d_max {self.d_max}; the unconstrained dimension cannot "
                    f"be larger than the uncompressed one"
                    + (f" (d_star = {self.dense_dim}, the dense rank, keeps the weight dense)" if self.has_dense else "")
                )
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

    def _check_dense(self, where: str) -> None:
        """Validate ``shape`` and ``dense_params``; default ``d_max`` to the largest rank cheaper than dense."""
        if self.shape is not None:
            shp = tuple(self.shape)
            if len(shp) != 2 or any(_is_bool(x) or not isinstance(x, int) or x <= 0 for x in shp):
                raise GacError(f"{where}: shape must be [out, in] (two positive integers), got {self.shape!r}")
            object.__setattr__(self, "shape", shp)
            if self.kind == "lowrank" and self.params_per_dim != shp[0] + shp[1]:
                raise GacError(
                    f"{where}: params_per_dim {self.params_per_dim} is not out + in = {shp[0] + shp[1]} for shape "
                    f"{list(shp)}; a low-rank target's rank-d factors hold d * (out + in) parameters"
                )
        if self.dense_params is None:
            return
        dp = self.dense_params
        if _is_bool(dp) or not isinstance(dp, int) or dp <= 0:
            raise GacError(f"{where}: dense_params must be a positive integer (out * in), got {dp!r}")
        if self.kind != "lowrank":
            raise GacError(
                f"{where}: a dense option (dense_params) is only defined for low-rank targets (kind 'lowrank'); for "
                f"kind {self.kind!r} the uncompressed dimension d_max is already the dense one: drop dense_params"
            )
        if self.shape is not None:
            o, i = self.shape
            if dp != o * i:
                raise GacError(
                    f"{where}: dense_params {dp} is not out x in = {o} x {i} = {o * i}; the dense option costs the "
                    f"unfactorised weight: set dense_params to {o * i} (or fix shape)"
                )
        elif _split(self.params_per_dim, dp) is None:
            raise GacError(
                f"{where}: dense_params {dp} is not out x in for any weight with out + in = params_per_dim "
                f"({self.params_per_dim}); set dense_params to the weight's out * in (and give 'shape': [out, in])"
            )
        if self.d_max is None:
            object.__setattr__(self, "d_max", max(1, (dp - 1) // self.params_per_dim))

    @property
    def has_dense(self) -> bool:
        """Whether the weight may stay unfactorised (a dense candidate)."""
        return self.dense_params is not None

    @property
    def dense_dim(self) -> int | None:
        """The dimension that stands for the dense option in plans: the dense weight's rank ``min(out, in)``."""
        if self.dense_params is None:
            return None
        if self.shape is not None:
            return min(self.shape)
        return min(_split(self.params_per_dim, self.dense_params))

    @property
    def dense_star(self) -> bool:
        """Whether the compressor's own choice (d*) is to keep the weight dense."""
        return self.dense_params is not None and self.d_star == self.dense_dim

    def is_dense(self, d: int) -> bool:
        return self.dense_params is not None and int(d) == self.dense_dim

    def params(self, d: int) -> int:
        """Parameters of this target at dimension ``d`` (``dense_params`` at the dense option)."""
        if self.dense_params is not None and int(d) == self.dense_dim:
            return self.dense_params
        return self.params_per_dim * int(d)

    @property
    def params_star(self) -> float:
        """Parameters at the unconstrained dimension d* (a float; ``dense_params`` when d* is dense)."""
        if self.dense_star:
            return float(self.dense_params)
        return self.params_per_dim * self.d_star


def _is_bool(x) -> bool:
    return isinstance(x, bool)


def _split(total: int, product: int) -> tuple[int, int] | None:
    """``(a, b)`` positive integers with ``a + b == total`` and ``a * b == product`` (a >= b), or None."""
    disc = total * total - 4 * product
    if disc < 0:
        return None
    r = math.isqrt(disc)
    if r * r != disc or (total + r) % 2:
        return None
    a, b = (total + r) // 2, (total - r) // 2
    return (a, b) if b >= 1 else None


def check_d_star(d_star) -> float:
    """d* > 0: every target keeps at least one dimension; a weight a compressor removes entirely is not a target."""
    if isinstance(d_star, bool) or not isinstance(d_star, (int, float)) or not math.isfinite(d_star) or d_star <= 0:
        raise GacError(
            f"d_star must be a finite number > 0, got {d_star!r}: gac keeps every target at one alignment unit or "
            f"more and never removes a weight; leave a weight your compressor removes (d* = 0) out of the targets "
            f"and out of the budget"
        )
    return float(d_star)


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
