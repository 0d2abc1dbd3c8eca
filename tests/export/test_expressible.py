"""What each export format can hold, decided from a checkpoint's structure before any weight is read; the engine
check; the GGUF pieces that need no engine (the q/k row order, the pre-tokenizer name). Default tier: no engine
runs here (tests/export/test_engines.py, marker ``engines``, runs them)."""

from __future__ import annotations

import json

import pytest
import torch

from gac.errors import GacError
from tests.bad_input_fixtures_export import pruned_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    T = tmp_path_factory.mktemp("expressible")
    return {"pruned": pruned_checkpoint(T / "pruned"), "uniform": pruned_checkpoint(T / "uniform", (0, 1, 2, 3))}


def test_per_layer_widths_are_deci_in_gguf_and_no_hf_config(checkpoints):
    from gac.export.expressible import check_format, describe, verdicts

    src = describe(checkpoints["pruned"])
    lay = check_format(src, "gguf")
    assert lay.arch == "deci" and lay.n_ff == (512, 688, 688, 688)
    assert lay.n_head == (4,) * 4 and lay.n_head_kv == (2,) * 4 and lay.head_dim == 64 and lay.tied
    assert verdicts(src).can() == ["onnx", "gguf"]
    with pytest.raises(GacError, match=r"its MLP widths differ from layer to layer \(512, 688, 688, 688\).*"
                                       r"export it as onnx or gguf instead"):
        check_format(src, "hf")


def test_uniform_widths_are_llama_in_gguf_and_an_hf_config(checkpoints):
    from gac.export.expressible import check_format, describe

    src = describe(checkpoints["uniform"])
    assert check_format(src, "gguf").arch == "llama"
    cfg = check_format(src, "hf")
    assert cfg["intermediate_size"] == 512 and cfg["model_type"] == "llama"


def test_the_dense_model_is_every_format():
    from gac.export.expressible import describe, verdicts

    v = verdicts(describe("tiny"))
    assert v.can() == ["onnx", "gguf", "hf"]
    assert v.results["hf"]["intermediate_size"] == 688


def test_low_rank_factors_are_onnx_only(tmp_path):
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.modules import LowRankLinear
    from gac.compression.swap import replace_module
    from gac.export.expressible import check_format, describe
    from gac.models import load_model

    model, tok = load_model("tiny", dtype=torch.float32)
    name = "model.layers.1.self_attn.v_proj"
    w = model.get_submodule(name).weight.detach()
    replace_module(model, name, LowRankLinear.from_factors(w[:, :32].contiguous(), torch.eye(32, w.shape[1])))
    src = describe(save_checkpoint(model, tok, tmp_path / "ck"))
    with pytest.raises(GacError, match=r"low-rank factors \(model.layers.1.\*.v_proj\).*export it as onnx instead"):
        check_format(src, "gguf")
    with pytest.raises(GacError, match=r"low-rank factors \(model.layers.1.self_attn.v_proj\), which no transformers"):
        check_format(src, "hf")
    assert check_format(src, "onnx") is True


def test_a_gguf_type_is_checked_and_only_for_gguf():
    from gac.export.expressible import check_quant

    assert check_quant("gguf", None) == "f32" and check_quant("gguf", "Q4_K") == "q4_K"
    assert check_quant("onnx", None) is None
    with pytest.raises(GacError, match="did you mean 'q4_0'|known: .*q4_0"):
        check_quant("gguf", "q4_00")
    with pytest.raises(GacError, match="applies to --format gguf only"):
        check_quant("hf", "q8_0")


@pytest.mark.parametrize("fmt,names", [("onnx", "onnx, onnxscript, onnxruntime"), ("gguf", "llama-cpp-python")])
def test_a_missing_engine_is_one_line_naming_the_extra(fmt, names, checkpoints, tmp_path, monkeypatch, capsys):
    """The engine hidden from this Python (the test environment may have it): exit 2, one line, nothing written."""
    import importlib.util

    from gac.cli import main

    real = importlib.util.find_spec
    # every engine module hidden, so the message is the same with or without the engines extra installed
    hidden = {"onnx", "onnxscript", "onnxruntime", "llama_cpp"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a))
    out = tmp_path / f"x.{fmt}"
    rc = main(["export", str(checkpoints["pruned"]), "--format", fmt, "-o", str(out)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert f"--format {fmt} needs {names}" in lines[0] and "pip install 'gac[engines]'" in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_q_and_k_rows_are_reordered_as_llama_cpp_rotates_them():
    """llama.cpp rotates pairs (2i, 2i+1); transformers rotates (i, i + d/2): row i of a head moves to 2i, row
    i + d/2 to 2i + 1."""
    from gac.export.gguf import _permute

    d, heads = 8, 2
    w = torch.arange(heads * d, dtype=torch.float32)[:, None].repeat(1, 3)
    p = _permute(w, heads)
    for h in range(heads):
        for i in range(d // 2):
            assert p[h * d + 2 * i, 0] == h * d + i and p[h * d + 2 * i + 1, 0] == h * d + i + d // 2


def test_the_pre_tokenizer_gets_llama_cpps_name():
    from gac.export.gguf import pre_tokenizer
    from gac.fixtures import tiny_dir

    tiny = json.loads((tiny_dir(build_if_missing=False) / "tokenizer.json").read_text())
    assert pre_tokenizer(tiny) == "gpt-2"
    digits = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, {"type": "ByteLevel", "use_regex": True}]}}
    assert pre_tokenizer(digits) == "smollm"
    assert pre_tokenizer({"pre_tokenizer": {"type": "Metaspace"}}) == "default"
