"""An engine at a type (``llama.cpp:q4_K``) in the default tier, no engine package needed (their modules are hidden,
as CI's default tier has none): the one table of types and its one parser, ``gac bench --engine`` and a job's
``eval.engine`` reading it, the refusals made before any model loads, the keys that must not change, and the labels
(the bench table, a bench's summary, Table 5's column). The real llama.cpp at a quantized type is the engines
tier's (tests/engines/test_engines_run.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from gac.align.engine_types import ENGINE_TYPES, LLAMA_CPP_TYPES, canonical_engine, engine_spec, parse_engine
from gac.errors import GacError
from gac.export.engines import NEEDS

_REAL_SPEC = importlib.util.find_spec
_ENGINE_MODULES = {mod for needs in NEEDS.values() for mod, _ in needs}  # what the engines import, from their one list


@pytest.fixture
def engines_hidden(monkeypatch):
    """Every engine module hidden: a refusal reads the same with or without the engines extra installed."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in _ENGINE_MODULES else _REAL_SPEC(n, *a))


@pytest.fixture
def engines_present(monkeypatch):
    """The engines' packages seen as installed: the config's own checks, not the packages."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n in _ENGINE_MODULES else _REAL_SPEC(n, *a))


# ------------------------------------------------------------------------------------------- the table and parser
def test_one_table_of_types_for_engines_units_and_export():
    from gac.align.candidates import ENGINE_UNITS, LLAMA_CPP_BLOCKS
    from gac.engines import ENGINES
    from gac.export.expressible import GGUF_TYPES, UNQUANTIZED

    assert ENGINES == tuple(ENGINE_TYPES) and ENGINES[0] == "torch"
    assert tuple(GGUF_TYPES) == ENGINE_TYPES["llama.cpp"] == tuple(LLAMA_CPP_TYPES)
    assert UNQUANTIZED == ("f32", "f16") and ENGINE_TYPES["llama.cpp"][0] == "f32"  # the default first
    assert set(LLAMA_CPP_BLOCKS) == set(GGUF_TYPES) - set(UNQUANTIZED)
    assert set(ENGINE_UNITS) == {f"llama.cpp:{t}" for t in LLAMA_CPP_BLOCKS}
    assert ENGINE_TYPES["torch"] == ENGINE_TYPES["onnxruntime"] == ()


@pytest.mark.parametrize("text, parsed, spelled", [
    ("torch", ("torch", None), "torch"), ("onnxruntime", ("onnxruntime", None), "onnxruntime"),
    ("llama.cpp", ("llama.cpp", None), "llama.cpp"), ("llama.cpp:f32", ("llama.cpp", "f32"), "llama.cpp"),
    ("llama.cpp:F32", ("llama.cpp", "f32"), "llama.cpp"), (" LLAMA.CPP:Q4_K ", ("llama.cpp", "q4_K"), "llama.cpp:q4_K"),
    ("llama.cpp:q8_0", ("llama.cpp", "q8_0"), "llama.cpp:q8_0"), ("llama.cpp:f16", ("llama.cpp", "f16"), "llama.cpp:f16"),
])
def test_an_engine_and_its_type_are_read_and_spelled_once(text, parsed, spelled):
    assert parse_engine(text) == parsed
    assert canonical_engine(text) == spelled == engine_spec(*parsed)


@pytest.mark.parametrize("text, message", [
    ("onnxruntime:q4_K", r"^engine onnxruntime takes no type \(got 'onnxruntime:q4_K'\).*give onnxruntime alone, "
                         r"or a typed engine: llama.cpp:f32, llama.cpp:f16, llama.cpp:q8_0, .*llama.cpp:q4_K"),
    ("torch:q8_0", r"^engine torch takes no type \(got 'torch:q8_0'\).*a typed engine: llama.cpp:f32"),
    ("llama.cpp:q3_0", r"^unknown llama.cpp type 'q3_0'.*llama.cpp's types: f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                       r"q4_K, q5_K, q6_K$"),
    ("llama.cpp:q4_K_M", r"did you mean 'q4_K'"),
    ("llama.cpp:", r"names no type after ':'"),
    ("vllm:fp8", r"^unknown engine 'vllm'"),
])
def test_a_bad_engine_or_type_is_one_line_naming_the_valid_ones(text, message):
    with pytest.raises(GacError, match=message) as e:
        parse_engine(text)
    assert "\n" not in str(e.value)


def test_open_engine_takes_the_type_in_the_name(tiny):
    from gac.engines import check_engine, open_engine

    assert check_engine("llama.cpp:Q8_0", packages=False) == "q8_0"
    assert check_engine("llama.cpp", packages=False) == "f32"
    assert check_engine("llama.cpp:q4_0", quant="Q4_0", packages=False) == "q4_0"  # the same type, given twice
    with pytest.raises(GacError, match="is given the type 'q8_0' beside it; give the type once"):
        check_engine("llama.cpp:q4_0", quant="q8_0", packages=False)
    model, tok = tiny
    with pytest.raises(GacError, match="engine onnxruntime takes no type"):
        open_engine("onnxruntime:q4_K", model, tok, "/nonexistent/never-made")


# ------------------------------------------------------------------------------------------------------ the bench
def test_bench_engines_read_types():
    from gac.jobs.bench.store_bench import compose_bench, engine_list

    assert engine_list(["llama.cpp,llama.cpp:Q4_K", "llama.cpp:f32", "torch"]) == ("llama.cpp", "llama.cpp:q4_K",
                                                                                    "torch")
    assert engine_list(compose_bench(["engine=[torch,llama.cpp:q8_0]"])["engine"]) == ("torch", "llama.cpp:q8_0")
    with pytest.raises(GacError, match=r"^--engine: engine onnxruntime takes no type"):
        engine_list(["torch,onnxruntime:q4_K"])


@pytest.mark.parametrize("engine, message", [
    ("onnxruntime:q4_K", "--engine: engine onnxruntime takes no type (got 'onnxruntime:q4_K')"),
    ("torch:q8_0", "--engine: engine torch takes no type (got 'torch:q8_0')"),
    ("llama.cpp:q3_0", "--engine: unknown llama.cpp type 'q3_0'"),
])
def test_bench_refuses_a_bad_type_before_anything_is_built(engine, message, tmp_path, monkeypatch, capsys,
                                                           engines_hidden):
    """Exit 2, one line naming the valid types, before the plan is read or any model built (the engines not even
    installed: the name is checked first)."""
    import gac.jobs.bench.store_bench as SB
    from gac.cli import main

    def never(*a, **k):
        raise AssertionError("a variant was built before the engine was checked")

    monkeypatch.setattr(SB, "plan_variants", never)
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"dims": {"model.layers.0.mlp": 512}}))
    rc = main(["bench", "--plan", str(plan), "--model", "tiny", "--compressor", "llm_pruner", "--engine", engine])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert "llama.cpp:q4_K" in err[0] or "q4_K" in err[0]  # the valid ones are named


def test_a_typed_engine_is_a_cell_and_its_label(monkeypatch):
    """llama.cpp at f32 and at q4_K as an axis of one bench: each cell is opened with its type, and the table names
    the typed one ``llama.cpp:q4_K`` (headings and 'vs' columns) and the f32 one plainly. The engines here are
    gac's torch engine describing itself as the llama.cpp it stands in for (the real one is the engines tier's)."""
    import gac.evaluation.bench as B
    from gac.engines import open_engine
    from gac.engines.eager import TorchEngine
    from gac.evaluation.bench_format import format_bench
    from tests.engines.test_engine_axis import _variants

    opened = []

    def opener(name, model, tokenizer, workdir, threads=None, quant=None):
        opened.append(name)
        eng = open_engine("torch", model, tokenizer, workdir, threads=threads)
        engine, qtype = parse_engine(name)
        real = TorchEngine.describe(eng)
        monkeypatch.setattr(eng, "describe", lambda: {**real, "name": engine, "version": "double",
                                                      "quant": qtype or "f32"})
        return eng

    doc = B.run_bench(_variants(), B.Protocol(points=((1, 16),), rounds=2, warmup=0, iters=1, profile=False,
                                              engines=("llama.cpp", "llama.cpp:q4_K")), "cpu", open_engine=opener)
    assert opened == ["llama.cpp"] * 3 + ["llama.cpp:q4_K"] * 3
    assert doc["protocol"]["engines"] == ["llama.cpp", "llama.cpp:q4_K"]
    assert [(a["engine"]["name"], a["engine"]["quant"]) for a in doc["engine_axis"]] == [("llama.cpp", "f32"),
                                                                                         ("llama.cpp", "q4_K")]
    assert doc["engine_axis"][1]["variants"][1]["points"]["prefill_ms@16"]["engine_compared"] == "llama.cpp"
    text = format_bench(doc)
    assert "prefill, batch 1, S=16, llama.cpp:" in text and "prefill, batch 1, S=16, llama.cpp:q4_K:" in text
    assert "and against llama.cpp in 'vs llama.cpp'" in text and "llama.cpp double, 1 thread, q4_K" in text
    lines = text.splitlines()
    typed = lines.index("prefill, batch 1, S=16, llama.cpp:q4_K:")
    assert "vs llama.cpp" in lines[typed + 1]


def test_a_bench_summary_and_table5_name_the_type(tmp_path):
    import shutil

    from gac.analysis import load_results, table5
    from gac.analysis.load import bench_summary
    from tests.analysis.conftest import STORE

    assert bench_summary({"engine": {"name": "llama.cpp", "quant": "q4_K"}})["engine"] == "llama.cpp:q4_K"
    assert bench_summary({"engine": {"name": "llama.cpp", "quant": "f32"}})["engine"] == "llama.cpp"
    assert bench_summary({})["engine"] == "torch"  # a bench from before engines
    plain = table5(load_results(STORE), ratio=0.15)
    store = tmp_path / "store"
    shutil.copytree(STORE, store)
    for f in (store / "records").glob("*.json"):
        rec = json.loads(f.read_text())
        rec["config"].setdefault("eval", {})["engine"] = "llama.cpp:Q4_K"  # as a user may have typed it
        f.write_text(json.dumps(rec))
    t = table5(load_results(store), ratio=0.15)
    col = "Prefill (ms), llama.cpp:q4_K"
    assert list(t.columns) == [(col if c == "Prefill (ms)" else c) for c in plain.columns]
    assert t.attrs["caption"].endswith("; latency measured in llama.cpp:q4_K, not PyTorch eager)")


# ------------------------------------------------------------------------------------------------------ a job
def _job(tmp_path, *overrides):
    from tests.engines.test_engine_axis import _job as job

    return job(tmp_path, *overrides)


def test_eval_engine_takes_a_type_and_the_keys_stay(tmp_path, engines_present):
    f32 = _job(tmp_path, "compressor=llm_pruner", "eval.engine=llama.cpp")
    assert f32.identity()["eval"]["engine"] == "llama.cpp"  # the key llama.cpp jobs had before types
    for same in ("llama.cpp:f32", "LLAMA.CPP:F32"):
        spec = _job(tmp_path, "compressor=llm_pruner", f"eval.engine={same}")
        assert spec.eval.engine == "llama.cpp" and spec.key == f32.key
    q = _job(tmp_path, "compressor=llm_pruner", "eval.engine=llama.cpp:Q8_0")
    assert q.eval.engine == "llama.cpp:q8_0" and q.identity()["eval"]["engine"] == "llama.cpp:q8_0"
    assert len({q.key, f32.key, _job(tmp_path, "compressor=llm_pruner", "eval.engine=llama.cpp:q4_0").key}) == 3
    torch_spec = _job(tmp_path, "compressor=llm_pruner")
    assert "engine" not in torch_spec.identity()["eval"]
    assert _job(tmp_path, "compressor=llm_pruner", "eval.engine=Torch").key == torch_spec.key


@pytest.mark.parametrize("engine, message", [
    ("onnxruntime:q4_K", "config: eval.engine: engine onnxruntime takes no type (got 'onnxruntime:q4_K')"),
    ("torch:q8_0", "config: eval.engine: engine torch takes no type (got 'torch:q8_0')"),
    ("llama.cpp:q3_0", "config: eval.engine: unknown llama.cpp type 'q3_0'"),
])
def test_eval_engine_refuses_a_bad_type_in_one_line(engine, message, tmp_path, engines_hidden):
    with pytest.raises(GacError) as e:
        _job(tmp_path, f"eval.engine={engine}")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert "q4_K" in str(e.value)  # the valid types are named


def test_a_typed_engine_missing_its_packages_names_the_extra(tmp_path, engines_hidden):
    with pytest.raises(GacError, match=r"^config: eval.engine=llama.cpp:q8_0: engine llama.cpp needs gguf, "
                                       r"llama-cpp-python.*pip install 'gac\[engines\]'$"):
        _job(tmp_path, "compressor=llm_pruner", "eval.engine=llama.cpp:q8_0")


def test_the_latency_stage_opens_the_typed_engine(tiny):
    """A job's latency stage passes eval.engine as it is spelled to open_engine, and the result names the engine
    that timed it as the engine describes itself (its type included)."""
    from gac.evaluation.suite import evaluate

    model, tok = tiny
    seen = []

    def opener(name, model, tokenizer, workdir, threads=None, quant=None):
        from gac.engines import open_engine

        seen.append(name)
        eng = open_engine("torch", model, tokenizer, workdir, threads=threads)
        eng.name, eng.quant = "llama.cpp", parse_engine(name)[1]
        return eng

    out = evaluate(model, tok, latency_points=[(1, 16)], main_point=(1, 16), warmup=0, iters=1, trials=1,
                   engine="llama.cpp:q8_0", open_engine=opener)
    assert seen == ["llama.cpp:q8_0"]
    e = out["latency"]["prefill_ms@16"]["engine"]
    assert (e["name"], e["quant"]) == ("llama.cpp", "q8_0") and e["version"] == torch.__version__
