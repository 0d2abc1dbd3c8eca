"""Memory before loading and out of memory while running (issue 21): baselines and hub models that are not
downloaded are checked from the model config's ``arch``; a model that fits no single GPU is refused before a long
load; a ``torch.OutOfMemoryError`` becomes one line naming the stage, the estimate and the fix. A GPU is faked by
replacing :func:`gac.compression.resources.device_memory` (what the checks read)."""

from __future__ import annotations

import pytest
import torch

import gac.compression.resources as resources
from gac.errors import GacError
from gac.jobs.config.build import job_from_config, spec_from_config
from gac.jobs.run.memory_fits import check_job_fits
from gac.jobs.run.recipe import run_job
from gac.results import ResultsStore

GIB = 1024.0  # MiB


def fake_gpu(monkeypatch, total_gib: float, free_gib: float | None = None, host_gib: float = 500.0):
    real = resources.device_memory

    def device_memory(device="cpu"):
        if str(device).startswith("cuda"):
            return {"device": "cuda:0", "total_mb": total_gib * GIB, "available_mb": (free_gib or total_gib) * GIB}
        if device == "cpu":
            return {"device": "cpu", "total_mb": host_gib * GIB, "available_mb": host_gib * GIB}
        return real(device)

    monkeypatch.setattr(resources, "device_memory", device_memory)


def test_a_hub_baseline_not_downloaded_is_checked_from_its_arch(make_cfg, monkeypatch):
    """Before issue 21 the baseline and every hub model not in the local cache skipped the check."""
    fake_gpu(monkeypatch, 80)
    spec = spec_from_config(make_cfg("model=llama3_8b", "gpu=h100", "compressor=none"))
    assert spec.dtype == "float16"  # model.dtype (the GPU config leaves gpu.dtype null)
    fp = check_job_fits(spec)
    assert fp is not None and 7.9e9 < fp.params < 8.1e9 and fp.evaluation > 0
    assert 14 < fp.weights / 2**30 < 16  # 8.03B x 2 bytes
    fake_gpu(monkeypatch, 24, free_gib=16)
    with pytest.raises(GacError, match="will not fit: GPU memory: needs about .* 16.0 GiB available on cuda:0"):
        check_job_fits(spec)
    fake_gpu(monkeypatch, 12)
    with pytest.raises(GacError, match="will not fit: its weights alone take about 15.0 GiB"):
        check_job_fits(spec)


def test_llama3_70b_fits_no_single_gpu_and_is_refused_before_loading(make_cfg, monkeypatch):
    fake_gpu(monkeypatch, 79.6)  # an H100 80GB as torch reports it
    spec = spec_from_config(make_cfg("model=llama3_70b", "gpu=h100", "compressor=asvd", "allocation=proportional"))
    with pytest.raises(GacError) as e:
        check_job_fits(spec)
    msg = str(e.value)
    assert "weights alone take about 131." in msg and "79.6 GiB in all" in msg and "one GPU" in msg
    assert "\n" not in msg


def test_compression_estimate_includes_the_evaluation(make_cfg, monkeypatch):
    from gac.compression.footprint import EvalLoad, estimate_footprint
    from gac.jobs.run.loading import job_model_config

    spec = spec_from_config(make_cfg("model=llama3_8b", "gpu=h100", "eval.batch_size=8"))
    cfg = job_model_config(spec)
    plain = estimate_footprint(cfg, "asvd", dtype="float16", device="cuda")
    ppl = estimate_footprint(cfg, "asvd", dtype="float16", device="cuda",
                             evaluation=EvalLoad(ppl_batch=8, ppl_seq_len=2048))
    assert ppl.evaluation > 0 and ppl.device_bytes >= plain.device_bytes
    # the chunked loss: at most 1 GiB of float32 logits at a time, not 8 x 2048 x 128k (~8 GiB, ~21 GB with copies)
    assert ppl.evaluation < 8 * 2048 * 128256 * 4


class _FakeOOM(torch.cuda.OutOfMemoryError):
    pass


def test_out_of_memory_in_a_job_is_one_line_with_stage_estimate_and_fix(make_cfg, monkeypatch, tmp_path):
    import gac.jobs.run.loading as loading

    job = job_from_config(make_cfg("compressor=none", "eval=none"))

    def boom(_spec, **_):
        raise _FakeOOM("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of "
                       "which 1.06 GiB is free.\nIncluding non-PyTorch memory, this process has ...")

    monkeypatch.setattr(loading, "load_job_model", boom)
    store = ResultsStore(tmp_path / "r")
    with pytest.raises(GacError) as e:
        run_job(job, store)
    msg = str(e.value)
    assert "\n" not in msg and "out of memory on cpu in stage load" in msg
    assert "Tried to allocate 2.00 GiB" in msg and "the estimate before loading was" in msg and "try " in msg
    import json

    (path,) = store.failure_paths(job.spec.key)  # the failure is recorded with the same line (and torch's traceback)
    failure = json.loads(path.read_text())
    assert failure["error"].startswith("GacError: out of memory on cpu in stage load")


def test_out_of_memory_in_gac_evaluate_exits_2_with_one_line(monkeypatch, capsys):
    import gac.models
    from gac.cli import main

    def boom(*a, **k):
        raise _FakeOOM("CUDA out of memory. Tried to allocate 500.00 MiB. GPU 0 has a total capacity of 79 GiB")

    import logging

    monkeypatch.setattr(gac.models, "load_model", boom)
    monkeypatch.setattr(logging.root, "handlers", [])  # an earlier test's CLI bound them to its closed capture
    assert main(["evaluate", "tiny", "--ppl"]) == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ": error:" in ln]  # beside it: the INFO line with the estimate
    assert len(errors) == 1 and errors[0].startswith("gac evaluate: error: out of memory on cpu in stage load")
    assert "estimate before loading" in errors[0] and "OutOfMemoryError" not in err  # no torch traceback


def test_other_errors_are_not_taken_for_out_of_memory():
    from gac.jobs.run.memory_fits import is_out_of_memory

    assert is_out_of_memory(_FakeOOM("x")) and not is_out_of_memory(RuntimeError("CUDA out of memory"))
