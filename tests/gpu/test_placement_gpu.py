"""On CUDA GPUs (marker ``gpu``, auto-skipped without one): a model spread over devices (``model.device_map=auto``,
:mod:`gac.models.placement`) compresses and scores as it does on one device. With one GPU the split is GPU + host
memory; with two or more it is over the GPUs. Everything runs in float32 so the results compare with the
single-device run within float rounding (the kernels differ between devices, not the arithmetic).

Run with the rest of the tier: ``srun --gres=gpu:2 python -m pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _limits(two_gpus: bool) -> dict:
    # tiny in float32: a 16 MiB embedding (tied head) and 2.8 MiB per decoder layer; the first device takes the
    # embedding and one layer, the rest goes to the second GPU (or the host)
    return {"cuda:0": "20MiB", "cuda:1": "1GiB"} if two_gpus else {"cuda:0": "20MiB", "cpu": "1GiB"}


@pytest.fixture(scope="module")
def tiny_data():
    from gac.models import load_model
    from gac.text import calibration_batches

    _, tok = load_model("tiny")
    return tok, calibration_batches(tok, "tiny", 4, 64, seed=0, split="train")


def _model(spread: bool, two_gpus: bool):
    from gac.models import load_model
    from gac.models.placement import place_model

    model, _ = load_model("tiny", dtype="fp32", device="cpu" if spread else "cuda:0")
    if spread:
        place_model(model, "cuda:0", _limits(two_gpus))
    return model


@pytest.mark.parametrize("two_gpus", [False, True])
@pytest.mark.parametrize("compressor,allocation", [("llm_pruner", None), ("asvd", "proportional")])
def test_a_model_spread_over_devices_compresses_and_scores_as_on_one_gpu(tiny_data, compressor, allocation, two_gpus):
    from gac.compression.compress import compress_model
    from gac.evaluation import perplexity
    from gac.models.placement import placement_of

    if two_gpus and torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU (cuda:1)")
    tok, calib = tiny_data
    out = []
    for spread in (False, True):
        model = _model(spread, two_gpus)
        if spread:
            used = set(placement_of(model).values())
            assert used == ({"cuda:0", "cuda:1"} if two_gpus else {"cuda:0", "cpu"}), used
        model, plan, _ = compress_model(model, tok, compressor, ratio=0.3, calib_ids=calib, allocation=allocation)
        if spread:  # each compressed module sits on the device of the unit it replaced a module in
            for name, dev in placement_of(model).items():
                want = torch.device(dev).type if dev == "cpu" else torch.device(dev)
                for p in model.get_submodule(name).parameters():
                    assert (p.device.type if dev == "cpu" else p.device) == want, (name, p.device, dev)
        out.append((dict(plan.dims), perplexity(model, tok, "tiny", max_windows=4)["ppl"]))
        del model
        torch.cuda.empty_cache()
    (dims0, ppl0), (dims1, ppl1) = out
    assert dims0 == dims1
    assert ppl1 == pytest.approx(ppl0, rel=1e-3)


def test_a_job_over_two_gpus_records_quality_and_no_latency(tmp_path):
    from omegaconf import OmegaConf

    from gac.jobs.experiment import compose_config, run_config

    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU (cuda:1)")
    base = ["model=tiny", "gpu=h100", "gpu.allow_profile_mismatch=true", "gpu.dtype=float32", "eval=quick",
            "eval.tasks=[]", "eval.ppl_max_windows=4", "eval.ppl_seq_len=128", "calibration.n_samples=4",
            "calibration.seq_len=64", "seq_len=64", "eval.latency_seq_lens=[64]", "compressor=llm_pruner",
            "ratio=0.3", f"results_dir={tmp_path / 'r'}"]

    def run(*extra):
        return run_config(OmegaConf.to_container(compose_config([*base, *extra]), resolve=True))

    single = run()
    spread = run("model.device_map=auto", "+model.max_memory.0=20MiB", "+model.max_memory.1=1GiB")
    assert set(spread["memory"]["placement"]) == {"cuda:0", "cuda:1"}
    assert spread["plan"]["dims"] == single["plan"]["dims"]
    assert spread["metrics"]["ppl_tiny"] == pytest.approx(single["metrics"]["ppl_tiny"], rel=1e-3)
    assert "prefill_ms" in single["metrics"] and "prefill_ms" not in spread["metrics"]
    assert "single-GPU measurement" in spread["evaluation"]["latency"]["skipped"]
