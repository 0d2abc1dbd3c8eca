"""The ``gac align`` input format ("bring your own compressor").

.. code-block:: json

    {"budget": 1000000, "unit": 8, "window": 8,
     "targets": [{"name": "layers.0.q_proj", "d_star": 107.3, "score": 0.8, "params_per_dim": 8192,
                  "d_max": 4096, "candidates": [96, 104, 112], "kind": "lowrank"}]}

``unit``, ``window``, ``d_max``, ``candidates``, ``kind``, ``dense_params`` and ``shape`` are optional. Unknown keys
are errors, so a typo cannot be silently ignored.

**A latency budget** (strategy ``gac_latency``, :mod:`gac.align.latency_budget`): ``"latency_budget_ms"`` at the top,
and per target ``"latency_ms": {"96": 0.121, "104": 0.118}``, the latency of its kernels at each candidate dimension
(every candidate needs one). ``"latency_fixed_ms"`` (the rest of the forward, which no plan changes; default 0) is
optional. The solver is exact (no rounding step: a ``"latency_quantum_ms"`` key is refused). With latencies given,
every strategy's plan also reports its summed latency.

A low-rank target (``"kind": "lowrank"``) may carry ``"dense_params": out * in``: the weight may then stay
unfactorised, at that cost, when that is the best use of the budget (its plan dimension is then ``min(out, in)``
and the plan lists it under ``"dense"``). ``"shape": [out, in]`` pins the weight's shape; a ``dense_params`` that
is not ``out * in`` of that shape (or, without a shape, of any shape with ``out + in = params_per_dim``) is an error.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gac.align.candidates import DEFAULT_UNIT, DEFAULT_WINDOW, check_unit
from gac.align.latency_budget import check_latency_table, check_ms
from gac.align.targets import Target, check_unique
from gac.errors import GacError
from gac.io import read_json

_LATENCY_TOP = ("latency_budget_ms", "latency_fixed_ms")
_TOP = {"budget", "unit", "window", "targets", *_LATENCY_TOP}
_GONE = {"latency_quantum_ms": "the latency solver is exact and has no rounding step; remove the key"}
_TARGET_REQUIRED = ("name", "d_star", "score", "params_per_dim")
_TARGET = {*_TARGET_REQUIRED, "d_max", "candidates", "kind", "dense_params", "shape", "latency_ms"}


@dataclass
class Allocation:
    targets: list[Target]
    budget: int
    unit: int = DEFAULT_UNIT
    window: int = DEFAULT_WINDOW
    latency: dict[str, dict[int, float]] | None = None  # target name -> {dim: ms}; None: no latencies given
    latency_budget_ms: float | None = None
    latency_fixed_ms: float = 0.0


def _int(value, where: str, what: str) -> int:
    """JSON integers, and floats with an integral value (1e9), are accepted."""
    if isinstance(value, bool):
        raise GacError(f"{where}: {what} must be an integer, got {value!r}")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise GacError(f"{where}: {what} must be an integer, got {value!r}")
    return value


def parse_allocation(data: object, source: str = "allocation") -> Allocation:
    if not isinstance(data, dict):
        raise GacError(f"{source}: expected a JSON object with keys 'budget' and 'targets', got {type(data).__name__}")
    gone = sorted(set(data) & set(_GONE))
    if gone:
        raise GacError(f"{source}: {gone[0]!r} is no longer read: {_GONE[gone[0]]}")
    unknown = set(data) - _TOP
    if unknown:
        raise GacError(f"{source}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP)}")
    for key in ("budget", "targets"):
        if key not in data:
            raise GacError(f"{source}: missing required key {key!r}")
    budget = _int(data["budget"], source, "'budget'")
    if budget <= 0:
        raise GacError(f"{source}: 'budget' must be a positive number of parameters, got {budget}")
    unit = _int(data.get("unit", DEFAULT_UNIT), source, "'unit'")
    window = _int(data.get("window", DEFAULT_WINDOW), source, "'window'")
    if window <= 0:
        raise GacError(f"{source}: 'window' must be a positive integer, got {window}")
    try:
        check_unit(unit)
    except GacError as e:
        raise GacError(f"{source}: 'unit': {e}") from None
    raw = data["targets"]
    if not isinstance(raw, list) or not raw:
        raise GacError(f"{source}: 'targets' must be a non-empty list of target objects")
    targets = []
    latency: dict = {}
    for k, t in enumerate(raw):
        where = f"{source}: targets[{k}]"
        if not isinstance(t, dict):
            raise GacError(f"{where} must be an object, got {type(t).__name__}")
        if "name" in t:
            where += f" ({t['name']!r})"
        missing = [key for key in _TARGET_REQUIRED if key not in t]
        if missing:
            raise GacError(f"{where}: missing required key(s) {missing}")
        unknown = set(t) - _TARGET
        if unknown:
            raise GacError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TARGET)}")
        cands = t.get("candidates")
        if cands is not None:
            if not isinstance(cands, list):
                raise GacError(f"{where}: 'candidates' must be a list of integers")
            cands = tuple(_int(c, where, "every candidate") for c in cands)
        d_max = t.get("d_max")
        dense = t.get("dense_params")
        shape = t.get("shape")
        if shape is not None:
            if not isinstance(shape, list) or len(shape) != 2:
                raise GacError(f"{where}: 'shape' must be [out, in], got {shape!r}")
            shape = tuple(_int(x, where, "'shape' entries") for x in shape)
        if "latency_ms" in t:
            latency[t.get("name")] = check_latency_table({t.get("name"): t["latency_ms"]}, where)[t.get("name")]
        try:
            targets.append(
                Target(
                    name=t["name"],
                    d_star=t["d_star"],
                    score=t["score"],
                    params_per_dim=_int(t["params_per_dim"], where, "'params_per_dim'"),
                    d_max=None if d_max is None else _int(d_max, where, "'d_max'"),
                    candidates=cands,
                    kind=t.get("kind", "generic"),
                    dense_params=None if dense is None else _int(dense, where, "'dense_params'"),
                    shape=shape,
                )
            )
        except GacError as e:
            raise GacError(f"{source}: {e}") from None
    check_unique(targets)
    return Allocation(targets, budget, unit, window, *_latency(data, latency, targets, source))




def _latency(data: dict, latency: dict, targets: list[Target], source: str):
    """The latency keys: all targets with ``latency_ms`` or none; the budget and the fixed part as numbers."""
    opts = {}
    for key in _LATENCY_TOP:
        if key in data:
            check_ms(data[key], f"{source}: {key!r}", positive=key != "latency_fixed_ms")
            opts[key] = float(data[key])
    if latency and len(latency) < len(targets):
        lack = [t.name for t in targets if t.name not in latency]
        raise GacError(f"{source}: {len(lack)} target(s) have no 'latency_ms' (e.g. {lack[0]!r}) while others do; give "
                       f"every target its latencies or none")
    if opts and not latency:
        raise GacError(f"{source}: {sorted(opts)} given but no target has 'latency_ms'; give each target its latency "
                       f"at every candidate dimension")
    return latency or None, opts.get("latency_budget_ms"), opts.get("latency_fixed_ms", 0.0)


MAX_FILE_BYTES = 256 * 2**20  # 256 MiB: ~1M targets; JSON parsing takes ~2x the file in memory, and far more targets
# than any model has (a 405B model has ~900 projections) is a wrong file, not an allocation


def load_allocation(path: str | os.PathLike) -> Allocation:
    from pathlib import Path

    p = Path(path)
    if p.is_file() and p.stat().st_size > MAX_FILE_BYTES:
        raise GacError(f"allocation file {str(p)!r} is {p.stat().st_size / 2**20:,.0f} MiB, more than the "
                       f"{MAX_FILE_BYTES // 2**20} MiB an allocation can need (about a million targets); check that it "
                       f"is the allocation JSON")
    return parse_allocation(read_json(path, "allocation file"), source=str(path))


def allocation_to_json(alloc: Allocation) -> dict:
    out = {"budget": alloc.budget, "unit": alloc.unit, "window": alloc.window, "targets": []}
    for t in alloc.targets:
        row = {"name": t.name, "d_star": t.d_star, "score": t.score, "params_per_dim": t.params_per_dim}
        if t.d_max is not None:
            row["d_max"] = t.d_max
        if t.candidates is not None:
            row["candidates"] = list(t.candidates)
        if t.kind != "generic":
            row["kind"] = t.kind
        if t.dense_params is not None:
            row["dense_params"] = t.dense_params
        if t.shape is not None:
            row["shape"] = list(t.shape)
        if alloc.latency is not None and t.name in alloc.latency:
            row["latency_ms"] = {str(d): ms for d, ms in sorted(alloc.latency[t.name].items())}
        out["targets"].append(row)
    for key in _LATENCY_TOP:
        value = getattr(alloc, key)
        if value is not None and (key != "latency_fixed_ms" or value or alloc.latency is not None):
            out[key] = value
    return out
