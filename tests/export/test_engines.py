"""``gac export`` run in the engines (marker ``engines``: needs ``pip install 'gac[engines]'``; .ci/run runs it).

* ONNX: every compressor's checkpoint of tiny, an LLM-Pruner checkpoint of every family's layout model (random
  weights, tests/compression/test_families.py's configs) and low-rank ones of the fused layouts (split parts),
  exported, then run here in onnxruntime on a shape the export never saw: float32 logits within 1e-4 of gac's
  (relative to the largest logit).
  A graph whose weights sit beside it (``OUT.data``) runs from there, and an inline export over it removes that file.
* GGUF: tiny's LLM-Pruner checkpoint (per-layer widths: llama.cpp's ``deci``) and a uniform one (``llama``) in f32
  and f16, run here in llama.cpp: logits within f16 rounding of gac's; q8_0 and q4_K run and are reported (their
  fallback tensors included).
* Hugging Face: a uniform-width checkpoint loaded here by transformers in a Python where gac cannot be imported.

The tier's time is printed at its end (the load beside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.engines
ROOT = Path(__file__).resolve().parents[2]
COMPRESSORS = ("asvd", "svd_llm", "llm_pruner", "palu", "stable_rank_svd")


@pytest.fixture(scope="module", autouse=True)
def tier_time(request):
    from tests.export.conftest import TIER_TIMES

    t0 = time.perf_counter()
    yield
    TIER_TIMES[request.module.__name__] = (time.perf_counter() - t0, os.getloadavg()[0])


class _Checkpoints(dict):
    """Every compressor's checkpoint of tiny, made by ``gac compress`` (a small calibration) when a test first asks
    for it; ``uniform``: tiny with every MLP pruned to 512 channels."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, c: str) -> Path:
        if c == "uniform":
            from tests.bad_input_fixtures_export import pruned_checkpoint

            self[c] = pruned_checkpoint(self.root / c, (0, 1, 2, 3))
            return self[c]
        extra = {"asvd": ["--allocation", "proportional"]}.get(c, [])  # ASVD's sensitivity search: hours
        calib = [] if c == "stable_rank_svd" else ["--calib-samples", "4", "--calib-seq-len", "64"]  # data-free
        r = subprocess.run([sys.executable, "-m", "gac.cli", "-q", "compress", "tiny", "--compressor", c, "--ratio",
                            "0.2", *calib, *extra, "-o", str(self.root / c)],
                           cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (c, r.stderr[-2000:])
        self[c] = self.root / c
        return self[c]


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    return _Checkpoints(tmp_path_factory.mktemp("engines"))


def _export(capsys, ck, fmt, out, *extra) -> dict:
    from gac.cli import main

    rc = main(["-q", "export", str(ck), "--format", fmt, "-o", str(out), *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-2000:]
    assert out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    return json.loads(cap.out)


def _gac_logits(ck, ids: torch.Tensor) -> np.ndarray:
    from gac.models import load_model

    model, _ = load_model(str(ck), dtype="float32")
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float().numpy()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _onnx_logits(path: Path, ids: torch.Tensor) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input_ids"]
    assert [str(d) for d in sess.get_inputs()[0].shape] == ["batch", "sequence"]  # both axes dynamic
    return sess.run(["logits"], {"input_ids": ids.numpy()})[0]


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_onnx_of_every_compressors_tiny_checkpoint(compressor, tiny_checkpoints, tmp_path, capsys):
    ck = tiny_checkpoints[compressor]
    summary = _export(capsys, ck, "onnx", tmp_path / "m.onnx")
    assert summary["check"]["engine"] == "onnxruntime" and summary["check"]["max_rel_diff"] <= 1e-4
    ids = torch.randint(0, 4096, (2, 33), generator=torch.Generator().manual_seed(11))
    rel = _rel(_onnx_logits(tmp_path / "m.onnx", ids), _gac_logits(ck, ids))
    print(f"onnx {compressor}: max rel diff {rel:.2e}")
    assert rel <= 1e-4


def test_an_onnx_side_file_goes_with_its_graph(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    """The weights beside the graph (as a model above 1.5 GiB keeps them) run in onnxruntime from ``OUT.data``; an
    inline export over it with --force removes that file."""
    import gac.export.onnx as onnx

    ck, out = tiny_checkpoints["uniform"], tmp_path / "m.onnx"
    ids = torch.randint(0, 4096, (2, 9), generator=torch.Generator().manual_seed(12))
    limit = onnx.INLINE_LIMIT
    monkeypatch.setattr(onnx, "INLINE_LIMIT", 0)
    side = _export(capsys, ck, "onnx", out)
    assert onnx.data_file(out).stat().st_size > out.stat().st_size and side["bytes"] > out.stat().st_size
    assert _rel(_onnx_logits(out, ids), _gac_logits(ck, ids)) <= 1e-4
    monkeypatch.setattr(onnx, "INLINE_LIMIT", limit)
    _export(capsys, ck, "onnx", out, "--force")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    assert _rel(_onnx_logits(out, ids), _gac_logits(ck, ids)) <= 1e-4


def _family_cases():
    """LLM-Pruner on every family's layout model (pruned widths, shared expert widths); a low-rank compressor on the
    fused layouts, whose compressed roles become ``SplitLinear`` parts."""
    from tests.compression.test_families import TYPES

    return [(t, "llm_pruner") for t in TYPES] + [("phi3", "palu"), ("gpt_neox", "asvd"), ("gpt2", "svd_llm")]


@pytest.mark.parametrize("model_type,compressor", _family_cases())
def test_onnx_of_every_familys_layout_model(model_type, compressor, tmp_path, capsys):
    import copy

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.compress import compress_model
    from tests.compression.test_families import V, _calib, family_model

    m = family_model(model_type)
    alloc = "proportional" if compressor == "asvd" else None
    cm, _, _ = compress_model(copy.deepcopy(m), None, compressor, ratio=0.3, calib_ids=_calib(), unit=8,
                              allocation=alloc)
    ck = save_checkpoint(cm, None, tmp_path / "ck")
    summary = _export(capsys, ck, "onnx", tmp_path / "m.onnx")
    assert summary["check"]["max_rel_diff"] <= 1e-4
    ids = torch.randint(0, V, (2, 21), generator=torch.Generator().manual_seed(12))
    rel = _rel(_onnx_logits(tmp_path / "m.onnx", ids), _gac_logits(ck, ids))
    print(f"onnx {model_type} {compressor}: max rel diff {rel:.2e}")
    assert rel <= 1e-4


def _llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    import llama_cpp

    f32 = llama_cpp.GGML_TYPE_F32  # KV cache in f32, as the export's own check
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=len(ids), logits_all=True, n_threads=2,
                          verbose=False, type_k=f32, type_v=f32)
    try:
        llm.eval(ids)
        return np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def _arch(path: Path) -> str:
    from gguf import GGUFReader

    return GGUFReader(str(path)).fields["general.architecture"].contents()


@pytest.mark.parametrize("which,arch", [("llm_pruner", "deci"), ("uniform", "llama")])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_gguf_in_llama_cpp_within_f16_rounding(which, arch, dtype, tiny_checkpoints, tmp_path, capsys):
    from gac.export.gguf import GGUF_TOLERANCE

    ck = tiny_checkpoints[which]
    out = tmp_path / f"m-{dtype}.gguf"
    summary = _export(capsys, ck, "gguf", out, "--quant", dtype)
    assert _arch(out) == arch and summary["arch"] == arch
    ids = torch.randint(0, 4096, (1, 40), generator=torch.Generator().manual_seed(13))
    ref = _gac_logits(ck, ids)[0]
    got = _llama_cpp_logits(out, ids[0].tolist())
    rel = _rel(got, ref)
    top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
    print(f"gguf {which} {dtype} ({arch}): max rel diff {rel:.2e}, top-1 agreement {top1:.3f}")
    assert rel <= GGUF_TOLERANCE[dtype] and top1 >= 0.9


@pytest.mark.parametrize("qtype", ["q8_0", "q4_K"])
def test_quantized_gguf_runs_and_is_reported(qtype, tiny_checkpoints, tmp_path, capsys):
    ck = tiny_checkpoints["llm_pruner"]
    f32 = _export(capsys, ck, "gguf", tmp_path / "f32.gguf")
    summary = _export(capsys, ck, "gguf", tmp_path / f"{qtype}.gguf", "--quant", qtype)
    check = summary["check"]
    assert not check["judged"] and np.isfinite(check["max_rel_diff"])
    assert summary["bytes"] < f32["bytes"] / 2
    types, fallback = check["tensor_types"], check["fallback"]
    assert max(types, key=types.get) == qtype.upper()
    # the down projections' rows are the pruned widths 552, 552, 544 and the dense 688: whole blocks of 32 only at
    # 544, of 256 nowhere; the quantizer stores the others in another type
    down = {f"blk.{i}.ffn_down.weight" for i in range(4)}
    assert set(fallback) == (down - {"blk.2.ffn_down.weight"} if qtype == "q8_0" else down), fallback
    assert all(f["ncols"] % f["block"] for f in fallback.values())
    again = _export(capsys, ck, "gguf", tmp_path / "f32.gguf", "--quant", qtype, "--force")  # replaced in place
    assert (tmp_path / "f32.gguf").stat().st_size == again["bytes"] == summary["bytes"]
    print(f"gguf llm_pruner {qtype}: {summary['bytes']} bytes (f32 {f32['bytes']}), max rel diff "
          f"{check['max_rel_diff']:.2e}, top-1 agreement {check['top1_agreement']:.3f}, types {types}, "
          f"fallback {sorted(fallback)}")


_NO_GAC = r"""
import importlib.abc, sys
class NoGac(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gac" or name.startswith("gac."):
            raise ModuleNotFoundError("no gac here")
sys.meta_path.insert(0, NoGac())
try:
    import gac
    raise SystemExit("gac imported")
except ModuleNotFoundError:
    pass
import numpy as np, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=False).eval()
ids = torch.tensor(np.load(sys.argv[2]))
with torch.no_grad():
    np.save(sys.argv[3], m(input_ids=ids).logits.float().numpy())
assert not [k for k in sys.modules if k == "gac" or k.startswith("gac.")]
print(type(m).__name__, m.config.intermediate_size)
"""


def test_hf_folder_loads_without_gac(tiny_checkpoints, tmp_path, capsys):
    ck = tiny_checkpoints["uniform"]
    out = tmp_path / "hf"
    summary = _export(capsys, ck, "hf", out)
    assert summary["check"]["gac_imported"] is False
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == 512
    assert not [f for f in out.iterdir() if f.name.startswith("gac_") and f.name != "gac_export.json"]
    ids = torch.randint(0, 4096, (2, 17), generator=torch.Generator().manual_seed(14))
    np.save(tmp_path / "ids.npy", ids.numpy())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-I", "-c", _NO_GAC, str(out), str(tmp_path / "ids.npy"),
                        str(tmp_path / "l.npy")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["LlamaForCausalLM", "512"]
    assert _rel(np.load(tmp_path / "l.npy"), _gac_logits(ck, ids)) <= 1e-5
    # a second export over it needs --force, and replaces it
    again = _export(capsys, ck, "hf", out, "--force")
    assert again["check"]["max_rel_diff"] <= 1e-5
