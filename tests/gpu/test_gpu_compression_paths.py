"""On a CUDA GPU (marker ``gpu``, auto-skipped without one): the compression paths that only a GPU runs give what the
CPU in float32 gives, within a tolerance, not only "something ran": gradient and Fisher proxy scores (half of Table
5's compressed rows), SVD-LLM's and PaLU's whitening in float16 (ranks and perplexity), the sensitivity search's
layer-cache check, and the stage memory of a measured stage around another meter's stages.

Run them with ``gac doctor`` first on a new node: ``srun --gres=gpu:1 python -m pytest -m gpu tests``.
"""

from __future__ import annotations

import statistics

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

N_CALIB, CALIB_LEN = 4, 64
UNIT = 8  # the alignment unit of the plans compared


@pytest.fixture(scope="module")
def calib():
    from gac.models import load_model
    from gac.text import calibration_batches

    _, tok = load_model("tiny", dtype="fp32")
    return tok, calibration_batches(tok, "tiny", N_CALIB, CALIB_LEN, seed=0, split="train")


def _tiny(dtype: str, device: str):
    from gac.models import load_model

    return load_model("tiny", dtype=dtype, device=device)[0]


def _prepare(dtype, device, calib, compressor, **kw):
    from gac.compression.compress import prepare

    tok, ids = calib
    return prepare(_tiny(dtype, device), tok, compressor, calib_ids=ids, **kw)


_CPU: dict = {}


def _cpu(calib, compressor, **kw):
    """The CPU float32 reference, prepared once per (compressor, options)."""
    key = (compressor, tuple(sorted((k, repr(v)) for k, v in kw.items())))
    if key not in _CPU:
        _CPU[key] = _prepare("fp32", "cpu", calib, compressor, **kw)
    return _CPU[key]


def _ppl(model, tok) -> float:
    from gac.evaluation.perplexity import perplexity

    return perplexity(model, tok, "tiny", seq_len=128, batch_size=4, max_windows=8)["ppl"]


def _close_scores(got: dict, ref: dict, max_rel: float, median_rel: float) -> None:
    assert got.keys() == ref.keys()
    rel = {k: abs(got[k] - ref[k]) / abs(ref[k]) for k in ref if ref[k] != 0}
    assert all(got[k] == 0 for k in ref if ref[k] == 0)
    worst = max(rel, key=rel.get)
    assert rel[worst] <= max_rel, (worst, got[worst], ref[worst])
    assert statistics.median(rel.values()) <= median_rel
    # and the order the allocation reads: Spearman's rho of the two rankings
    names = sorted(ref)
    rank = {n: i for i, n in enumerate(sorted(names, key=ref.get))}
    rank_got = {n: i for i, n in enumerate(sorted(names, key=got.get))}
    n = len(names)
    rho = 1 - 6 * sum((rank[k] - rank_got[k]) ** 2 for k in names) / (n * (n * n - 1))
    assert rho >= 0.98, rho


# (model dtype on the GPU, bf16 available to the gradient pass, max relative error, median relative error)
PRECISIONS = [("fp32", True, 1e-3, 1e-4), ("fp16", True, 0.1, 0.02), ("fp16", False, 0.1, 0.02),
              ("bf16", True, 0.1, 0.03)]


@pytest.mark.parametrize("proxy", ["gradient", "fisher"])
@pytest.mark.parametrize("dtype,bf16,max_rel,median_rel", PRECISIONS,
                         ids=["fp32", "fp16-as-bf16", "fp16-loss-scaled", "bf16"])
def test_gradient_proxy_scores_on_cuda_equal_the_cpu_float32_scores(calib, monkeypatch, proxy, dtype, bf16, max_rel,
                                                                     median_rel):
    import gac.compression.importance as I

    if not bf16:  # the path of a GPU without bf16 (V100, T4): float16 with a loss scale
        monkeypatch.setattr(I, "bf16_native", lambda device: False)
    elif dtype != "fp32" and not I.bf16_native("cuda"):
        pytest.skip("this GPU has no native bf16")
    ref = _cpu(calib, "asvd", proxy=proxy, allocation="proportional")
    got = _prepare(dtype, "cuda", calib, "asvd", proxy=proxy, allocation="proportional")
    g = got.paths["gradients"]
    expect = {"fp32": "float32", "bf16": "bfloat16", "fp16": "bfloat16" if bf16 else "float16"}[dtype]
    assert g["dtype"] == expect and g["zero_fraction"] < 1e-3, g
    assert (g["loss_scale"] is not None) == (dtype == "fp16" and not bf16)
    _close_scores(got.scores, ref.scores, max_rel, median_rel)


