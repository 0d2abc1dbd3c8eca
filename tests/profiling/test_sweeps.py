"""The sweeps run on CPU at tiny sizes and produce well-formed profiles; timing, kernel names, job step."""

from __future__ import annotations

import math

import pytest
import torch

from gac.align.targets import Target
from gac.errors import GacError
from gac.profiling import (
    HardwareProfile,
    SweepPlan,
    TimingProtocol,
    dimension_sweep,
    measure_for_targets,
    run_sweeps,
)
from gac.profiling.kernels import SDPA_BACKENDS, kernel_tier, mma_instruction
from gac.profiling.timing import buffer_count, time_op
from tests.profiling.synthetic import profile_of, sdpa_rows

TINY = TimingProtocol(warmup=1, iters=2, trials=3, flush_bytes=1 << 20, max_buffers=3)
TINY_PLAN = SweepPlan.quick(
    sdpa_dims=(15, 16, 17),
    sdpa_seq_len=32,
    sdpa_heads=2,
    gemm_M=16,
    gemm_N=24,
    gemm_K=16,
    gemm_low=0.5,
    tput_center=64,
    tput_radius=1,
    gemv_center=64,
    gemv_radius=2,
)


@pytest.fixture(scope="module")
def cpu_profile():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI's 2 cores are shared: no OpenMP oversubscription
    try:
        return run_sweeps("cpu", "float32", TINY_PLAN, TINY)
    finally:
        torch.set_num_threads(threads)


def test_cpu_sweeps_are_well_formed(cpu_profile, tmp_path):
    p = cpu_profile
    assert p.sweeps() == sorted(
        ["sdpa_head_dim", "gemm_M", "gemm_N", "gemm_K", "gemm_tput_K", "gemm_tput_N", "gemv_K", "gemv_N"]
    )
    t = p.table
    ok = t[t["supported"]]
    assert (ok["latency_ms"] > 0).all() and (ok["latency_min_ms"] <= ok["latency_ms"]).all()
    assert (ok["latency_ms"] <= ok["latency_max_ms"]).all() and (ok["tflops"] > 0).all()
    sdpa = p.sweep("sdpa_head_dim", backend=None)
    assert len(sdpa) == 3 * 3  # auto + flash + math per dim on CPU
    assert set(sdpa["selected_backend"]) <= set(SDPA_BACKENDS)
    auto = p.sweep("sdpa_head_dim")
    assert auto["kernel"].str.startswith("aten::").all()  # captured by torch.profiler
    k = p.sweep("gemm_K")
    assert k["dim"].tolist() == [8, 9, 10, 11, 12, 13, 14, 15, 16]  # 50%..100% of K=16
    assert (k["M"] == 16).all() and (k["N"] == 24).all() and (k["K"] == k["dim"]).all()
    row = k.iloc[0]
    assert row["tflops"] == pytest.approx(2 * 16 * 24 * 8 / (row["latency_ms"] * 1e-3) / 1e12)
    assert p.sweep("gemm_N")["dim"].tolist() == list(range(12, 25))
    gemv = p.sweep("gemv_N")
    assert (gemv["M"] == 1).all() and gemv["dim"].tolist() == [62, 63, 64, 65, 66]
    for key in ("device_name", "torch", "dtype", "protocol", "plan", "date", "cuda", "compute_capability"):
        assert key in p.meta
    assert p.meta["device_type"] == "cpu" and p.dtype == "float32"
    p.save(tmp_path / "cpu")
    assert HardwareProfile.load(tmp_path / "cpu") == p


def test_time_op_rotates_buffers_and_reports_trials():
    made = []

    def make():
        made.append(1)
        return (torch.ones(256),)  # 1 KiB

    calls = []
    t = time_op(
        make,
        lambda x: calls.append(x.data_ptr()),
        torch.device("cpu"),
        TimingProtocol(warmup=0, iters=6, trials=2, flush_bytes=3 * 1024, max_buffers=8),
    )
    assert t.n_buffers == 3 and len(made) == 3
    assert len(set(calls)) == 3  # every buffer used
    assert len(t.trials_ms) == 2 and t.min_ms <= t.median_ms <= t.max_ms
    assert buffer_count(10, torch.device("cpu"), TimingProtocol(flush_bytes=10**9, max_buffers=5)) == 5
    assert buffer_count(10**9, torch.device("cpu"), TimingProtocol(flush_bytes=10)) == 1


def test_protocol_and_plan_validation():
    assert TimingProtocol.paper() == TimingProtocol(warmup=50, iters=200, trials=3)
    with pytest.raises(GacError, match="iters"):
        TimingProtocol(iters=0)
    with pytest.raises(GacError, match="unknown sweep"):
        SweepPlan(sweeps=("sdpa", "conv"))
    with pytest.raises(GacError, match="CUDA is not available"):
        if torch.cuda.is_available():
            raise GacError("CUDA is not available (skipped: CUDA present)")
        run_sweeps("cuda", "float16", TINY_PLAN, TINY)
    p = SweepPlan.paper()
    assert (p.sdpa_batch, p.sdpa_seq_len, p.sdpa_heads) == (4, 2048, 32)
    assert p.sdpa_dims[0] == 64 and p.sdpa_dims[-1] == 256 and len(p.sdpa_dims) == 193
    assert p.gemm_range("N")[0] == 1024 and p.gemm_range("K") == list(range(64, 129))


