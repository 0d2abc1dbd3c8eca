"""Save and load the fields of a :class:`~gac.compression.prepared.Prepared` state: one safetensors file, never a pickle.

A prepared state (scores, factorizations, sensitivity table) is what a ratio or strategy sweep re-uses, and it
lives in shared results directories that other people can write to. It is therefore stored as *data*:

* tensors (low-rank factors, channel orders and energies) as safetensors entries named ``<unit>/<field>``;
* everything else (proxy, calibration, allocation, power, scores, timings, sensitivity table, notes, the
  non-tensor factor fields such as the whitening path) as JSON in the safetensors header metadata.

Reading uses :func:`safetensors.torch.load_file`, which parses a JSON header and raw buffers and executes nothing:
a planted pickle (or any other file) at the path is rejected with a :class:`~gac.errors.GacError`, never run.
:func:`load_prepared` also checks the file against the model it is loaded for (unit names, factor shapes), so a
state written for another model or another compressor configuration is refused instead of silently applied.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from gac.errors import GacError

FORMAT = "gac-prepared"
FORMAT_VERSION = 1
_META_KEY = "gac_prepared"
CALIB_KEY = "__calibration_ids__"  # the calibration token ids, kept for a compressor that needs them after apply


def save_prepared(prepared, path: str | os.PathLike) -> Path:
    """Write ``prepared`` to ``path`` atomically (a temp file in the same directory, then a rename)."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    factor_meta: dict[str, dict] = {}
    for unit, fields in prepared.factors.items():
        if "/" in unit:
            raise GacError(f"unit name {unit!r} contains '/'; cannot store its factors")
        meta = {}
        for k, v in fields.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{unit}/{k}"] = v.detach().to("cpu").contiguous()
            elif v is None or isinstance(v, (str, bool, int, float)):
                meta[k] = v
            else:
                raise GacError(f"factor field {unit}/{k} is a {type(v).__name__}; only tensors and JSON scalars are stored")
        factor_meta[unit] = meta
    if getattr(prepared, "calib_ids", None) is not None:
        tensors[CALIB_KEY] = prepared.calib_ids.detach().to("cpu").contiguous()
    state = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "compressor": prepared.compressor.name,
        "compressor_options": prepared.compressor.options(),
        "units": [u.name for u in prepared.units],
        "proxy": prepared.proxy,
        "calibration": prepared.calibration,
        "allocation": prepared.allocation,
        "power": prepared.power,
        "scores": prepared.scores,
        "factor_meta": factor_meta,
        "timings": {k: v for k, v in prepared.timings.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
        "sensitivity": prepared.sensitivity,
        "notes": list(prepared.notes),
        "memory": getattr(prepared, "memory", {}) or {},
    }
    text = json.dumps(state, allow_nan=False, default=_jsonable)
    from gac.faults import fault_point
    from gac.io import honour_umask, os_error, replace_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, "create the directory of", path) from None

    def write(tmp):  # a temp file that names its writer: gac.io.clean_temp_files removes it if this process is killed
        try:
            save_file(tensors, str(tmp), metadata={_META_KEY: text})
        except Exception as e:  # safetensors reports a full disk as its own error type
            raise GacError(f"cannot write the prepared state {str(path)!r}: {str(e).splitlines()[0][:200]}; "
                           f"free space there or choose another results directory") from None
        honour_umask(tmp)  # safetensors creates 0600: colleagues sharing the results directory could not read it
        fault_point("prepared_write")

    return replace_file(path, write)


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(f"cannot store {type(o).__name__} in a prepared state")


