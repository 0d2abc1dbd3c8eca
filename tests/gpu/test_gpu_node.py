"""On a CUDA GPU (marker ``gpu``, auto-skipped without one): assertions that fail when a CUDA path is wrong.

Run them, and ``gac doctor``, first on a new node: ``srun --gres=gpu:1 python -m pytest -m gpu tests``.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SDPA_NAMES = {"flash", "efficient", "cudnn", "math"}


def _busy(dev, n=8):
    a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)

    def call():
        for _ in range(n):
            a @ a

    return call


@pytest.mark.parametrize("index", [0, 1])
def test_cuda_event_times_match_the_wall_clock_on_the_work_device(index):
    """Events on the wrong stream (another device's, or none) time the host's enqueue: microseconds, not the work."""
    from gac.evaluation.latency import time_calls

    if index >= torch.cuda.device_count():
        pytest.skip("needs a second GPU (cuda:1)")
    dev = torch.device("cuda", index)
    call = _busy(dev)
    call()
    torch.cuda.synchronize(dev)
    ms = time_calls(lambda: call, dev, 5)
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize(dev)
        walls.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    call()
    enqueue = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize(dev)
    med, wall = sorted(ms)[2], sorted(walls)[2]
    assert 0.7 * wall < med < 1.1 * wall, (med, wall)
    assert med > 3 * enqueue, "the events timed the enqueue, not the kernels"


def _wall_ms(call, dev, n: int = 5) -> float:
    """Median wall-clock ms of ``call()`` run to completion (synchronised each time)."""
    walls = []
    for _ in range(n):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize(dev)
        walls.append((time.perf_counter() - t0) * 1e3)
    return sorted(walls)[n // 2]


def _enqueue_ms(call, dev) -> float:
    """Host ms to enqueue ``call()`` (no wait for the GPU): what events on an idle stream would read."""
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    call()
    ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize(dev)
    return ms


# A timed median against the same work's wall clock: the events can read no more than the wall (1.1: clock and
# rounding), and a GPU-bound call (the work below; its prefill is also checked to take over 3x its enqueue time)
# reads at least 0.7 of it (the rest is launch and synchronisation latency); events on an idle stream read the
# enqueue time, a third of the wall at most.
EVENTS_OF_WALL = (0.7, 1.1)
# Two GPUs of one node (the same model): the same work times alike within 1.5x either way (clocks and thermals);
# an idle stream's reading is over 5x off.
SAME_GPU_RATIO = 1.5


def test_kernel_timer_on_the_second_device(measured):
    from gac.profiling.timing import TimingProtocol, time_op

    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU (cuda:1)")
    torch.cuda.set_device(0)
    proto = TimingProtocol(warmup=3, iters=10, trials=3, max_buffers=2)
    got = {}
    for i in (1, 0):
        dev = torch.device("cuda", i)
        make = lambda dev=dev: (torch.randn(4096, 4096, device=dev, dtype=torch.float16),)  # noqa: E731
        a = make()[0]
        wall = _wall_ms(lambda a=a: [a @ a for _ in range(proto.iters)], dev) / proto.iters
        got[i] = time_op(make, lambda a: a @ a, dev, proto).median_ms
        measured(f"events_of_wall_cuda{i}", got[i] / wall)
        lo, hi = EVENTS_OF_WALL
        assert lo * wall < got[i] < hi * wall, (i, got[i], wall)  # 4096^3 fp16: ~0.1-0.3 ms on an A100/H100
    measured("cuda1_of_cuda0", got[1] / got[0])
    assert 1 / SAME_GPU_RATIO < got[1] / got[0] < SAME_GPU_RATIO, got


HEAVY_TOKENS = 8192


def _heavy_llama(device: str):
    """A random Llama-3-8B-wide model of four layers in float16: a prefill of 8192 tokens is GPU-bound (~20 TFLOP,
    tens of ms on an H100/H200), so its events time kernels, not launches; tiny's prefill is launch-bound and would
    time the same on an idle stream. (Two layers at 4096 tokens were not enough: on an H200 the prefill took
    10.1 ms of GPU time and the host 5.4 ms to enqueue it.)"""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000, max_position_embeddings=HEAVY_TOKENS)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float16).eval()


def _check_against_the_clock(model, r: dict, dev, measured) -> None:
    x = torch.randint(0, model.config.vocab_size, (r["batch"], r["seq_len"]), device=dev)
    with torch.inference_mode():
        call = lambda: model(input_ids=x, use_cache=False)  # noqa: E731
        call()
        wall, enqueue = _wall_ms(call, dev), _enqueue_ms(call, dev)
    measured(f"events_of_wall_{dev}", r["median_ms"] / wall)
    measured(f"events_of_enqueue_{dev}", r["median_ms"] / enqueue)
    lo, hi = EVENTS_OF_WALL
    assert lo * wall < r["median_ms"] < hi * wall, (r["median_ms"], wall)
    # the events bracket the wall clock of the synchronised call (above); and the work outlasts its enqueue, so an
    # event pair around the enqueue alone could not have given that time
    assert r["median_ms"] > 2 * enqueue, ("the events timed the enqueue", r["median_ms"], enqueue)


def test_prefill_on_cuda_1_records_that_device_and_times_its_work(measured):
    from gac.evaluation.latency import prefill_latency

    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU (cuda:1)")
    torch.cuda.set_device(0)
    got = {}
    for i in (1, 0):
        model = _heavy_llama(f"cuda:{i}")
        r = prefill_latency(model, seq_len=HEAVY_TOKENS, warmup=3, iters=10, trials=2)
        assert r["device"] == f"cuda:{i}" and r["device_name"] == torch.cuda.get_device_name(i)
        _check_against_the_clock(model, r, torch.device("cuda", i), measured)
        got[i] = r["median_ms"]
        del model
        torch.cuda.empty_cache()
    measured("cuda1_of_cuda0", got[1] / got[0])
    assert 1 / SAME_GPU_RATIO < got[1] / got[0] < SAME_GPU_RATIO, got


@pytest.mark.parametrize("d", [64, 107, 112])
def test_the_sdpa_backend_that_runs_in_fp16(d):
    """The dispatcher's choice is the kernel that runs; d=107 runs FlashAttention (padded to 112), not math: the
    README's reading of PyTorch's source (attention.cpp pad_last_dim<8>, sdp_utils.cpp check_head_dim_size_flash)."""
    from gac.evaluation.latency import sdpa_dispatch
    from gac.profiling.kernels import attention_backend, capture_kernels

    q, k, v = (torch.randn(4, 2048, 32, d, device="cuda", dtype=torch.float16).transpose(1, 2) for _ in range(3))
    chosen = sdpa_dispatch(lambda: F.scaled_dot_product_attention(q, k, v), "sdpa")
    kernels = [name for name, _ in capture_kernels(F.scaled_dot_product_attention, (q, k, v), q.device)]
    ran = {attention_backend(n) for n in kernels} - {None} or {"math"}
    assert len(chosen) == 1 and chosen[0] in SDPA_NAMES and ran == set(chosen), (chosen, kernels[:3])
    if d == 107:
        assert chosen == ["flash"]  # efficient and cuDNN reject d % 8 != 0; flash pads it


def test_model_latency_reports_a_real_sdpa_backend_and_times_the_work(measured):
    from gac.evaluation.latency import prefill_latency

    model = _heavy_llama("cuda")
    r = prefill_latency(model, seq_len=HEAVY_TOKENS, warmup=3, iters=10, trials=2)
    assert r["timer"] == "cuda_events" and len(r["sdpa_backend"]) == 1 and r["sdpa_backend"][0] in SDPA_NAMES
    _check_against_the_clock(model, r, torch.device("cuda", torch.cuda.current_device()), measured)


def test_a_job_gpu_peak_is_positive_and_below_its_estimate(tmp_path):
    from omegaconf import OmegaConf

    from gac.jobs.config.command_line import compose_config
    from gac.jobs.config.build import job_from_config
    from gac.jobs.run.memory_fits import check_job_fits
    from gac.jobs.run.recipe import run_job
    from gac.results import ResultsStore

    cfg = OmegaConf.to_container(compose_config([
        "model=tiny", "gpu=auto", "model.dtype=float16", "gpu.profile=measure", "eval=quick", "eval.limit=20",
        "eval.ppl_seq_len=128", "eval.ppl_max_windows=8", "calibration.n_samples=4", "calibration.seq_len=128",
        "seq_len=256", "eval.latency_seq_lens=[256]", f"results_dir={tmp_path / 'r'}"]), resolve=True)
    job = job_from_config(cfg)
    fp = check_job_fits(job.spec)
    rec = run_job(job, ResultsStore(tmp_path / "r"))
    stages = rec["memory"]["stages"]
    assert rec["memory"]["gpu_peak_mb"] > 0 and all(v["gpu_peak_mb"] >= 0 for v in stages.values())
    # what the estimate covers (the model, compression and evaluation; the dimension sweep's rotating input pool,
    # 2 x L2, is not in it)
    peak = max(v["gpu_peak_mb"] for k, v in stages.items() if k != "sweep")
    assert 0 < peak < fp.device_bytes / 2**20, (peak, fp.summary())
    assert rec["provenance"]["device_name"] == torch.cuda.get_device_name()
    assert rec["evaluation"]["latency"]["prefill_ms@256"]["sdpa_backend"][0] in SDPA_NAMES
    from gac.profiling import HardwareProfile
    from gac.profiling.kernels import kernel_tier

    assert rec["profile"] is not None
    (cached,) = (tmp_path / "r" / "cache" / "profiles").iterdir()
    table = HardwareProfile.load(cached).table
    gemms = table[table["op"] != "head_dim"]
    # the kernel names came from the child process and every one has a tier
    assert len(gemms) and (gemms["kernel"] != "").all()
    assert not gemms["kernel"].map(kernel_tier).isin(["unknown", "gemm"]).any(), gemms["kernel"].unique()[:5]


def test_gac_doctor_exits_0_on_a_healthy_node(tmp_path, capsys):
    import json

    from gac.cli import main

    rc = main(["doctor", "--json", str(tmp_path / "d.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads((tmp_path / "d.json").read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["sdpa d=107 fp16"]["data"]["ran"] == "flash"
    gemm = checks["gemm K=4096/4097"]["data"]["points"]
    assert gemm["4096"]["tier"] not in ("unknown", "gemm") and gemm["4097"]["tier"] not in ("unknown", "gemm")
    assert checks["smoke (tiny)"]["status"] == "PASS" and checks["smoke (tiny)"]["data"]["total_s"] < 60
