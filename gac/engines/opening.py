""":func:`open_engine`, the one way to an :class:`~gac.engines.base.Engine`, and the checks it makes first."""

from __future__ import annotations

import os
from pathlib import Path

from gac.align.engine_types import ENGINE_TYPES, parse_engine
from gac.errors import GacError

#: the engines, torch (PyTorch eager, what gac always measured) first (the one table: gac.align.engine_types)
ENGINES = tuple(ENGINE_TYPES)
#: engine -> the export format it runs (gac.export), whose packages it needs
FORMAT = {"onnxruntime": "onnx", "llama.cpp": "gguf"}


def _source(model, tokenizer):
    from gac.export.expressible import Source

    return Source("the model", "memory", model.config, model, has_tokenizer=tokenizer is not None)


def _why_not(name: str, model, tokenizer) -> str | None:
    """Why ``name`` cannot run ``model`` (None: it can), from the model's structure, device and dtype alone."""
    import torch

    if name == "torch":
        return None
    from gac.devices import model_device

    dev = model_device(model)
    if dev.type not in ("cpu", "meta"):  # meta: a skeleton checked before any weights exist
        return f"it runs on the CPU here and the model is on {dev}"
    if name == "onnxruntime":
        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:
            return f"its CPU provider runs float32 graphs and the model is {str(dtype).removeprefix('torch.')}"
        return None
    from gac.export.expressible import gguf_layout

    try:
        gguf_layout(_source(model, tokenizer))
    except GacError as e:
        return str(e)
    return None


def engines_for(model, tokenizer=None) -> list[str]:
    """The engines that can run ``model`` (its structure, device and dtype; installed or not)."""
    return [e for e in ENGINES if _why_not(e, model, tokenizer) is None]


def check_engine(name: str, model=None, tokenizer=None, quant: str | None = None, packages: bool = True) -> str | None:
    """``name`` checked before any work: a known engine, or ``engine:type`` (``llama.cpp:q4_K``:
    :func:`gac.align.engine_types.parse_engine`); ``quant`` (or the type in ``name``) one it takes (llama.cpp: a
    GGUF type, default f32; the others: none), given ``model`` a model it can run, and (``packages``) its packages
    installed. Returns the quant.
    Each refusal is one :class:`GacError` line; a missing package names ``pip install 'gac[engines]'``."""
    name, quant = _engine_and_quant(name, quant)
    if model is not None:  # before the packages: installing them would not help
        why = _why_not(name, model, tokenizer)
        if why:
            can = [e for e in engines_for(model, tokenizer) if e != name]
            raise GacError(f"engine {name} cannot run this model: {why}; engines that can: {', '.join(can)}")
    if packages and name in FORMAT:
        from gac.export.engines import require

        require(FORMAT[name], f"engine {name}")
    return quant


def _engine_and_quant(text: str, quant: str | None) -> tuple[str, str | None]:
    """``(engine, quant)`` of ``text`` (``engine`` or ``engine:type``) and a ``quant`` given beside it."""
    from gac.export.expressible import check_quant

    name, typed = parse_engine(text)
    if typed is not None and quant is not None and parse_engine(f"{name}:{quant}")[1] != typed:
        raise GacError(f"engine {text} is given the type {quant!r} beside it; give the type once")
    quant = typed if typed is not None else quant
    if name == "llama.cpp":
        return name, check_quant("gguf", quant)
    if quant is not None:
        raise GacError(f"engine {name} takes no quant (got {quant!r}); a quantized type is llama.cpp's (GGUF)")
    return name, None


def open_engine(name: str, model, tokenizer, workdir: str | os.PathLike | None, *, threads: int | None = None,
                quant: str | None = None):
    """``model`` (an in-memory causal LM, eval mode) as engine ``name`` runs it: an :class:`~gac.engines.base.Engine`.

    * ``name``: ``torch`` (the model itself, PyTorch eager, on its own device and dtype), ``onnxruntime`` (exported
      by :func:`gac.export.onnx.export_onnx` into ``workdir``, run by the CPU execution provider) or ``llama.cpp``
      (written by :func:`gac.export.gguf.write_quantized` into ``workdir``, quantized by llama.cpp's own quantizer when
      ``quant`` is a quantized GGUF type, run by llama-cpp-python); ``llama.cpp:q4_K`` names the type too (as
      ``gac bench --engine`` and ``eval.engine`` do);
    * ``tokenizer``: llama.cpp needs it (a GGUF file carries its vocabulary); the others ignore it;
    * ``workdir``: where the export goes (created when absent; the caller removes it); unused by torch;
    * ``threads``: the engine's compute threads (torch: torch's thread count while open; onnxruntime: intra-op
      threads; llama.cpp: its threads, default half the cores); None: the engine's default;
    * ``quant``: llama.cpp's GGUF type (``f32`` default, ``f16``, ``q8_0``, ``q4_0``, ``q4_K``, ...; the one table:
      :data:`gac.align.engine_types.LLAMA_CPP_TYPES`); the others none.

    The engine gives ``.name``, ``.version`` (its package's), ``.describe()`` (the dict a record keeps: name,
    version, threads, quant, dtype, provider), ``.logits(input_ids[b, s]) -> [b, s, vocab]``, ``.prefill_call(
    input_ids)`` (the callable latency timing calls) and ``.close()`` (also a context manager).

    Refused in one :class:`GacError` line before any work: an unknown engine or quant, a quant on an engine that
    takes none, an engine whose packages are
    not installed (naming ``pip install 'gac[engines]'``), and a model the engine cannot express (naming the engines
    that can: a non-Llama or low-rank model in llama.cpp, a model on a GPU or not in float32 in onnxruntime)."""
    quant = check_engine(name, model, tokenizer, quant)
    name = parse_engine(name)[0]
    if threads is not None:
        from gac.checks import check_threads

        threads = check_threads(threads, "engine threads")
    if name == "torch":
        from gac.engines.eager import TorchEngine

        return TorchEngine(model, threads)
    if workdir is None:
        raise GacError(f"engine {name} exports the model: give it a working directory")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if name == "onnxruntime":
        from gac.engines.ort import OrtEngine

        return OrtEngine(model, workdir, threads)
    from gac.engines.llama import LlamaCppEngine
    from gac.export.expressible import gguf_layout

    return LlamaCppEngine(model, tokenizer, gguf_layout(_source(model, tokenizer)), workdir, threads, quant)