def read_prepared(path: str | os.PathLike, device: str = "cpu") -> tuple[dict, dict[str, torch.Tensor]]:
    """The JSON state and the tensors of a prepared-state file. Raises :class:`GacError` for anything that is not
    a gac prepared state (a pickle, a truncated file, another format)."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except Exception as e:  # safetensors raises SafetensorError / OSError / ValueError for a foreign file
        raise GacError(f"{str(path)!r} is not a gac prepared state (safetensors could not read it: "
                       f"{str(e).splitlines()[0][:200]}); it was not loaded") from None
    try:
        state = json.loads(meta[_META_KEY], parse_constant=_reject)
    except (KeyError, ValueError) as e:
        raise GacError(f"{str(path)!r} has no valid gac prepared-state header ({e}); it was not loaded") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise GacError(f"{str(path)!r} is not a gac prepared state (format != {FORMAT!r})")
    if int(state.get("format_version", 0)) != FORMAT_VERSION:
        raise GacError(f"{str(path)!r} has prepared-state format {state.get('format_version')}, this gac reads "
                       f"{FORMAT_VERSION}")
    return state, tensors


def _reject(name):
    raise ValueError(f"{name} is not valid JSON")


def load_prepared(path: str | os.PathLike, model, compressor, layout=None, units=None, device: str = "cpu"):
    """The fields of a :class:`~gac.compression.prepared.Prepared` for ``model``, read from ``path`` (keyword arguments
    of its constructor: :meth:`Prepared.load <gac.compression.prepared.Prepared.load>` builds it).

    ``compressor`` is the built compressor (its name and options must match the file's); ``units`` default to
    ``compressor.units(model, layout)``. Every unit must have its factors with the shapes the model implies.
    """
    from gac.compression.discovery import discover

    state, tensors = read_prepared(path, device="cpu")
    where = str(path)
    if state["compressor"] != compressor.name or state["compressor_options"] != json.loads(
            json.dumps(compressor.options(), default=_jsonable)):
        raise GacError(f"{where}: prepared for {state['compressor']} {state['compressor_options']}, not for "
                       f"{compressor.name} {compressor.options()}")
    layout = layout or discover(model)
    units = units if units is not None else compressor.units(model, layout)
    names = [u.name for u in units]
    if state["units"] != names:
        raise GacError(f"{where}: its units ({len(state['units'])}) are not this model's ({len(names)}); it was "
                       f"prepared for another model or layer selection")
    factors: dict[str, dict] = {n: dict(state["factor_meta"].get(n, {})) for n in names}
    calib_ids = tensors.pop(CALIB_KEY, None)
    if calib_ids is not None and (calib_ids.dim() != 2 or calib_ids.dtype not in (torch.int64, torch.int32)):
        raise GacError(f"{where}: its calibration token ids are not an [n, seq_len] integer tensor")
    if compressor.keeps_calibration and calib_ids is None:
        raise GacError(f"{where}: {compressor.name} {compressor.options()} needs the calibration token ids, which this "
                       f"prepared state does not hold; prepare again")
    for key, t in tensors.items():
        unit, _, field = key.rpartition("/")
        if unit not in factors:
            raise GacError(f"{where}: tensor {key!r} belongs to no unit of this model")
        factors[unit][field] = t.to(device) if device != "cpu" else t
    for u in units:
        _check_factors(u, factors[u.name], where)
    scores = {k: float(v) for k, v in state["scores"].items()}
    if set(scores) != set(names) or not all(math.isfinite(v) and v >= 0 for v in scores.values()):
        raise GacError(f"{where}: scores do not cover this model's units with finite non-negative values")
    _check_sensitivity(state.get("sensitivity"), len(names), where)
    return {"model": model, "compressor": compressor, "proxy": state["proxy"], "calibration": state["calibration"],
            "allocation": state["allocation"], "power": float(state["power"]), "layout": layout, "units": units,
            "scores": scores, "factors": factors, "timings": dict(state["timings"]),
            "sensitivity": state.get("sensitivity"), "notes": list(state.get("notes", [])),
            "memory": dict(state.get("memory") or {}), "calib_ids": calib_ids}


def _check_sensitivity(sens, n_units: int, where: str) -> None:
    """A stored sensitivity table: one row per unit, one finite perplexity per grid ratio in (0, 1]."""
    if sens is None:
        return
    from gac.compression.allocation import check_sensitivity_grid

    try:
        grid = check_sensitivity_grid(sens["grid"])
        table, base = sens["table"], float(sens["base_ppl"])
        ok = (list(grid) == [float(g) for g in sens["grid"]] and len(table) == n_units and math.isfinite(base)
              and all(len(row) == len(grid) and all(math.isfinite(float(v)) for v in row) for row in table))
    except (GacError, KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise GacError(f"{where}: its sensitivity table does not fit this model's {n_units} units (one finite "
                       f"perplexity per unit and grid ratio); it was not loaded")


def _check_factors(u, f: dict, where: str) -> None:
    """Shapes a unit's factors must have (low rank: A out x k, B k x in with k <= d_cap; pruning: a permutation, one
    per expert for experts pruned to one width)."""
    if ("A" in f or "B" in f) and not ("A" in f and "B" in f):  # compact: one factor + S (lowrank_math.compact_factors)
        one, S, kept_a = f.get("A", f.get("B")), f.get("S"), "A" in f
        ok = one.ndim == 2 and S is not None and S.ndim == 1
        if ok:  # A (out x k) is kept when out <= in, B (k x in) when out > in
            k, side = (one.shape[1], one.shape[0]) if kept_a else (one.shape[0], one.shape[1])
            other = u.dense_params // side
            out_f, in_f = (side, other) if kept_a else (other, side)
            ok = (S.numel() == k >= u.d_cap and side * other == u.dense_params and (out_f <= in_f) == kept_a)
        if not ok:
            raise GacError(f"{where}: the compact factors of {u.name} ({'A' if 'A' in f else 'B'} "
                           f"{tuple(one.shape)}) do not fit the unit (dense {u.dense_params}, cap {u.d_cap})")
    elif "A" in f or "B" in f:
        A, B = f.get("A"), f.get("B")
        if A is None or B is None or A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
            raise GacError(f"{where}: factors of {u.name} are incomplete or do not chain")
        if A.shape[1] < u.d_cap or A.shape[0] * B.shape[1] != u.dense_params:
            raise GacError(f"{where}: factors of {u.name} have shapes {tuple(A.shape)} x {tuple(B.shape)}, which do "
                           f"not fit the unit (dense {u.dense_params}, cap {u.d_cap})")
    if "order" in f:
        order = f["order"]
        if order.ndim != 1 or order.numel() != u.d_full or not torch.equal(order.sort().values, torch.arange(u.d_full)):
            raise GacError(f"{where}: the channel order of {u.name} is not a permutation of its {u.d_full} channels")
    if "orders" in f:  # one channel order per expert of a shared-width experts unit
        orders, n = f["orders"], len(u.meta.get("experts", ()))
        if (orders.ndim != 2 or tuple(orders.shape) != (n, u.d_full)
                or not torch.equal(orders.sort(dim=1).values, torch.arange(u.d_full).expand(n, -1))):
            raise GacError(f"{where}: the channel orders of {u.name} are not {n} permutations of its {u.d_full} "
                           f"channels")


_CODE_PARTS = ("compression", "text.py", "models", "fixtures", "training")  # what a prepared state depends on
_code_fingerprint: str | None = None


def code_fingerprint() -> str:
    """A hash of the gac sources that produce a prepared state (compression, text sources, model loading, fixtures).

    Caches keyed by it are invalidated by any code change there, released or not (a fix of a scoring bug must
    never keep serving the old scores)."""
    from gac.hashing import digest

    global _code_fingerprint
    if _code_fingerprint is None:
        root = Path(__file__).resolve().parents[1]
        blob = []
        for part in _CODE_PARTS:
            p = root / part
            for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
                blob += [str(f.relative_to(root)).encode(), f.read_bytes()]
        _code_fingerprint = digest(b"".join(blob))
    return _code_fingerprint
