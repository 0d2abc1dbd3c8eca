"""Small, safe file helpers: atomic JSON writes that never overwrite a result by accident."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from gac.errors import GacError


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def read_json(path: str | os.PathLike, what: str = "file") -> object:
    """Read strict JSON (NaN/Infinity rejected) with errors that name the file and the problem."""
    p = Path(path)
    if not p.exists():
        raise GacError(f"{what} {str(p)!r} does not exist")
    if p.is_dir():
        raise GacError(f"{what} {str(p)!r} is a directory, expected a JSON file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GacError(f"cannot read {what} {str(p)!r}: {e}") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise GacError(f"{what} {str(p)!r} is not valid JSON: {e}") from None


def write_json_atomic(path: str | os.PathLike, obj: object, overwrite: bool = False) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (temp file + rename in the same directory).

    An existing file is never replaced unless ``overwrite`` is true.
    """
    p = Path(path)
    if p.exists() and not overwrite:
        raise GacError(f"{str(p)!r} already exists; refusing to overwrite it (choose another path or pass --force)")
    p.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False, default=_default) + "\n"
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if not overwrite:
            # link() fails if the destination appeared meanwhile: no race can overwrite a result
            try:
                os.link(tmp, p)
            except FileExistsError:
                raise GacError(f"{str(p)!r} appeared while writing; refusing to overwrite it") from None
            except OSError:  # file systems without hard links
                if p.exists():
                    raise GacError(f"{str(p)!r} already exists; refusing to overwrite it") from None
                os.replace(tmp, p)
        else:
            os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return p


def _default(o):
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        raise ValueError("non-finite float")
    raise TypeError(f"cannot serialise {type(o).__name__} to JSON")
