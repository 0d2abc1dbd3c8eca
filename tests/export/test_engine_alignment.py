"""Aligning for llama.cpp's quantizer (marker ``engines``: llama.cpp runs here; .ci/run runs it): a random-weight
Llama whose own sizes are whole k-quant blocks (hidden 256, MLP 1024), pruned by LLM-Pruner at unit 8 (the
compressor's widths, gac's default) and at ``--unit llama.cpp:q4_K``, exported at q4_K: the engine-aligned checkpoint
has no fallback tensor and the unaligned one has (read from the file written, :func:`gac.export.gguf.fallback_tensors`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def blocks_model(tmp_path_factory) -> Path:
    """A 4-layer Llama with random weights, every size a multiple of 256, and tiny's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gac.models import load_model

    _, tok = load_model("tiny", dtype=torch.float32)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    d = tmp_path_factory.mktemp("blocks") / "model"
    LlamaForCausalLM(cfg).eval().save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _compress(model: Path, out: Path, *extra) -> dict:
    r = subprocess.run([sys.executable, "-m", "gac.cli", "-q", "compress", str(model), "--compressor", "llm_pruner",
                        "--ratio", "0.2", "--calib", "tiny", "--calib-samples", "4", "--calib-seq-len", "64", *extra,
                        "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "gac_checkpoint.json").read_text())["plan"]["dims"]


def _export_q4k(ck: Path, out: Path, capsys) -> dict:
    from gac.cli import main

    rc = main(["-q", "export", str(ck), "--format", "gguf", "--quant", "q4_K", "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-2000:]
    return json.loads(cap.out)


def test_aligned_for_q4_k_has_no_fallback_tensor_and_unaligned_has(blocks_model, tmp_path, capsys):
    widths = {"unit 8": _compress(blocks_model, tmp_path / "u8"),
              "llama.cpp:q4_K": _compress(blocks_model, tmp_path / "q4k", "--unit", "llama.cpp:q4_K")}
    assert all(w % 256 for w in widths["unit 8"].values()), widths  # LLM-Pruner's ~820 channels: 8-aligned only
    assert all(w % 256 == 0 for w in widths["llama.cpp:q4_K"].values()), widths
    got = {k: _export_q4k(tmp_path / d, tmp_path / f"{d}.gguf", capsys)
           for k, d in (("unit 8", "u8"), ("llama.cpp:q4_K", "q4k"))}
    assert got["llama.cpp:q4_K"]["check"]["fallback"] == {}
    assert set(got["llama.cpp:q4_K"]["check"]["tensor_types"]) <= {"Q4_K", "Q6_K"}
    down = {f"blk.{k.split('.')[2]}.ffn_down.weight" for k in widths["unit 8"]}  # the pruned layers' down rows
    fallback = got["unit 8"]["check"]["fallback"]
    assert set(fallback) == down and all(f["block"] == 256 and f["type"] in ("q5_0", "q8_0", "f16")
                                           for f in fallback.values()), fallback
    print(f"q4_K: unit 8 widths {sorted(set(widths['unit 8'].values()))} -> {len(fallback)} fallback tensors, "
          f"{got['unit 8']['bytes']} bytes; llama.cpp:q4_K widths {sorted(set(widths['llama.cpp:q4_K'].values()))} "
          f"-> none, {got['llama.cpp:q4_K']['bytes']} bytes")

