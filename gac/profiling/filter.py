"""A :class:`gac.align.candidates.CandidateFilter` backed by a hardware profile (paper Algorithm 1, line 4).

Which measurements decide, per target kind (``Target.kind``):

==============  ================================================================================
kind            consulted
==============  ================================================================================
``lowrank``     GEMM N (first factor ``x @ B^T``) and GEMM K (second factor ``h @ A^T``):
                ``gemm_N``, ``gemm_K``, ``gemm_tput_N``, ``gemm_tput_K`` (+ ``gemv_N``/``gemv_K`` with
                ``include_gemv``, for decode)
``width``       the same: N of gate/up, K of down
``head_dim``    ``sdpa_head_dim``
``generic``     nothing: all dims kept (no kernel is known)
==============  ================================================================================

A candidate d is dropped when

1. the profile holds measurements at the target's own kernel context (``sweep="target"``, from
   :func:`gac.profiling.measure_for_targets`) including d, and d is slower than a larger measured candidate of
   that context by more than ``tolerance`` — exact shapes decide alone; or otherwise
2. a consulted sweep measured d and d is a cliff there, or d violates an alignment rule (a slow period/residue
   class) that sweep's data establishes — rules carry the sweep's findings to dims outside its range.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gac.align.targets import Target
from gac.profiling.cliffs import DEFAULT_HORIZON, DEFAULT_TOLERANCE, SweepAnalysis, analyze
from gac.profiling.profile import HardwareProfile
from gac.profiling.sweeps import context_key, target_shape

log = logging.getLogger(__name__)

GEMM_SWEEPS = ("gemm_N", "gemm_K", "gemm_tput_N", "gemm_tput_K")
GEMV_SWEEPS = ("gemv_N", "gemv_K")
KIND_SWEEPS: dict[str, tuple[str, ...]] = {
    "lowrank": GEMM_SWEEPS,
    "width": GEMM_SWEEPS,
    "head_dim": ("sdpa_head_dim",),
    "generic": (),
}


class ProfileFilter:
    """Drops candidate dims that a hardware profile shows to be cliffs for the kernels a target reaches.

    Args:
        profile: the measured :class:`HardwareProfile`.
        tolerance: a dim is a cliff when more than this fraction slower than a larger dim (0.05 = 5%).
        horizon: how far above d (in dims) a faster larger dim may lie for the sweeps (None: anywhere).
        device: the device the job runs on (name, ``torch.device`` or ``"cuda"``); a profile from another device
            is refused unless ``allow_device_mismatch``. None skips the check.
        include_gemv: also consult the M=1 (decode) GEMV sweeps for lowrank/width targets.
        robust: require non-overlapping trials as well as the tolerance.
    """

    def __init__(
        self,
        profile: HardwareProfile,
        tolerance: float = DEFAULT_TOLERANCE,
        horizon: int | None = DEFAULT_HORIZON,
        device=None,
        allow_device_mismatch: bool = False,
        include_gemv: bool = False,
        robust: bool = True,
    ):
        if device is not None:
            profile.check_device(device, allow_device_mismatch)
        self.profile = profile
        self.tolerance = float(tolerance)
        self.horizon = horizon
        self.include_gemv = include_gemv
        self.robust = robust
        self._sweeps: dict[str, SweepAnalysis] = {}
        self._contexts: dict[str, SweepAnalysis] = {}
        present = set(profile.sweeps())
        for names in KIND_SWEEPS.values():
            for s in names + GEMV_SWEEPS:
                if s in present and s not in self._sweeps:
                    self._sweeps[s] = analyze(profile.table, s, self.tolerance, horizon, robust)
        for ctx in profile.contexts():
            self._contexts[ctx] = analyze(profile.table, "target", self.tolerance, None, robust, context=ctx)

    def sweeps_for(self, kind: str) -> list[str]:
        names = KIND_SWEEPS.get(kind, ()) + (
            GEMV_SWEEPS if self.include_gemv and kind in ("lowrank", "width") else ()
        )
        return [s for s in names if s in self._sweeps]

    def explain(self, target: Target, dims: Sequence[int]) -> dict[int, list[str]]:
        """For each dim, the reasons it is dropped (an empty list: kept)."""
        reasons: dict[int, list[str]] = {int(d): [] for d in dims}
        shape = target_shape(target)
        exact = self._contexts.get(context_key(target.kind, shape)) if shape is not None else None
        measured = set(exact.penalties["dim"].astype(int)) if exact is not None else set()
        for d in reasons:
            if d in measured:
                hit = exact.penalties[(exact.penalties["dim"] == d) & exact.penalties["cliff"]]
                if len(hit):
                    r = hit.iloc[0]
                    reasons[d].append(
                        f"measured at {exact.sweep} {context_key(target.kind, shape)}: d={d} is "
                        f"{100 * r['penalty']:.0f}% slower than d={int(r['better_dim'])}"
                    )
                continue
            for s in self.sweeps_for(target.kind):
                reasons[d].extend(self._sweeps[s].slow(d))
        return reasons

    def __call__(self, target: Target, dims: Sequence[int]) -> list[int]:
        reasons = self.explain(target, dims)
        kept = [d for d, why in reasons.items() if not why]
        dropped = {d: why for d, why in reasons.items() if why}
        if dropped:
            log.debug(
                "%s: profile drops %s (%s)",
                target.name,
                sorted(dropped),
                "; ".join(f"{d}: {w[0]}" for d, w in sorted(dropped.items())),
            )
        return kept

    def __repr__(self) -> str:
        return (
            f"ProfileFilter({self.profile.device_name!r}, tolerance={self.tolerance}, horizon={self.horizon}, "
            f"sweeps={sorted(self._sweeps)}, contexts={len(self._contexts)})"
        )
