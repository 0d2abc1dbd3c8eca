"""The names of the directories and files gac makes and recognises, and what they make a directory: a results store
(its marker and its own directories; :mod:`gac.results.store` keeps one), a gac checkpoint (its file;
:mod:`gac.compression.checkpoint` writes it), a model directory; and where an output may not go because one of
them owns the place (:func:`owned_directory`, the rule :func:`gac.io.check_output_file` and every writer of a
directory follow). Nothing is written here, and nothing of gac is imported: io, results/ and compression/ all
read it."""

from __future__ import annotations

import os
from pathlib import Path

#: the file that marks a directory as a results store (gac.results.store writes it)
STORE_MARKER = ".gac-store.json"
#: the directories of a store that hold its jobs' results: records, failures, events, stage outputs, locks
STORE_DIRS = ("records", "failures", "runs", "work", "locks")
#: every directory a store owns: nothing but a job or a bench writes there
STORE_OWN_DIRS = (*STORE_DIRS, "cache", "bench", "sweeps")
#: the file that makes a directory a gac compressed checkpoint (:mod:`gac.compression.checkpoint` writes it)
CHECKPOINT_FILE = "gac_checkpoint.json"
_WEIGHT_NAMES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def is_store(d: str | os.PathLike, to_read: bool = False) -> bool:
    """Is ``d`` a results store? Its marker makes it one. Without the marker (a store an older gac made, a copy):
    for where outputs may go, records/ beside another of :data:`STORE_DIRS` (a user's folder that merely holds a
    records/ is not one); ``to_read``, any one of them (a copy of records/ alone is read too)."""
    d = Path(d)
    if (d / STORE_MARKER).is_file():
        return True
    found = [x for x in STORE_DIRS if (d / x).is_dir()]
    return bool(found) if to_read else ("records" in found and len(found) > 1)


def _is_model_dir(d: Path) -> str | None:
    """The file that makes ``d`` a model directory (a gac checkpoint's config, or config.json beside weights)."""
    if (d / CHECKPOINT_FILE).is_file():
        return CHECKPOINT_FILE
    if (d / "config.json").is_file() and (any((d / n).exists() for n in _WEIGHT_NAMES)
                                          or any(d.glob("*.safetensors"))):
        return "config.json"
    return None


def directory_kind(path: str | os.PathLike) -> str | None:
    """``"a results store"`` or ``"a model directory (it holds config.json)"`` when ``path`` is one, else None."""
    d = Path(os.path.realpath(Path(path).expanduser()))
    if not d.is_dir():
        return None
    if is_store(d):
        return "a results store"
    marker = _is_model_dir(d)
    return f"a model directory (it holds {marker})" if marker else None


def owned_directory(path: str | os.PathLike, itself: bool = True) -> str | None:
    """Whether ``path`` (a file or directory an output would be) lies where outputs do not go, as the rest of a
    sentence after the path: inside a model directory (its files are the model: a report or an edited config.json
    there changes or breaks it) or a results store's own directories (a stray file in records/ breaks every
    report); with ``itself``, also a model directory or a results store ``path`` is. None when it is free."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    kind = directory_kind(p) if itself else None
    if kind:
        return f"is {kind}"
    parent = Path(os.path.realpath(p.parent))
    marker = _is_model_dir(parent)
    if marker:
        return f"is inside the model directory {str(parent)!r} (it holds {marker}; its files are the model)"
    for a in (parent, *parent.parents):
        if is_store(a):
            rel = parent.relative_to(a).parts
            if rel and rel[0] in STORE_OWN_DIRS:
                return (f"is inside {rel[0]}/ of the results store {str(a)!r} (only gac's jobs and benches write "
                        f"there)")
            if not rel and p.name in (STORE_MARKER, *STORE_OWN_DIRS):
                return f"is the results store {str(a)!r}'s own {p.name}"
            return None
    return None
