"""On a CUDA GPU (marker ``gpu``, auto-skipped without one): the compression paths that only a GPU runs give what the
CPU in float32 gives, within a tolerance, not only "something ran": gradient and Fisher proxy scores (half of Table
5's compressed rows), SVD-LLM's and PaLU's whitening in float16 (the whitened spectra, the sensitivity table read
through them, perplexity), the sensitivity search's layer cache, and the GPU peak of a job's prepare stage around the
stages it measures itself.

Each tolerance is the half-precision noise measured on CPU kernels (the same comparison with the model in float16 or
bfloat16 on the CPU, against float32; the numbers are beside each tolerance, measured 2026-11-27 on tiny with these
calibration samples) times a margin of about 5, so a GPU path that is off by a percent fails where the old
tolerances (0.02-0.1) let it pass. On a GPU the same storage formats round the same values (the GEMMs accumulate
in float32 there as here), so the noise should be of the same size; each test records what it measured
(the ``measured`` fixture: in the JUnit XML of ``--junitxml``) so that a run on a GPU checks the margin.

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
    from gac.compression.preparation import prepare

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


# Spearman's rho of the score ranking against the float32 one: measured 1.0 in every half precision (no two of the 28
# weights swap); 0.995 allows up to 9 adjacent swaps of near-equal scores.
MIN_RHO = 0.995


def _close_scores(got: dict, ref: dict, max_rel: float, median_rel: float, record=None) -> None:
    assert got.keys() == ref.keys()
    rel = {k: abs(got[k] - ref[k]) / abs(ref[k]) for k in ref if ref[k] != 0}
    assert all(got[k] == 0 for k in ref if ref[k] == 0)
    worst = max(rel, key=rel.get)
    # and the order the allocation reads: Spearman's rho of the two rankings
    names = sorted(ref)
    rank = {n: i for i, n in enumerate(sorted(names, key=ref.get))}
    rank_got = {n: i for i, n in enumerate(sorted(names, key=got.get))}
    n = len(names)
    rho = 1 - 6 * sum((rank[k] - rank_got[k]) ** 2 for k in names) / (n * (n * n - 1))
    median = statistics.median(rel.values())
    if record is not None:
        record("scores_max_rel", rel[worst])
        record("scores_median_rel", median)
        record("scores_rho", rho)
    assert rel[worst] <= max_rel, (worst, got[worst], ref[worst], rel[worst])
    assert median <= median_rel, median
    assert rho >= MIN_RHO, rho


# (model dtype on the GPU, bf16 available to the gradient pass, max relative error, median relative error) of the
# gradient and Fisher proxies' scores (asvd, proportional allocation) against the CPU in float32. Measured on CPU:
#   float32 (other CPU kernels: the fake devices' of tests/models): max 1.9e-7, median 3.7e-8. A GPU's float32
#     reductions run in other orders again (cuBLAS, the backward's atomics): 1e-4 / 1e-5 is a margin of 500x, still
#     100x below a path that is 1% off.
#   float16 through the bfloat16 pass, and bfloat16: max 2.6e-3 (gradient) / 6.5e-3 (fisher), median 9.3e-4 /
#     2.7e-3 -> 0.03 / 0.015.
#   float16 with a loss scale: max 2.4e-4 / 1.2e-3, median 8.3e-5 / 1.3e-4 -> 6e-3 / 7e-4.
PRECISIONS = [("fp32", True, 1e-4, 1e-5), ("fp16", True, 0.03, 0.015), ("fp16", False, 6e-3, 7e-4),
              ("bf16", True, 0.03, 0.015)]


@pytest.mark.parametrize("proxy", ["gradient", "fisher"])
@pytest.mark.parametrize("dtype,bf16,max_rel,median_rel", PRECISIONS,
                         ids=["fp32", "fp16-as-bf16", "fp16-loss-scaled", "bf16"])
def test_gradient_proxy_scores_on_cuda_equal_the_cpu_float32_scores(calib, monkeypatch, proxy, dtype, bf16, max_rel,
                                                                     median_rel, measured):
    import gac.compression.gradients as I

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
    _close_scores(got.scores, ref.scores, max_rel, median_rel, measured)


# PaLU's fisher_rms and LLM-Pruner's taylor scores of a float16 model (the bfloat16 pass) against float32, measured
# on CPU: max 3.1e-3 / 1.4e-3, median 1.5e-3 / 1.2e-3 -> 0.015 / 0.008.
ELEMENTWISE_RTOL = (0.015, 0.008)


@pytest.mark.parametrize("compressor", ["palu", "llm_pruner"])
def test_fisher_rms_and_taylor_statistics_on_cuda_in_float16(calib, compressor, measured):
    """PaLU's and LLM-Pruner's own proxies (element-wise gradient sums) through the bf16 pass of a float16 model."""
    ref = _cpu(calib, compressor)
    got = _prepare("fp16", "cuda", calib, compressor)
    assert got.paths["gradients"]["zero_fraction"] < 1e-3
    _close_scores(got.scores, ref.scores, *ELEMENTWISE_RTOL, measured)


# Whitening in float16 against float32, measured on CPU (svd_llm / palu):
#   each weight's whitened singular values, max |S - S_ref| / S_ref[0]: 1.0e-4 / 9.1e-5 -> 5e-4;
#   SVD-LLM's sensitivity table (each probe's calibration perplexity through the whitened truncation): 1.3e-4 -> 7e-4;
#   perplexity after compressing at 0.15: SVD-LLM under the sensitivity allocation 2.3e-3 (its noise moves 10 of
#   the 28 dimensions to a neighbouring grid ratio: the table's weights lie close together on tiny) -> 0.012; PaLU
#   (Fisher allocation) 4.3e-6, held to SVD-LLM's uniform-allocation 2.8e-4 -> 1.5e-3.
WHITENED_S_RTOL = 5e-4
WHITENED_TABLE_RTOL = 7e-4
WHITENED_PPL_RTOL = {"svd_llm": 0.012, "palu": 1.5e-3}


@pytest.mark.parametrize("compressor", ["svd_llm", "palu"])
def test_whitening_in_float16_gives_the_cpu_float32_spectra_and_perplexity(calib, compressor, measured):
    """Under an allocation that reads the whitening: SVD-LLM's sensitivity search probes each weight truncated
    through its whitened factorisation (its uniform default would fix every dimension from the budget alone), PaLU's
    Fisher allocation weighs its ranks by the gradient pass."""
    tok = calib[0]
    kw = {"allocation": "sensitivity"} if compressor == "svd_llm" else {}
    ref = _cpu(calib, compressor, **kw)
    got = _prepare("fp16", "cuda", calib, compressor, **kw)
    cpu_fallbacks = [n for n in ref.notes if "whitening used" in n]
    gpu_fallbacks = [n for n in got.notes if "whitening used" in n]
    assert len(gpu_fallbacks) <= len(cpu_fallbacks), gpu_fallbacks  # fp16 statistics needed no other path
    assert got.allocation == ref.allocation != "uniform"
    worst = 0.0
    for name, f in ref.factors.items():  # the spectrum each weight's truncation and the plan read
        s_ref, s_got = f["S"].double().cpu(), got.factors[name]["S"].double().cpu()
        assert s_got.shape == s_ref.shape, name
        worst = max(worst, float((s_got - s_ref).abs().max() / s_ref[0]))
    measured("whitened_s_rel", worst)
    assert worst <= WHITENED_S_RTOL, worst
    if compressor == "svd_llm":
        table = max(abs(a - b) / b for ra, rb in zip(got.sensitivity["table"], ref.sensitivity["table"])
                    for a, b in zip(ra, rb))
        measured("sensitivity_table_rel", table)
        assert table <= WHITENED_TABLE_RTOL, table
    ref_model, ref_plan, _ = ref.compress(0.15, "gac")  # a copy: the reference stays reusable
    model, plan, _ = got.compress(0.15, "gac", copy_model=False)
    assert plan.dims.keys() == ref_plan.dims.keys() and plan.budget == ref_plan.budget
    measured("dims_moved", sum(plan.dims[k] != ref_plan.dims[k] for k in plan.dims))
    if compressor == "palu":  # Fisher scores within their noise: a dimension moves one aligned step at most
        moved = {k: (plan.dims[k], ref_plan.dims[k]) for k in plan.dims if abs(plan.dims[k] - ref_plan.dims[k]) > UNIT}
        assert not moved, moved
    ppl_gpu, ppl_cpu = _ppl(model, tok), _ppl(ref_model, tok)
    measured("ppl_rel", abs(ppl_gpu - ppl_cpu) / ppl_cpu)
    assert ppl_gpu == pytest.approx(ppl_cpu, rel=WHITENED_PPL_RTOL[compressor])


# ASVD's sensitivity table (2 probe samples, grid 0.5/0.9) and its dense perplexity against float32, measured on CPU:
# float16 1.9e-4, bfloat16 1.3e-3 -> 1e-3, 7e-3; float32 held as the gradient scores are (1e-4).
SENSITIVITY_RTOL = {"fp32": 1e-4, "fp16": 1e-3, "bf16": 7e-3}


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_sensitivity_search_keeps_its_layer_cache_on_the_gpu(calib, dtype, measured):
    import gac.compression.gradients as I

    if dtype == "bf16" and not I.bf16_native("cuda"):
        pytest.skip("this GPU has no native bf16")
    opts = {"sensitivity_grid": (0.5, 0.9), "sensitivity_samples": 2}
    ref = _cpu(calib, "asvd", compressor_options=opts)
    got = _prepare(dtype, "cuda", calib, "asvd", compressor_options=opts)
    probe = got.paths["sensitivity"]
    assert probe["path"] == "layer_cache", probe  # the check passed with the dtype's tolerance on a GPU kernel
    assert probe["rel_diff"] <= probe["tolerance"]
    assert any(n.startswith("sensitivity: the probes ran from the layer cache") for n in got.notes)
    tol = SENSITIVITY_RTOL[dtype]
    table = max(abs(a - b) / b for ra, rb in zip(got.sensitivity["table"], ref.sensitivity["table"])
                for a, b in zip(ra, rb))
    measured("sensitivity_table_rel", table)
    assert got.sensitivity["base_ppl"] == pytest.approx(ref.sensitivity["base_ppl"], rel=tol)
    assert table <= tol, table


def test_a_jobs_prepare_peak_covers_the_stages_prepare_measures_itself(calib):
    """The job meters its prepare stage while prepare's own meter measures its stages (the gradient pass, then one
    layer at a time: calibration, score, factorize): the job's peak is at least the gradient pass's, which is above
    the last stage's, so an outer peak read after an inner meter's reset would be too small."""
    from gac.compression.resources import ResourceMeter

    dev = torch.device("cuda", torch.cuda.current_device())
    job = ResourceMeter(str(dev))
    with job.stage("prepare"):
        got = _prepare("fp16", "cuda", calib, "palu")
    inner = {k: v["gpu_peak_mb"] for k, v in got.memory.items() if v.get("gpu_peak_mb") is not None}
    assert {"gradients", "calibration", "factorize"} <= set(inner), inner
    assert inner["gradients"] > inner["factorize"], inner  # the logits and activations, against one layer's SVD
    outer = job.memory()["prepare"]["gpu_peak_mb"]
    assert outer >= inner["gradients"], (outer, inner)