@pytest.mark.parametrize(
    ("name", "tier", "mma"),
    [
        ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "native", "m16n8k16"),
        (
            "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
            "native",
            None,
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_32x6_tn_align2>",
            "align2",
            "m16n8k16",
        ),
        ("cutlass_75_wmma_tensorop_f16_s161616gemm_f16_16x16_128x2_tn_align1", "align1", "m16n16k16"),
        ("void gemv2T_kernel_val<int, int, __half, __half, float, 128, 16, 4, 4, false>", "gemv", None),
        ("aten::mm", "cpu", None),
        ("", "unknown", None),
    ],
)
def test_kernel_tier_names(name, tier, mma):
    assert kernel_tier(name) == tier
    assert mma_instruction(name) == mma


def _lowrank(name, d_star, fin=64, fout=48):
    return Target(
        name,
        d_star,
        1.0,
        fin + fout,
        d_max=min(fin, fout),
        kind="lowrank",
        meta={"in_features": fin, "out_features": fout},
    )


def test_measure_for_targets_groups_contexts():
    ts = [
        _lowrank("a", 20.0),
        _lowrank("b", 30.0),
        _lowrank("c", 20.0, fin=32, fout=32),
        Target("h", 20.0, 1.0, 64, kind="head_dim", meta={"num_heads": 2}),
        Target("g", 20.0, 1.0, 8),
    ]
    cands = {"a": [16, 24], "b": [24, 32], "c": [16], "h": [16, 24], "g": [8]}
    p = measure_for_targets(ts, cands, "cpu", "float32", seq_len=16, batch=1, protocol=TINY)
    assert p.contexts() == ["head_dim:heads=2", "lowrank:in=32,out=32", "lowrank:in=64,out=48"]
    t = p.table
    assert sorted(t.loc[t["context"] == "lowrank:in=64,out=48", "dim"].tolist()) == [
        16,
        24,
        32,
    ]  # union, once each
    assert (t.loc[t["op"] == "lowrank", "M"] == 16).all()
    assert (t["latency_ms"] > 0).all()


def test_dimension_sweep_caches_per_device(tmp_path, monkeypatch):
    ts = [_lowrank("a", 20.0), _lowrank("b", 21.0)]
    kw = dict(device="cpu", dtype="float32", seq_len=8, unit=8, window=1, cache_dir=tmp_path, protocol=TINY)
    first = dimension_sweep(ts, **kw)
    assert sorted(first.table["dim"].tolist()) == [16, 24]
    import gac.profiling.job_profile as job

    def boom(*a, **k):
        raise AssertionError("measured again although the cache covers it")

    monkeypatch.setattr(job, "measure_for_targets", boom)
    again = dimension_sweep(ts, **kw)
    assert again == HardwareProfile.load(next(tmp_path.iterdir()))
    with pytest.raises(GacError, match="covers"):
        dimension_sweep([_lowrank("z", 40.0)], measure=False, **kw)


def test_dimension_sweep_explicit_profile_device_check(tmp_path):
    prof = profile_of(sdpa_rows(range(64, 72)), device_name="NVIDIA H100 80GB HBM3")
    prof.save(tmp_path / "h100")
    with pytest.raises(GacError, match="measured on 'NVIDIA H100 80GB HBM3'"):
        dimension_sweep([], device="cpu", profile_dir=tmp_path / "h100")
    got = dimension_sweep([], device="cpu", profile_dir=tmp_path / "h100", allow_device_mismatch=True)
    assert got == prof


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sweeps_record_backends_and_kernels():
    plan = SweepPlan.quick(sdpa_dims=(64, 65, 72, 128, 129), sdpa_batch=1, sdpa_seq_len=256, sdpa_heads=8)
    p = run_sweeps("cuda", "float16", plan, TimingProtocol(warmup=5, iters=20, trials=3))
    assert p.meta["compute_capability"] and p.meta["cuda"]
    auto = p.sweep("sdpa_head_dim")
    assert set(auto["selected_backend"]) <= set(SDPA_BACKENDS)
    assert auto.loc[auto["dim"] == 64, "selected_backend"].item() in ("flash", "efficient", "cudnn")
    gemm = p.sweep("gemm_K")
    assert (gemm["kernel"] != "").all() and not gemm["kernel"].str.startswith("aten::").any()
    assert all(math.isfinite(x) for x in gemm["latency_ms"])


def test_target_shape_from_meta():
    from gac.profiling.sweeps import target_shape

    assert target_shape(_lowrank("a", 20.0)) == {"in": 64, "out": 48}
    solved = Target("k", 20.0, 1.0, 4096 + 1024, kind="lowrank", meta={"dense_params": 4096 * 1024})
    assert target_shape(solved) == {"in": 4096, "out": 1024}
    assert target_shape(Target("s", 20.0, 1.0, 8192, kind="lowrank")) == {"in": 4096, "out": 4096}
    assert target_shape(Target("w", 20.0, 1.0, 3 * 4096, kind="width")) == {"hidden": 4096}
    assert target_shape(Target("h", 20.0, 1.0, 64, kind="head_dim")) == {"heads": 32}
    assert target_shape(Target("g", 20.0, 1.0, 64)) is None


def test_dimension_sweep_without_measuring_uses_a_sweep_profile_of_this_device(tmp_path):
    from gac.profiling.device import device_name

    here = device_name(torch.device("cpu"))
    prof = profile_of(sdpa_rows(range(64, 72)), device_name=here)
    prof.meta["dtype"] = "float32"
    prof.save(tmp_path / "cpu-sweeps")
    profile_of(sdpa_rows(range(64, 72)), device_name="Other GPU").save(tmp_path / "other")
    got = dimension_sweep(
        [_lowrank("a", 20.0)], device="cpu", dtype="float32", cache_dir=tmp_path, measure=False
    )
    assert got.device_name == here and got.sweeps() == ["sdpa_head_dim"]