def test_fisher_rms_and_taylor_statistics_on_cuda_in_float16(calib):
    """PaLU's and LLM-Pruner's own proxies (element-wise gradient sums) through the bf16 pass of a float16 model."""
    for comp in ("palu", "llm_pruner"):
        ref = _cpu(calib, comp)
        got = _prepare("fp16", "cuda", calib, comp)
        assert got.paths["gradients"]["zero_fraction"] < 1e-3
        _close_scores(got.scores, ref.scores, 0.1, 0.02)


@pytest.mark.parametrize("compressor", ["svd_llm", "palu"])
def test_whitening_in_float16_gives_the_cpu_float32_ranks_and_perplexity(calib, compressor):
    tok = calib[0]
    ref = _cpu(calib, compressor)
    got = _prepare("fp16", "cuda", calib, compressor)
    cpu_fallbacks = [n for n in ref.notes if "whitening used" in n]
    gpu_fallbacks = [n for n in got.notes if "whitening used" in n]
    assert len(gpu_fallbacks) <= len(cpu_fallbacks), gpu_fallbacks  # fp16 statistics needed no other path
    ref_model, ref_plan, _ = ref.compress(0.15, "gac")  # a copy: the reference stays reusable
    model, plan, _ = got.compress(0.15, "gac", copy_model=False)
    assert plan.dims.keys() == ref_plan.dims.keys() and plan.budget == ref_plan.budget
    # window 1: each dimension is one of the aligned pair around d*; a slightly different score may move it a step
    moved = {k: (plan.dims[k], ref_plan.dims[k]) for k in plan.dims if abs(plan.dims[k] - ref_plan.dims[k]) > 2 * UNIT}
    assert not moved, moved
    ppl_gpu, ppl_cpu = _ppl(model, tok), _ppl(ref_model, tok)
    assert ppl_gpu == pytest.approx(ppl_cpu, rel=0.05)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_sensitivity_search_keeps_its_layer_cache_on_the_gpu(calib, dtype):
    import gac.compression.importance as I

    if dtype == "bf16" and not I.bf16_native("cuda"):
        pytest.skip("this GPU has no native bf16")
    opts = {"sensitivity_grid": (0.5, 0.9), "sensitivity_samples": 2}
    ref = _cpu(calib, "asvd", compressor_options=opts)
    got = _prepare(dtype, "cuda", calib, "asvd", compressor_options=opts)
    probe = got.paths["sensitivity"]
    assert probe["path"] == "layer_cache", probe  # the check passed with the dtype's tolerance on a GPU kernel
    assert probe["rel_diff"] <= probe["tolerance"]
    assert any(n.startswith("sensitivity: the probes ran from the layer cache") for n in got.notes)
    tol = {"fp32": 1e-3, "fp16": 0.02, "bf16": 0.05}[dtype]
    assert got.sensitivity["base_ppl"] == pytest.approx(ref.sensitivity["base_ppl"], rel=tol)
    for a, b in zip(got.sensitivity["table"], ref.sensitivity["table"]):
        assert a == pytest.approx(b, rel=tol)


def test_an_outer_stage_gpu_peak_covers_another_meters_inner_stages():
    from gac.compression.resources import ResourceMeter

    dev = torch.device("cuda", torch.cuda.current_device())
    job, inner = ResourceMeter(str(dev)), ResourceMeter(str(dev))
    MiB = 2**20
    with job.stage("prepare"):
        with inner.stage("gradients"):
            big = torch.empty(512 * MiB, dtype=torch.uint8, device=dev)
            del big
        with inner.stage("factorize"):
            small = torch.empty(16 * MiB, dtype=torch.uint8, device=dev)
            del small
    outer, mem = job.memory()["prepare"]["gpu_peak_mb"], inner.memory()
    assert mem["gradients"]["gpu_peak_mb"] >= 512 and mem["factorize"]["gpu_peak_mb"] < mem["gradients"]["gpu_peak_mb"]
    assert outer >= mem["gradients"]["gpu_peak_mb"]
