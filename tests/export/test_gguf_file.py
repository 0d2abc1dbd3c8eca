"""The GGUF file gac writes, read back with the ``gguf`` package (no llama.cpp needed: default tier): llama.cpp's
``deci`` keys and per-layer arrays for per-layer widths, every weight where llama.cpp looks for it (q and k rows in
llama.cpp's RoPE order), the vocabulary and merges of the model's tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.bad_input_fixtures_export import pruned_checkpoint


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    from gac.export.expressible import check_format, describe
    from gac.export.gguf import write_gguf
    from gac.models import load_model

    T = tmp_path_factory.mktemp("gguf")
    ck = pruned_checkpoint(T / "ck", layers=(1, 2), width=448)
    model, tok = load_model(str(ck), dtype="float32")
    lay = check_format(describe(ck), "gguf")
    out = {}
    for dtype in ("f32", "f16"):
        out[dtype] = write_gguf(model, tok, lay, T / f"m-{dtype}.gguf", dtype=dtype)
    return model, tok, lay, out


def _fields(path):
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    return r, {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def test_per_layer_widths_are_deci_arrays(written):
    _, _, lay, out = written
    _, f = _fields(out["f32"])
    assert f["general.architecture"] == "deci" and lay.arch == "deci"
    assert f["deci.feed_forward_length"] == [688, 448, 448, 688]
    assert f["deci.attention.head_count"] == [4] * 4 and f["deci.attention.head_count_kv"] == [2] * 4
    assert f["deci.attention.key_length"] == f["deci.rope.dimension_count"] == 64
    assert f["deci.block_count"] == 4 and f["deci.embedding_length"] == 256


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_every_weight_is_where_llama_cpp_reads_it(written, dtype):
    from gac.export.gguf import _permute

    model, _, lay, out = written
    r, _ = _fields(out[dtype])
    t = {x.name: x for x in r.tensors}
    assert "output.weight" not in t  # tied: llama.cpp reuses token_embd
    sd = model.state_dict()

    def back(name):  # the stored array in the model's (out, in) shape
        x = t[name]
        return np.asarray(x.data).reshape(list(reversed(x.shape.tolist()))).astype(np.float32)

    tol = 0 if dtype == "f32" else 1e-3
    for i in range(4):
        p = f"model.layers.{i}."
        pairs = {f"blk.{i}.attn_q.weight": _permute(sd[p + "self_attn.q_proj.weight"], 4),
                 f"blk.{i}.attn_k.weight": _permute(sd[p + "self_attn.k_proj.weight"], 2),
                 f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
                 f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
                 f"blk.{i}.ffn_gate.weight": sd[p + "mlp.gate_proj.weight"],
                 f"blk.{i}.ffn_up.weight": sd[p + "mlp.up_proj.weight"],
                 f"blk.{i}.ffn_down.weight": sd[p + "mlp.down_proj.weight"],
                 f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
                 f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"]}
        for name, ref in pairs.items():
            np.testing.assert_allclose(back(name), ref.numpy(), rtol=tol, atol=tol, err_msg=name)
        assert t[f"blk.{i}.attn_norm.weight"].tensor_type.name == "F32"  # norms stay f32
        assert t[f"blk.{i}.ffn_gate.weight"].tensor_type.name == dtype.upper()
    assert back("blk.1.ffn_down.weight").shape == (256, 448)


def test_the_tokenizer_is_llama_cpps_gpt2_vocabulary(written):
    _, tok, _, out = written
    _, f = _fields(out["f32"])
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "gpt-2"
    tokens = f["tokenizer.ggml.tokens"]
    assert len(tokens) == 4096 and all(tokens[i] == t for t, i in list(tok.get_vocab().items())[:500])
    assert len(f["tokenizer.ggml.merges"]) == 3839
    assert f["tokenizer.ggml.eos_token_id"] == tok.eos_token_id


def test_q_and_k_rows_are_a_permutation_of_each_head():
    from gac.export.gguf import _permute

    w = torch.randn(4 * 64, 8)
    p = _permute(w, 4)
    assert sorted(map(tuple, p.tolist())) == sorted(map(tuple, w.tolist()))
    assert torch.equal(p[:64].sort(0).values, w[:64].sort(0).values)  # rows stay within their head
