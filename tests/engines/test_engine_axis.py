"""The engine as an axis in the default tier (no engine package needed): eval.engine in a job's config, gac bench's
--engine, the bench's engine cells, the records' engine name, and Table 5's label of a non-torch latency."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from omegaconf import OmegaConf

from gac.errors import GacError
from gac.export.engines import NEEDS
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import job_from_config

QUICK = ["model=tiny", "gpu=cpu", "eval=quick", "eval.ppl=false", "eval.tasks=[]", "seq_len=64",
         "eval.latency_seq_lens=[64]", "calibration.n_samples=4", "calibration.seq_len=128"]


def _job(tmp_path, *overrides):
    cfg = OmegaConf.to_container(compose_config([*QUICK, f"results_dir={tmp_path / 'r'}", *overrides]), resolve=True)
    return job_from_config(cfg).spec


_REAL_SPEC = importlib.util.find_spec
_ENGINE_MODULES = {mod for needs in NEEDS.values() for mod, _ in needs}  # what the engines import, from their one list


@pytest.fixture
def engines_present(monkeypatch):
    """The engines' packages seen as installed (CI's default tier has none): the config's checks, not the packages."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n in _ENGINE_MODULES else _REAL_SPEC(n, *a))


def test_eval_engine_defaults_to_torch_and_keeps_the_keys(tmp_path, engines_present):
    plain = _job(tmp_path, "compressor=llm_pruner")
    assert plain.eval.engine == "torch"
    assert _job(tmp_path, "compressor=llm_pruner", "eval.engine=torch").key == plain.key
    assert "engine" not in plain.identity()["eval"]
    onnx = _job(tmp_path, "compressor=llm_pruner", "eval.engine=onnxruntime")
    assert onnx.key != plain.key and onnx.identity()["eval"]["engine"] == "onnxruntime"


@pytest.mark.parametrize("overrides, message", [
    (["eval.engine=vllm"], "config: eval.engine: unknown engine 'vllm'"),
    (["compressor=asvd", "eval.engine=llama.cpp"],
     "config: eval.engine=llama.cpp cannot time this job: compressor asvd leaves low-rank factors"),
    (["eval.engine=onnxruntime", "eval.decode_tokens=4"],
     "config: eval.engine=onnxruntime cannot time this job: decode latency is timed in PyTorch only"),
    (["eval.engine=onnxruntime", "gpu.dtype=bfloat16"],
     "config: eval.engine=onnxruntime cannot time this job: its CPU provider runs float32 graphs and the job runs in "
     "bfloat16: set gpu.dtype=float32, or eval.engine=torch"),
])
def test_eval_engine_refusals(tmp_path, overrides, message):
    with pytest.raises(GacError) as e:
        _job(tmp_path, *overrides)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_missing_engine_is_refused_in_the_config(tmp_path, monkeypatch):
    # every engine module hidden: the same message whether or not this Python has the engines extra
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in _ENGINE_MODULES else _REAL_SPEC(n, *a))
    with pytest.raises(GacError, match=r"^config: eval.engine=onnxruntime: engine onnxruntime needs onnx, onnxscript, "
                                       r"onnxruntime, which are not installed here; pip install 'gac\[engines\]'$"):
        _job(tmp_path, "eval.engine=onnxruntime")
    _job(tmp_path, "eval.engine=onnxruntime", "eval.latency=false")  # nothing timed: the packages are not needed


def test_eval_engine_is_an_axis_of_the_latency_settings(tmp_path):
    from gac.jobs.config.axes import axis_of, why_unused

    axis = axis_of("eval.engine")
    assert axis is not None and "eval.latency_seq_lens" in axis.keys
    spec = _job(tmp_path, "eval.latency=false")
    assert "no latency is measured" in why_unused(axis, spec, {})
    assert why_unused(axis, _job(tmp_path), {}) is None


def test_bench_engines_from_flags_and_config():
    from gac.jobs.bench.store_bench import engine_list

    assert engine_list([]) == ("torch",)
    assert engine_list(["torch,onnxruntime", "llama.cpp", "torch"]) == ("torch", "onnxruntime", "llama.cpp")
    assert engine_list("onnxruntime") == ("onnxruntime",)
    with pytest.raises(GacError, match="--engine: unknown engine 'ort'"):
        engine_list(["torch,ort"])
    from gac.jobs.bench.store_bench import compose_bench

    assert compose_bench([])["engine"] == "torch"
    assert engine_list(compose_bench(["engine=[torch,llama.cpp]"])["engine"]) == ("torch", "llama.cpp")


def test_the_bench_protocol_refuses_what_an_engine_cannot_time():
    from gac.evaluation.bench import Protocol

    with pytest.raises(GacError, match="engine onnxruntime runs on the CPU here; bench it with --device cpu"):
        Protocol(engines=("torch", "onnxruntime")).resolved("cuda")
    with pytest.raises(GacError, match="decode is timed in PyTorch only; engine llama.cpp measures prefill"):
        Protocol(engines=("llama.cpp",), decode_tokens=4).resolved("cpu")
    with pytest.raises(GacError, match="distinct engines"):
        Protocol(engines=("torch", "torch")).resolved("cpu")
    assert Protocol().resolved("cpu")["engines"] == ("torch",)


