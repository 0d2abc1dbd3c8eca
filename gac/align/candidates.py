"""Candidate sets C_i: the aligned dimensions near d* that a strategy may pick (paper §4.2, Step 2).

Rules narrow the search: multiples of the alignment ``unit`` (8 by default; 16, 32, 64 selectable; or a serving
engine's own rule by name, :data:`ENGINE_UNITS`: ``llama.cpp:q4_K`` is 256, its k-quants' block) that lie
strictly within ``window`` units of d*, clipped to ``[unit, d_max]``; ``d_max`` (the uncompressed dimension)
is itself a candidate when it lies in the window. A :class:`CandidateFilter` (a hardware profile, say) then
removes dimensions that are slow on the target platform, so the remaining set avoids measured cliffs.

**The dense option** (a low-rank target with ``dense_params``; see :mod:`gac.align.targets`) counts as one unit above
``d_max`` in window arithmetic: it is a candidate when ``d_max + unit`` lies strictly within the window of d*
(``d_max - d* < (window - 1) * unit``), and always when d* is dense itself. So with the default window of 1 a
factorised d* keeps its two bracketing ranks and a dense d* stays dense (a set of one); wider windows let the
solver trade between the top ranks and the dense weight. The filter never sees the dense option (its kernels are
the model's own) and rank candidates that would cost as much as the dense weight are replaced by it. With a dense
option ``d_max`` is a candidate only when it is aligned (or the only rank left): the dense weight is the full-rank
choice, so an unaligned top rank would add nothing but a misaligned dimension.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Protocol, runtime_checkable

from gac.align.engine_types import LLAMA_CPP_TYPES, parse_engine
from gac.align.targets import Target, check_d_star
from gac.errors import GacError

DEFAULT_UNIT = 8
DEFAULT_WINDOW = 1  # the aligned dims that bracket d*; see docs/algorithm.md ("Candidate window")


@runtime_checkable
class CandidateFilter(Protocol):
    """Removes dimensions a platform punishes.

    Called with a target and its rule-based candidates (ascending); returns the allowed subset. It may
    use ``target.kind`` to decide which kernels (GEMM K/N, SDPA head_dim) the dimension reaches.
    """

    def __call__(self, target: Target, dims: Sequence[int]) -> Sequence[int]: ...


UNIT_BASE = 8  # the smallest alignment any GPU kernel rule asks for (paper Table 4): units are multiples of it


def check_unit(unit) -> int:
    """An alignment unit: a positive multiple of 8 (8, 16, 32, 64, ...). Alignment is a hardware property —
    cuBLAS, Tensor Cores and FlashAttention want multiples of 8 or more — so a unit such as 7 or 12 would report
    dimensions as "aligned" that no kernel treats as aligned."""
    if isinstance(unit, bool) or not isinstance(unit, int) or unit <= 0 or unit % UNIT_BASE:
        raise GacError(f"alignment unit must be a positive multiple of {UNIT_BASE} (8, 16, 32 or 64: what GPU kernels "
                       f"align to), got {unit!r}")
    return unit


#: llama.cpp's quantized GGUF types (the ``--quant`` names of ``gac export``) -> the values one block of each packs
#: along a weight row, from the one table of engine types (:data:`gac.align.engine_types.LLAMA_CPP_TYPES`): a row
#: length (the input dimension) that is not whole blocks makes llama.cpp's quantizer store the tensor in another type
LLAMA_CPP_BLOCKS = {t: block for t, (_, block) in LLAMA_CPP_TYPES.items() if block}
#: named alignment units: aligning for a serving engine's own rule, ``llama.cpp:<type>`` -> that type's block
ENGINE_UNITS = {f"llama.cpp:{t}": block for t, block in LLAMA_CPP_BLOCKS.items()}


def resolve_unit(unit) -> int:
    """An alignment unit given as a number (8, 16, 32, 64, ...; a string of digits too) or by an engine's name
    (:data:`ENGINE_UNITS`: ``llama.cpp:q4_K`` is 256, the k-quants' block; ``llama.cpp:q8_0`` 32; read by
    :func:`gac.align.engine_types.parse_engine`, as ``--engine`` is): the unit as an int, checked by
    :func:`check_unit`. An unknown name is one :class:`GacError` line listing the names."""
    if isinstance(unit, str):
        text = unit.strip()
        if text.lstrip("+-").isdigit():
            return check_unit(int(text))
        try:
            engine, qtype = parse_engine(text)
        except GacError:
            engine, qtype = None, None
        block = LLAMA_CPP_BLOCKS.get(qtype) if engine == "llama.cpp" else None
        if not block:
            close = difflib.get_close_matches(text, list(ENGINE_UNITS), n=2, cutoff=0.6)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            raise GacError(f"unknown alignment unit {unit!r}{hint}; give a multiple of {UNIT_BASE} (8, 16, 32, 64) or an "
                           f"engine's unit: {', '.join(ENGINE_UNITS)}")
        return block
    return check_unit(unit)


def check_window(window) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise GacError(f"candidate window must be a positive integer number of units, got {window!r}")
    return window


MAX_CANDIDATES = 8192  # per target: a window past this is a typo (it would take minutes and gigabytes to enumerate)


def rule_candidates(d_star: float, d_max: int | None, unit: int = DEFAULT_UNIT, window: int = DEFAULT_WINDOW) -> tuple[int, ...]:
    """Multiples of ``unit`` with ``|d - d_star| < window * unit``, within ``[unit, d_max]``, plus ``d_max`` if in the window."""
    unit, window = check_unit(unit), check_window(window)
    exact = Fraction(check_d_star(d_star))  # exact arithmetic: a d* of 1e17 must not lose its window to rounding
    span = window * unit
    k_lo = max(1, math.floor((exact - span) / unit) + 1)
    k_hi = math.ceil((exact + span) / unit) - 1
    if d_max is not None:
        k_hi = min(k_hi, d_max // unit)  # a wide window never enumerates past d_max
    if k_hi - k_lo + 1 > MAX_CANDIDATES:
        raise GacError(
            f"a candidate window of {window:,} units around d*={d_star:g} holds {k_hi - k_lo + 1:,} dimensions"
            + ("" if d_max is not None else " (the target has no d_max to bound it)")
            + f", more than the {MAX_CANDIDATES:,} a target may have; use a window of at most "
            f"{max(1, MAX_CANDIDATES // 2):,} units" + ("" if d_max is not None else " or give the target a d_max")
        )
    dims = [k * unit for k in range(k_lo, k_hi + 1) if abs(k * unit - exact) < span]
    if d_max is not None:
        dims = [d for d in dims if d <= d_max]
        if d_max - exact < span or not dims:
            dims.append(d_max)
    return tuple(sorted(set(dims)))


def rank_candidates(target: Target, unit: int = DEFAULT_UNIT, window: int = DEFAULT_WINDOW) -> tuple[int, ...]:
    """The rule-based dimensions of a target other than its dense option (what a hardware profile must measure).

    For a dense d* these are the ranks within the window of ``d_max + unit`` (none with window 1).
    """
    unit, window = check_unit(unit), check_window(window)
    if not target.dense_star:
        try:
            dims = rule_candidates(target.d_star, target.d_max, unit, window)
        except GacError as e:
            raise GacError(f"target {target.name!r}: {e}") from None
    elif window == 1:
        return ()
    else:
        top = target.d_max + unit  # where the dense option sits in window arithmetic
        dims = {k * unit for k in range(1, target.d_max // unit + 1) if top - k * unit < window * unit}
        dims.add(target.d_max)
        dims = tuple(sorted(dims))
    if target.has_dense and target.d_max % unit and len(dims) > 1:
        # the dense weight is the full-rank choice: an unaligned top rank would only be a misaligned candidate
        dims = tuple(d for d in dims if d != target.d_max)
    return dims


def dense_in_window(target: Target, unit: int = DEFAULT_UNIT, window: int = DEFAULT_WINDOW) -> bool:
    """Whether the dense option (one unit above ``d_max``) lies within the window of d*."""
    if not target.has_dense:
        return False
    return target.dense_star or target.d_max - target.d_star < (window - 1) * unit


def candidate_set(
    target: Target,
    unit: int = DEFAULT_UNIT,
    window: int = DEFAULT_WINDOW,
    candidate_filter: CandidateFilter | None = None,
) -> tuple[int, ...]:
    """The candidate set C_i of one target.

    Explicit ``target.candidates`` are taken as given (the user's or compressor's own set; plus the dense option
    when the target has one). Otherwise the rule-based set is built and, if a filter is given, restricted to the
    dimensions it allows; the dense option joins when it lies in the window (see the module docstring).
    """
    if target.candidates is not None:
        return _with_dense(target, target.candidates, True)
    dims = rank_candidates(target, unit, window)
    dense = dense_in_window(target, unit, window)
    if candidate_filter is None or not dims:
        return _with_dense(target, dims, dense)
    kept = tuple(sorted({int(d) for d in candidate_filter(target, dims)}))
    stray = set(kept) - set(dims)
    if stray:
        raise GacError(
            f"candidate filter {candidate_filter!r} returned dimensions {sorted(stray)} for target {target.name!r} that "
            f"were not among its candidates {list(dims)}; a filter may only remove dimensions"
        )
    if not kept and not dense:
        raise GacError(
            f"target {target.name!r}: the hardware profile removed every candidate {list(dims)} near d*={target.d_star:.1f}; "
            f"widen the window (window > {window}) or use a coarser unit"
        )
    return _with_dense(target, kept, dense)


def _with_dense(target: Target, dims: Sequence[int], dense: bool) -> tuple[int, ...]:
    """Add the dense option; ranks that would cost as much as the dense weight are replaced by it."""
    dims = tuple(dims)
    if not target.has_dense:
        return dims
    cheaper = tuple(d for d in dims if target.params(d) < target.dense_params)
    if dense or len(cheaper) < len(dims):
        return (*cheaper, target.dense_dim)
    return cheaper


def candidate_sets(
    targets: Sequence[Target],
    unit: int = DEFAULT_UNIT,
    window: int = DEFAULT_WINDOW,
    candidate_filter: CandidateFilter | None = None,
) -> list[tuple[int, ...]]:
    return [candidate_set(t, unit, window, candidate_filter) for t in targets]
