"""The engines run for real (marker ``engines``: needs ``pip install 'gac[engines]'``; .ci/run runs it): onnxruntime and
llama.cpp give tiny's logits (and an LLM-Pruner-shaped tiny's: llama.cpp's per-layer ``deci`` layout), a bench with
the engine axis prints its table with intervals, and a job's record names the engine that timed it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from gac.engines import open_engine

pytestmark = pytest.mark.engines


def _pruned(width: int = 500):
    """tiny with every MLP cut to its first ``width`` channels (what LLM-Pruner leaves), in memory."""
    from gac.compression.parts import linear_from
    from gac.compression.swap import replace_module
    from gac.models import load_model

    model, tok = load_model("tiny", dtype=torch.float32)
    for i, layer in enumerate(model.model.layers):
        mlp, p = layer.mlp, f"model.layers.{i}.mlp."
        replace_module(model, p + "gate_proj", linear_from(mlp.gate_proj.weight[:width].detach().clone(), None))
        replace_module(model, p + "up_proj", linear_from(mlp.up_proj.weight[:width].detach().clone(), None))
        replace_module(model, p + "down_proj", linear_from(mlp.down_proj.weight[:, :width].detach().contiguous(), None))
    return model.eval(), tok


def _rel(got, ref) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max())


def test_onnxruntime_gives_torchs_logits(tiny, tmp_path):
    import onnxruntime

    model, tok = tiny
    ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(1))
    ref = open_engine("torch", model, tok, None).logits(ids)
    with open_engine("onnxruntime", model, tok, tmp_path, threads=1) as e:
        assert e.describe() == {"name": "onnxruntime", "version": onnxruntime.__version__, "threads": 1,
                                "quant": None, "dtype": "float32", "provider": "CPUExecutionProvider"}
        got = e.logits(ids)
        assert got.shape == ref.shape and _rel(got, ref) < 1e-4
        out = e.prefill_call(ids)()
        assert out[0].shape == tuple(ref.shape)


def test_llama_cpp_gives_torchs_logits_on_per_layer_widths(tmp_path):
    import llama_cpp

    from gac.export.gguf import GGUF_TOLERANCE

    model, tok = _pruned()
    ids = torch.randint(0, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
    with open_engine("llama.cpp", model, tok, tmp_path / "f32", threads=1) as e:
        d = e.describe()
        assert (d["name"], d["version"], d["quant"], d["fallback_tensors"]) == \
            ("llama.cpp", llama_cpp.__version__, "f32", 0)
        assert _rel(e.logits(ids), ref) < GGUF_TOLERANCE["f32"]
    with open_engine("llama.cpp", model, tok, tmp_path / "q8", threads=1, quant="q8_0") as e:
        # 500 columns are not whole blocks of 32: llama.cpp's quantizer stores the down projections in another type
        assert e.describe()["fallback_tensors"] == len(model.model.layers)
        got = e.logits(ids)
        assert got.shape == ref.shape and torch.isfinite(got).all()


def test_the_engine_counts_the_fallback_tensors_gac_export_does(tiny, tmp_path):
    """A random Llama of width 320 (not whole blocks of 256) at q4_K: every matrix with rows of 320 falls back, the
    tied embedding (llama.cpp's output matrix) without a word in the quantizer's log; the engine reads the same
    tensors from its file as the export does from its own."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gac.export.expressible import Source, gguf_layout
    from gac.export.write import export

    tok = tiny[1]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=320, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=5, num_key_value_heads=5, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    src = Source("a random Llama", "memory", model.config, model)
    summary = export(src, model, tok, "gguf", gguf_layout(src), tmp_path / "m.gguf", quant="q4_K")
    fallback = summary["check"]["fallback"]
    # q, k, v, o, gate and up of each layer (rows of 320) and the embedding; the down projections' 512 are whole
    assert set(fallback) == {"token_embd.weight"} | {f"blk.{i}.{m}.weight" for i in range(2) for m in (
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")}, sorted(fallback)
    with open_engine("llama.cpp", model, tok, tmp_path / "engine", threads=1, quant="q4_K") as e:
        assert e.describe()["fallback_tensors"] == len(fallback) == 13
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == ["model-q4_K.gguf"]  # its f32 input removed


def test_a_bench_with_the_engine_axis(tmp_path, capsys):
    from gac.cli import main

    plan = tmp_path / "pruned.json"
    plan.write_text(json.dumps({"dims": {f"model.layers.{i}.mlp": 500 for i in range(3)}}))
    out = tmp_path / "bench.json"
    rc = main(["-q", "bench", "--plan", str(plan), "--model", "tiny", "--compressor", "llm_pruner",
               "--engine", "torch,onnxruntime", "--engine", "llama.cpp", "--point", "16", "--rounds", "3",
               "--warmup", "0", "--iters", "1", "--no-profile", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "Engines (an axis of the rounds" in text
    for name in ("torch", "onnxruntime", "llama.cpp"):
        assert f"prefill, batch 1, S=16, {name}:" in text
    assert text.count("vs torch") == 2 + 1  # two engines' columns, and the header line naming the comparison
    doc = json.loads(out.read_text())
    import llama_cpp
    import onnxruntime

    assert [(a["engine"]["name"], a["engine"]["version"]) for a in doc["engine_axis"]] == [
        ("torch", torch.__version__), ("onnxruntime", onnxruntime.__version__), ("llama.cpp", llama_cpp.__version__)]
    for a in doc["engine_axis"][1:]:
        e = a["variants"][1]["points"]["prefill_ms@16"]
        assert e["ratio_to_engine_ci95"][0] <= e["ratio_to_engine"] <= e["ratio_to_engine_ci95"][1]
        assert e["ratio_ci95"][0] <= e["ratio_to_baseline"] <= e["ratio_ci95"][1]


def _job_record(tmp_path, engine: str) -> dict:
    """The record of tiny's baseline job with its latency timed by ``eval.engine=engine``."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "experiments/run.py", "model=tiny", "gpu=cpu", "compressor=none", "eval=quick",
                        "eval.ppl=false", "eval.tasks=[]", "seq_len=32", "eval.latency_seq_lens=[32]",
                        f"eval.engine={engine}", f"results_dir={tmp_path / 'r'}"],
                       cwd=root, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "r" / "records").glob("*.json")]
    return rec


def test_a_job_record_names_its_engine(tmp_path):
    import llama_cpp

    rec = _job_record(tmp_path, "llama.cpp")
    lat = rec["evaluation"]["latency"]["prefill_ms@32"]
    assert lat["engine"]["name"] == "llama.cpp" and lat["engine"]["version"] == llama_cpp.__version__
    assert rec["metrics"]["prefill_ms"] == lat["median_ms"] > 0


def test_a_bench_cell_at_a_quantized_type(tmp_path, capsys):
    """``--engine llama.cpp:q8_0``: every variant quantized by llama.cpp's own quantizer and timed in llama.cpp; the
    bench JSON and the table name the type."""
    import llama_cpp

    from gac.cli import main

    plan = tmp_path / "pruned.json"
    plan.write_text(json.dumps({"dims": {f"model.layers.{i}.mlp": 512 for i in range(3)}}))
    out = tmp_path / "bench.json"
    rc = main(["-q", "bench", "--plan", str(plan), "--model", "tiny", "--compressor", "llm_pruner",
               "--engine", "llama.cpp:Q8_0", "--point", "16", "--rounds", "2", "--warmup", "0", "--iters", "1",
               "--no-profile", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "prefill, batch 1, S=16, llama.cpp:q8_0:" in text and ", q8_0." in text
    doc = json.loads(out.read_text())
    assert doc["protocol"]["engines"] == ["llama.cpp:q8_0"]
    e = doc["engine"]
    assert (e["name"], e["version"], e["quant"]) == ("llama.cpp", llama_cpp.__version__, "q8_0")
    assert e["fallback_tensors"] >= 1  # the baseline's: tiny's MLP width 688 is not whole blocks of 32
    for v in doc["variants"]:
        assert v["points"]["prefill_ms@16"]["median_ms"] > 0


def test_a_job_record_names_its_engines_type(tmp_path):
    import llama_cpp

    rec = _job_record(tmp_path, "llama.cpp:q4_0")
    assert rec["config"]["eval"]["engine"] == "llama.cpp:q4_0"
    e = rec["evaluation"]["latency"]["prefill_ms@32"]["engine"]
    assert (e["name"], e["version"], e["quant"]) == ("llama.cpp", llama_cpp.__version__, "q4_0")
    assert rec["metrics"]["prefill_ms"] > 0