def _variants():
    from gac.compression.structure import Structure, architecture
    from gac.evaluation.bench import Variant

    config = architecture("tiny")
    dims = {f"model.layers.{i}.mlp": 500 for i in range(3)}
    return [Variant("Baseline", Structure(config, "float32")),
            Variant("LLM-Pruner", Structure(config, "float32", "llm_pruner", {}, dims)),
            Variant("LLM-Pruner (GAC)", Structure(config, "float32", "llm_pruner", {}, {k: 512 for k in dims}),
                    sibling="LLM-Pruner")]


def test_engine_cells_share_the_shuffled_rounds():
    """Two engines as an axis: the second here is PyTorch again, opened through gac.engines under another name (the
    engines' own packages are the engines tier's); every cell is visited once per round, each engine compared with
    its own baseline and with the first engine, paired over the same rounds."""
    import gac.evaluation.bench as B
    from gac.engines import open_engine
    from gac.evaluation.bench_format import format_bench

    opened = []

    def opener(name, model, tokenizer, workdir, threads=None, quant=None):
        opened.append((name, threads))
        return open_engine("torch", model, tokenizer, workdir, threads=threads)

    doc = B.run_bench(_variants(), B.Protocol(points=((1, 16),), rounds=3, warmup=0, iters=1, profile=False,
                                              engines=("torch", "onnxruntime")), "cpu", open_engine=opener)
    assert opened == [("onnxruntime", 1)] * 3
    assert doc["protocol"]["engines"] == ["torch", "onnxruntime"]
    assert doc["engine"] == {"name": "torch", "version": torch.__version__, "threads": 1}
    axis = doc["engine_axis"]
    assert [a["engine"]["name"] for a in axis] == ["torch", "torch"]  # the double describes itself truthfully
    assert axis[0]["variants"] == doc["variants"]
    for v in axis[1]["variants"]:
        e = v["points"]["prefill_ms@16"]
        assert len(e["samples_ms"]) == 3 and e["engine_compared"] == "torch"
        lo, hi = e["ratio_to_engine_ci95"]
        assert lo <= e["ratio_to_engine"] <= hi
    text = format_bench(doc)
    assert "Engines (an axis of the rounds" in text and "prefill, batch 1, S=16, torch:" in text
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("prefill, batch 1, S=16")]
    assert len(heads) == 2 and "vs torch" not in lines[heads[0] + 1] and "vs torch" in lines[heads[1] + 1]
    with pytest.raises(GacError, match="need a way to open them"):
        B.run_bench(_variants(), B.Protocol(points=((1, 16),), rounds=2, engines=("onnxruntime",)), "cpu")


def test_a_torch_only_bench_reads_as_before():
    from gac.evaluation.bench import Protocol, run_bench
    from gac.evaluation.bench_format import format_bench

    doc = run_bench(_variants()[:2], Protocol(points=((1, 16),), rounds=2, warmup=0, iters=1, profile=False), "cpu")
    assert "engine_axis" not in doc and doc["engine"]["name"] == "torch"
    text = format_bench(doc)
    assert "Engine" not in text and "prefill, batch 1, S=16:" in text and "vs torch" not in text


def test_a_job_latency_names_its_engine(tiny):
    from gac.engines import open_engine
    from gac.evaluation import prefill_latency

    model, tok = tiny
    plain = prefill_latency(model, batch=1, seq_len=16, warmup=0, iters=1, trials=1, detect_backend=False)
    assert plain["engine"] == {"name": "torch", "version": torch.__version__}
    with open_engine("torch", model, tok, None) as e:
        via = prefill_latency(model, batch=1, seq_len=16, warmup=0, iters=1, trials=1, engine=e)
    assert via["engine"]["name"] == "torch" and via["engine"]["threads"] == torch.get_num_threads()


def test_table5_names_a_latency_measured_in_another_engine(tmp_path):
    from gac.analysis import load_results, table5
    from tests.analysis.conftest import STORE

    plain = table5(load_results(STORE), ratio=0.15)
    assert "Prefill (ms)" in plain.columns and "in onnxruntime" not in plain.attrs["caption"]
    import shutil

    store = tmp_path / "store"
    shutil.copytree(STORE, store)
    for f in (store / "records").glob("*.json"):
        rec = json.loads(f.read_text())
        rec["config"].setdefault("eval", {})["engine"] = "onnxruntime"
        f.write_text(json.dumps(rec))
    t = table5(load_results(store), ratio=0.15)
    assert list(t.columns) == [("Prefill (ms), onnxruntime" if c == "Prefill (ms)" else c) for c in plain.columns]
    assert t["Prefill (ms), onnxruntime"].equals(plain["Prefill (ms)"].rename("Prefill (ms), onnxruntime"))
    assert t.attrs["caption"].endswith("; latency measured in onnxruntime, not PyTorch eager)")
    assert t.attrs["formats"]["Prefill (ms), onnxruntime"] == "{:.1f}"
