"""A Llama-family model (dense, or pruned to per-layer MLP widths and head counts) as a GGUF file for llama.cpp.

The file is what llama.cpp's own converter (``convert_hf_to_gguf.py``) writes for such a model, through the ``gguf``
package's :class:`~gguf.GGUFWriter`: the architecture ``llama`` when every layer has the same sizes, else ``deci``
(per-layer ``feed_forward_length``, ``head_count`` and ``head_count_kv`` arrays; see
:mod:`gac.export.expressible`); q and k rows permuted from transformers' rotate-half RoPE to llama.cpp's pairwise
one; norms in f32; the tokenizer as llama.cpp's ``gpt2`` (byte-level BPE) vocabulary with its merges; a tied head
left out (llama.cpp reuses the embedding). ``f32`` and ``f16`` are written directly; a quantized type
(``q8_0``, ``q4_0``, ``q4_K``, ...) is made from the f32 file by llama.cpp's own quantizer
(``llama_model_quantize``), which falls back to another type for a tensor whose rows are not whole blocks (32
values for q4_0/q8_0, 256 for the k-quants): :func:`write_quantized` writes a file of any type and returns those
fallbacks as :func:`fallback_tensors` reads them from the file written (the quantizer's log misses some: the output
matrix falls back silently), :func:`tensor_types` counts what the tensors became.

:func:`verify_gguf` loads the file in llama.cpp (``llama-cpp-python``) and compares the logits of a token sequence
with the model's.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gac.errors import GacError
from gac.export.expressible import GGUF_TYPES, UNQUANTIZED, GgufLayout

#: logits through llama.cpp (its KV cache in f32 for the check) against the model's, max |difference| / max |logit|:
#: f32 as tight as ONNX; f16 weights (and llama.cpp's f16 matmul inputs for them) within f16 rounding carried through
#: the layers (measured, LLM-Pruner checkpoints: tiny 4.7e-7 and 2.5e-4, smollm2's 30 layers 1.8e-6 and 1.6e-3)
GGUF_TOLERANCE = {"f32": 1e-4, "f16": 5e-3}


def default_threads() -> int:
    """llama.cpp's threads when none are given (the export's check, the llama.cpp engine): half the cores."""
    return max(1, (os.cpu_count() or 2) // 2)


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """q/k rows from rotate-half order (transformers) to interleaved pairs (llama.cpp), as the converter does."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def pre_tokenizer(tokenizer_json: dict) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer: ``gpt-2`` (byte-level with GPT-2's regex), ``smollm``
    (digits split, then GPT-2's), else ``default``."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    steps = pre.get("pretokenizers") or []
    if [s.get("type") for s in steps] == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm"
    return "default"


def _vocab(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Every id's token and type, as the converter's ``get_vocab_base`` lists them."""
    from gguf import TokenType

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = {i: tok for i, tok in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(TokenType.NORMAL)
    return tokens, types


def _rope_factors(cfg) -> np.ndarray:
    """Llama 3's per-frequency RoPE factors (the ``rope_freqs`` tensor), as the converter computes them."""
    rope = dict(cfg.rope_parameters)
    base = rope.get("rope_theta", 10000.0)
    dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def write_gguf(model: nn.Module, tokenizer, layout: GgufLayout, path: Path, dtype: str = "f32") -> Path:
    """Write ``model`` to ``path`` as an ``f32`` or ``f16`` GGUF file of ``layout``'s architecture."""
    import gguf

    cfg = model.config
    arch = layout.arch
    w = gguf.GGUFWriter(str(path), arch)
    scalar = arch == "llama"
    w.add_name(str(getattr(model, "_gac_base_model", None) or "gac export"))
    w.add_context_length(int(cfg.max_position_embeddings))
    w.add_embedding_length(int(cfg.hidden_size))
    w.add_block_count(len(layout.n_ff))
    w.add_feed_forward_length(layout.n_ff[0] if scalar else list(layout.n_ff))
    w.add_head_count(layout.n_head[0] if scalar else list(layout.n_head))
    w.add_head_count_kv(layout.n_head_kv[0] if scalar else list(layout.n_head_kv))
    w.add_key_length(layout.head_dim)
    w.add_value_length(layout.head_dim)
    w.add_rope_dimension_count(layout.head_dim)
    w.add_rope_freq_base(float(dict(cfg.rope_parameters).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_vocab_size(int(cfg.vocab_size))
    w.add_file_type(getattr(gguf.LlamaFileType, GGUF_TYPES[dtype]))
    _add_tokenizer(w, tokenizer, cfg)
    big = np.float16 if dtype == "f16" else np.float32

    def put(name: str, t: torch.Tensor, matrix: bool = True) -> None:
        w.add_tensor(name, t.detach().to(torch.float32).cpu().numpy().astype(big if matrix else np.float32))

    sd = model.state_dict()
    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"], matrix=False)
    if not layout.tied:
        put("output.weight", sd["lm_head.weight"])
    if layout.rope_type == "llama3":
        w.add_tensor("rope_freqs.weight", _rope_factors(cfg))
    for i in range(len(layout.n_ff)):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"], matrix=False)
        put(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], layout.n_head[i]))
        put(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], layout.n_head_kv[i]))
        put(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], matrix=False)
        put(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_tokenizer(w, tokenizer, cfg) -> None:
    """The vocabulary, merges and special ids, as the converter's ``_set_vocab_gpt2`` writes them."""
    import gguf

    with tempfile.TemporaryDirectory(prefix="gac-export-tok-") as d:
        tokenizer.save_pretrained(d)
        cfg.to_json_file(str(Path(d) / "config.json"))  # the special ids SpecialVocab falls back on
        tj = Path(d) / "tokenizer.json"
        pre = pre_tokenizer(json.loads(tj.read_text(encoding="utf-8"))) if tj.is_file() else "default"
        tokens, types = _vocab(tokenizer, int(cfg.vocab_size))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        special = gguf.SpecialVocab(d, load_merges=True, n_vocab=len(tokens))
        special.add_to_gguf(w, quiet=True)


@contextlib.contextmanager
def _quiet_c_output():
    """File descriptors 1 and 2 sent to /dev/null: what C code prints there bypasses Python."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "wb") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def write_quantized(model: nn.Module, tokenizer, layout: GgufLayout, path: Path, quant: str, workdir: Path) -> dict:
    """Write ``model`` to ``path`` as a GGUF file of type ``quant``: f32 and f16 directly (:func:`write_gguf`); a
    quantized type through an f32 file in a scratch directory under ``workdir`` (removed once quantized, or on a
    failure) and llama.cpp's quantizer (:func:`quantize`). Returns :func:`fallback_tensors` of the file written
    (``{}`` for f32 and f16): what ``gac export``, the llama.cpp engine and the benchmarks report."""
    if quant in UNQUANTIZED:
        write_gguf(model, tokenizer, layout, path, dtype=quant)
        return {}
    with tempfile.TemporaryDirectory(prefix="quantizer-input-", dir=workdir) as d:
        f32 = write_gguf(model, tokenizer, layout, Path(d) / "f32.gguf", dtype="f32")
        quantize(f32, path, quant)
    return fallback_tensors(path, quant)


def quantize(src: Path, out: Path, qtype: str) -> Path:
    """``out``: the f32 GGUF ``src`` quantized by llama.cpp's quantizer to ``qtype`` (a :data:`GGUF_TYPES` name);
    its log is collected rather than printed, and its last line names a failure. The tensors it stored in another
    type are :func:`fallback_tensors` of ``out``."""
    import ctypes

    import llama_cpp
    from llama_cpp import _logger

    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level, text, user_data):
        lines.append(text.decode("utf-8", errors="replace"))

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + GGUF_TYPES[qtype])
    params.nthread = 0
    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        with _quiet_c_output():
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))  # llama-cpp-python's own again
    text = "".join(lines)
    if rc != 0:
        last = (text.strip().splitlines() or ["no output"])[-1][:200]
        raise GacError(f"llama.cpp's quantizer failed on the export (code {rc}: {last}) for --quant {qtype}; the f32 "
                       f"export (--quant f32) works without it")
    return out


def quantizable(name: str, shape) -> bool:
    """Whether llama.cpp's quantizer quantizes a tensor (``tensor_allows_quantization`` in ``src/llama-quant.cpp``,
    for the tensors a Llama-family file holds): a weight matrix, norms excepted."""
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name


def fallback_tensors(path: Path, quant: str) -> dict:
    """``{tensor: {"ncols", "block", "type"}}``, read from the GGUF file ``path`` that llama.cpp's quantizer made at
    ``quant``: every tensor it quantizes whose rows (``ncols``, the weight's input dimension) are not whole blocks of
    ``quant`` (:data:`gac.align.candidates.LLAMA_CPP_BLOCKS`), and the type the file stores it as. The quantizer
    cannot store such a row in ``quant``: it takes another type (docs/export.md, "Fallback")."""
    from gguf import GGUFReader

    from gac.align.candidates import LLAMA_CPP_BLOCKS

    block = LLAMA_CPP_BLOCKS[quant]
    out = {}
    for t in GGUFReader(str(path)).tensors:
        shape = [int(n) for n in t.shape]  # ggml's order: ne[0], the row length, first
        if quantizable(t.name, shape) and shape[0] % block:
            out[t.name] = {"ncols": shape[0], "block": block, "type": t.tensor_type.name.lower().replace("_k", "_K")}
    return dict(sorted(out.items(), key=lambda kv: _natural(kv[0])))


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def fallback_line(quant: str, fallback: dict) -> str:
    """One line saying which tensors fell back, to what, and how to align for the type (empty when none did)."""
    if not fallback:
        return ""
    kinds = Counter((f["ncols"], f["type"]) for f in fallback.values())
    what = ", ".join(f"{n} x {ncols} columns -> {typ}" for (ncols, typ), n in sorted(kinds.items()))
    block = next(iter(fallback.values()))["block"]
    return (f"--quant {quant}: {len(fallback)} tensor(s) have rows that are not whole blocks of {block} and were stored "
            f"in another type ({what}); widths aligned with align.unit=llama.cpp:{quant} (gac compress --unit "
            f"llama.cpp:{quant}) avoid this where the model's own sizes allow")


def tensor_types(path: Path) -> dict:
    """``{type: tensors}``: what the 2-D tensors of a GGUF file are stored as."""
    from gguf import GGUFReader

    mats = [t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) >= 2]
    return dict(sorted(Counter(mats).items()))


def verify_gguf(path: Path, model: nn.Module, dtype: str, threads: int | None = None, n_tokens: int = 48) -> dict:
    """Run ``path`` in llama.cpp (KV cache in f32) on a token sequence and compare each position's logits with
    ``model``'s.
    ``dtype`` f32/f16: a :class:`GacError` above :data:`GGUF_TOLERANCE`; a quantized type: the difference and how
    often the top token agrees are reported, not judged."""
    import llama_cpp

    from gac.export.onnx import sample_ids

    ids = sample_ids(int(model.config.vocab_size), (1, n_tokens), seed=3)
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
    f32 = llama_cpp.GGML_TYPE_F32  # the KV cache in f32: the check sees the file's weights, not the cache's rounding
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(64, n_tokens), n_batch=n_tokens, logits_all=True,
                          n_threads=threads or default_threads(), verbose=False, seed=0,
                          type_k=f32, type_v=f32)
    try:
        llm.eval(ids[0].tolist())
        got = np.asarray(llm.scores[:n_tokens], dtype=np.float32)
    finally:
        llm.close()
    if got.shape != ref.shape or not np.isfinite(got).all():
        raise GacError(f"llama.cpp gives logits of shape {got.shape} (finite: {bool(np.isfinite(got).all())}) for "
                       f"the GGUF export, the model {ref.shape}; the export is wrong and was not kept")
    rel = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
    limit = GGUF_TOLERANCE.get(dtype)
    if limit is not None and rel > limit:
        raise GacError(f"the GGUF export's logits in llama.cpp differ from the model's by {rel:.2e} of the largest "
                       f"logit (above {limit:g} for {dtype}); the export is wrong and was not kept")
    return {"engine": "llama.cpp", "version": getattr(llama_cpp, "__version__", "?"), "tokens": n_tokens,
            "max_rel_diff": rel, "top1_agreement": top1, "judged": limit is not None}
