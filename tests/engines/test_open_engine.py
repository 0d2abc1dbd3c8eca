"""gac.engines in the default tier (no engine package needed): the torch engine, and every refusal open_engine makes
before any work."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gac.engines import ENGINES, check_engine, engines_for, open_engine
from gac.errors import GacError


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)
    return GPT2LMHeadModel(cfg).eval()


def test_torch_engine_is_the_model_itself(tiny):
    model, tok = tiny
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    with open_engine("torch", model, tok, None, threads=1) as e:
        assert torch.get_num_threads() == 1
        d = e.describe()
        assert (d["name"], d["version"], d["threads"], d["dtype"]) == ("torch", torch.__version__, 1, "float32")
        with torch.no_grad():
            ref = model(input_ids=ids, use_cache=False).logits
        assert torch.equal(e.logits(ids), ref)
        assert torch.equal(e.prefill_call(ids)().logits, ref)
    assert torch.get_num_threads() == before


def test_unknown_engine_and_quant_are_refused():
    with pytest.raises(GacError, match="unknown engine 'vllm'.*onnxruntime"):
        check_engine("vllm")
    with pytest.raises(GacError, match="engine onnxruntime takes no quant"):
        check_engine("onnxruntime", quant="q4_0")
    with pytest.raises(GacError, match="q3"):
        check_engine("llama.cpp", quant="q3")


def test_a_model_an_engine_cannot_express_names_those_that_can():
    gpt2 = _gpt2()
    assert engines_for(gpt2) == ["torch", "onnxruntime"]
    with pytest.raises(GacError) as e:
        open_engine("llama.cpp", gpt2, None, "/nonexistent/never-made")
    msg = str(e.value)
    assert "engine llama.cpp cannot run this model" in msg and "'gpt2'" in msg
    assert msg.endswith("engines that can: torch, onnxruntime") and "\n" not in msg
    with pytest.raises(GacError, match="float32 graphs and the model is bfloat16; engines that can: torch$"):
        open_engine("onnxruntime", gpt2.to(torch.bfloat16), None, "/nonexistent/never-made")


@pytest.mark.parametrize("name, hidden", [("onnxruntime", ("onnx", "onnxscript", "onnxruntime")),
                                          ("llama.cpp", ("gguf", "llama_cpp"))])
def test_a_missing_engine_names_the_extra(name, hidden, tiny, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in hidden else real(n, *a))
    model, tok = tiny
    with pytest.raises(GacError) as e:
        open_engine(name, model, tok, tmp_path / "w")
    msg = str(e.value)
    assert msg.startswith(f"engine {name} needs ") and msg.endswith("pip install 'gac[engines]'")
    assert not (tmp_path / "w").exists()  # refused before any work


def test_engines_are_named_torch_first():
    assert ENGINES[0] == "torch" and set(ENGINES) == {"torch", "onnxruntime", "llama.cpp"}


def test_a_job_timing_a_family_llama_cpp_cannot_run_is_refused_before_loading(tmp_path):
    """``eval.engine=llama.cpp`` on a GPT-2 model: refused by the job's preflight from the model's config alone (it was
    refused at the latency stage, after loading, compressing, perplexity and tasks)."""
    from dataclasses import replace

    from gac.jobs.run.preflight import check_engine_runs_model

    from omegaconf import OmegaConf

    from gac.jobs.config.build import job_from_config
    from gac.jobs.config.command_line import compose_config

    model_dir = tmp_path / "gpt2"
    _gpt2().save_pretrained(model_dir)
    cfg = compose_config(["model=tiny", f"model.spec={model_dir}", "gpu=cpu", "eval=none", "compressor=none",
                          f"results_dir={tmp_path / 'r'}"])
    spec = job_from_config(OmegaConf.to_container(cfg, resolve=True)).spec
    with pytest.raises(GacError) as e:
        check_engine_runs_model(replace(spec, eval=replace(spec.eval, engine="llama.cpp", latency=True)))
    msg = str(e.value)
    assert msg.startswith("config: eval.engine=llama.cpp: engine llama.cpp cannot run this model") and "'gpt2'" in msg
    assert msg.endswith("engines that can: torch, onnxruntime; or eval.engine=torch") and "\n" not in msg
    check_engine_runs_model(replace(spec, eval=replace(spec.eval, engine="onnxruntime", latency=True)))  # can
