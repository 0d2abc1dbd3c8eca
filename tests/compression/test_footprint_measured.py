"""The memory estimate against what a compression allocates: for every compressor, on tiny, the estimate before
loading (:func:`gac.compression.footprint.estimate_footprint`, less what it adds for the process, its tokenizer and
the allocator's retained memory) must be at least the peak of the tensors that the preparation, the write of its
prepared-state cache entry and the compression (plan and in-place apply) hold at once, as a job runs them, the
weights included.

The peak is the one of the tensors torch's CPU allocator hands out (its profiler's memory events, summed in order):
the quantity a GPU job's peak counter measures, exact and free of the allocator's own retention, which on tiny
would drown in the process's noise in a resident-set measure (docs/estimates-vs-measured.md holds those, on the
larger models). Factors are row-major, so that the prepared-state cache writes them without copying them all."""

from __future__ import annotations

import copy
import gc

import pytest
import torch

from gac.compression.compressors import COMPRESSORS

N_SAMPLES, SEQ_LEN = 4, 64
#: ASVD's sensitivity search cut small, as benchmarks/estimates.py runs it (its probes still run)
OPTIONS = {"asvd": {"sensitivity_grid": [0.5, 0.9], "sensitivity_samples": 1}}


@pytest.fixture(scope="module")
def tiny32():
    from gac.models import load_model

    model, tok = load_model("tiny", dtype=torch.float32)
    return model, tok


def _allocated_peak(prof) -> int:
    """The most bytes of CPU tensors alive at once while ``prof`` ran (allocations and frees in time order; every
    tensor the run used was allocated inside it)."""
    from torch.autograd import DeviceType

    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("name,options", [(n, OPTIONS.get(n, {})) for n in sorted(COMPRESSORS)]
                         + [("palu", {"rank_cap": "full"})])
def test_the_estimate_covers_what_each_compressor_holds_at_its_peak(name, options, tiny32, tmp_path):
    from torch.profiler import ProfilerActivity, profile

    from gac.compression.footprint import estimate_footprint
    from gac.compression.preparation import prepare

    model0, tok = tiny32
    calib = torch.randint(0, model0.config.vocab_size, (N_SAMPLES, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    gc.collect()  # an earlier test's garbage freed under the profiler would count as a negative allocation
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = copy.deepcopy(model0)  # its weights allocated under the profiler: counted in the peak
        prepared = prepare(model, tok, name, calib_ids=calib, compressor_options=options)
        prepared.save(tmp_path / "prepared.safetensors")  # a job's cache entry (gac.jobs.run.prepared_cache)
        prepared.compress(0.15, "gac", copy_model=False)
        del prepared, model
    measured = _allocated_peak(prof)
    fp = estimate_footprint(model0.config, name, dtype="float32", device="cpu", n_samples=N_SAMPLES, seq_len=SEQ_LEN,
                            compressor_options=options)
    weights = sum(p.numel() * p.element_size() for p in model0.parameters())
    assert fp.weights == weights and measured > weights  # the peak holds the weights and more
    estimate = fp.device_bytes - fp.base - fp.retention  # the process, its tokenizer and the allocator's margin:
    # no tensor of them
    print(f"{name}: {measured / 2**20:.1f} MiB of tensors at the peak, estimate {estimate / 2**20:.1f} MiB "
          f"(ratio {measured / estimate:.2f})")
    assert measured <= estimate, (f"{name}: the compression held {measured / 2**20:.1f} MiB of tensors at its peak, "
                                  f"above the estimate of {estimate / 2**20:.1f} MiB ({fp.summary()})")


@pytest.mark.parametrize("method", ["exact", "gram32", "gram64", "randomized"])
@pytest.mark.parametrize("shape", [(48, 20), (20, 48)])
def test_factors_are_row_major_whatever_the_method(method, shape):
    """LAPACK returns U and V^T column-major; a column-major factor is copied whole wherever a contiguous one is
    needed (the prepared-state cache's safetensors file took a copy of every factor at once)."""
    from gac.compression.compressors.lowrank_math import svd_factors

    W = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    A, B = svd_factors(W, max_rank=min(shape), method=method)
    assert A.is_contiguous() and B.is_contiguous() and A.dtype == B.dtype == torch.float32
    torch.testing.assert_close(A @ B, W, rtol=0, atol=1e-4)
