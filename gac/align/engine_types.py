"""The serving engines, the number types each runs a model at, and the ``engine:type`` names that pick one.

One table for every reader: ``llama.cpp:q4_K`` names llama.cpp at its q4_K type wherever an engine is chosen (``gac
bench --engine``, a job's ``eval.engine``; :mod:`gac.engines`) and the alignment unit of that type's block
(``align.unit``, ``--unit``; :func:`gac.align.candidates.resolve_unit`); ``gac export --format gguf --quant`` takes
the same types (:mod:`gac.export.expressible`). :func:`parse_engine` is the one parser of those names.
"""

from __future__ import annotations

import difflib

from gac.errors import GacError, unknown_name

#: llama.cpp's GGUF types, f32 (its default) first: name -> (llama.cpp's file type name, the values one block packs
#: along a weight row, ggml's ``GGML_QUANT_SIZES``; None for an unquantized type). llama.cpp's quantizer stores a
#: tensor whose row length (its input dimension) is not whole blocks in another type (``tensor_type_fallback`` in
#: llama.cpp's ``src/llama-quant.cpp``; docs/export.md)
LLAMA_CPP_TYPES = {"f32": ("ALL_F32", None), "f16": ("MOSTLY_F16", None), "q8_0": ("MOSTLY_Q8_0", 32),
                   "q4_0": ("MOSTLY_Q4_0", 32), "q4_1": ("MOSTLY_Q4_1", 32), "q5_0": ("MOSTLY_Q5_0", 32),
                   "q5_1": ("MOSTLY_Q5_1", 32), "q4_K": ("MOSTLY_Q4_K_M", 256), "q5_K": ("MOSTLY_Q5_K_M", 256),
                   "q6_K": ("MOSTLY_Q6_K", 256)}

#: the engines (torch, PyTorch eager, what gac always measured, first) -> the types each runs at, its default first
#: (none: the engine runs the model at the model's own dtype)
ENGINE_TYPES: dict[str, tuple[str, ...]] = {"torch": (), "onnxruntime": (), "llama.cpp": tuple(LLAMA_CPP_TYPES)}


def _type_of(engine: str, given: str) -> str:
    """``given`` (any case) as ``engine`` spells its type, or one :class:`GacError` line naming its types."""
    types = ENGINE_TYPES[engine]
    if not types:
        typed = ", ".join(f"{e}:{t}" for e, ts in ENGINE_TYPES.items() for t in ts)
        raise GacError(f"engine {engine} takes no type (got '{engine}:{given}'): it runs the model at the model's "
                       f"own dtype; give {engine} alone, or a typed engine: {typed}")
    lower = {t.lower(): t for t in types}
    if given.lower() in lower:
        return lower[given.lower()]
    close = difflib.get_close_matches(given, types, n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise GacError(f"unknown {engine} type {given!r}{hint}; {engine}'s types: {', '.join(types)}")


def parse_engine(text) -> tuple[str, str | None]:
    """``engine`` or ``engine:type`` (any case) -> ``(engine, type)`` as :data:`ENGINE_TYPES` spells them
    (``LLAMA.CPP:Q4_K`` is ``("llama.cpp", "q4_K")``); the type is None when none is given. Refused in one
    :class:`GacError` line: an unknown engine, an unknown type (naming the engine's types), a type on an engine
    that has none."""
    name, sep, given = str(text).strip().partition(":")
    name, given = name.strip(), given.strip()
    engines = {e.lower(): e for e in ENGINE_TYPES}
    if name.lower() not in engines:
        raise unknown_name("engine", name, ENGINE_TYPES)
    name = engines[name.lower()]
    if not sep:
        return name, None
    if not given:
        raise GacError(f"engine {text!r} names no type after ':'; give {name} or {name}:TYPE")
    return name, _type_of(name, given)


def engine_spec(name: str, type_: str | None = None) -> str:
    """How a result names engine ``name`` at ``type_``: ``name`` alone at the engine's default type (or when it has
    none; so llama.cpp at f32 keeps the name results had before types), else ``name:type``."""
    types = ENGINE_TYPES.get(name, ())
    return name if type_ in (None, "") or (types and type_ == types[0]) else f"{name}:{type_}"


def canonical_engine(text) -> str:
    """``engine`` / ``engine:type`` checked (:func:`parse_engine`) and spelled as results name it
    (:func:`engine_spec`): ``llama.cpp:F32`` is ``llama.cpp``, ``llama.cpp:Q4_K`` is ``llama.cpp:q4_K``."""
    return engine_spec(*parse_engine(text))
