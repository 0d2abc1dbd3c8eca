"""CUDA-only evaluation paths checked on CPU through the same code (issue 21): the timers record their CUDA events on
the stream of the device the work runs on (cuda:1, not the current device), the SDPA backend comes from PyTorch's
dispatcher without a profiler session, and the chunked perplexity loss equals the unchunked one."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F


class FakeCuda:
    """torch.cuda's timing API, recording which device and stream every call used."""

    def __init__(self):
        self.entered, self.synced, self.events = [], [], []

    def install(self, monkeypatch):
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.stream, self.recorded = None, False
                fake.events.append(self)

            def record(self, stream=None):
                self.stream, self.recorded = stream, True

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 2.5

        @contextlib.contextmanager
        def device(d):
            fake.entered.append(torch.device(d))
            yield

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "device", device)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: SimpleNamespace(device=torch.device(d)))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: fake.synced.append(d))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(L2_cache_size=2**20))
        return self

    def assert_all_on(self, dev):
        assert self.events and all(e.recorded for e in self.events)
        assert {e.stream.device for e in self.events if e.stream is not None} == {dev}, "events on another device"
        assert all(e.stream is not None for e in self.events), "an event on the current device's default stream"
        assert dev in self.entered


CUDA1 = torch.device("cuda", 1)


def test_prefill_timer_records_events_on_the_models_device(monkeypatch):
    from gac.evaluation.latency import time_calls

    fake = FakeCuda().install(monkeypatch)
    ms = time_calls(lambda: (lambda: None), CUDA1, 4)
    assert ms == [2.5] * 4
    fake.assert_all_on(CUDA1)
    assert CUDA1 in fake.synced


def test_kernel_timer_records_events_on_the_inputs_device(monkeypatch):
    from gac.profiling.timing import TimingProtocol, time_op

    fake = FakeCuda().install(monkeypatch)
    t = time_op(lambda: (torch.zeros(4),), lambda x: x + 1, CUDA1, TimingProtocol(warmup=1, iters=3, trials=2))
    assert t.median_ms == pytest.approx(2.5 / 3)
    fake.assert_all_on(CUDA1)


def test_bench_visit_times_on_the_bench_device(monkeypatch):
    """The side-by-side bench times through the same time_calls."""
    import gac.evaluation.bench as bench

    fake = FakeCuda().install(monkeypatch)
    model = lambda **k: None  # noqa: E731
    p = {"timer": "cuda_events", "warmup": 1, "iters": 2}
    out, wall = {(1, 8): []}, {(1, 8): []}
    bench._visit(bench._Cell(model), {(1, 8): None}, None, p, CUDA1, "resident", None, out, [], wall)
    assert out[(1, 8)] == [2.5]
    fake.assert_all_on(CUDA1)


# ------------------------------------------------------------------------------------------ SDPA dispatcher


def test_sdpa_backend_comes_from_the_dispatcher_without_a_profiler(monkeypatch):
    import torch.profiler

    from gac.evaluation.latency import backend_of_choice, prefill_latency
    from gac.models import load_model

    def no_profiler(*a, **k):
        raise AssertionError("a profiler session was opened during a latency measurement")

    monkeypatch.setattr(torch.profiler, "profile", no_profiler)
    model, _ = load_model("tiny")
    r = prefill_latency(model, seq_len=32, warmup=0, iters=1, trials=1)
    want = backend_of_choice(torch._fused_sdp_choice(*(torch.randn(1, 4, 32, 64),) * 3, None, 0.0, True), "cpu")
    assert r["sdpa_backend"] == [want] and want in ("flash (cpu)", "math")
    model.config._attn_implementation = "eager"
    assert prefill_latency(model, seq_len=32, warmup=0, iters=1, trials=1)["sdpa_backend"] == [
        "none (eager attention)"]


def test_sdpa_dispatch_follows_a_forced_backend():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gac.evaluation.latency import sdpa_dispatch

    q = torch.randn(1, 2, 16, 8)
    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_dispatch(lambda: F.scaled_dot_product_attention(q, q, q), None) == ["math"]
    assert sdpa_dispatch(lambda: None, "sdpa") == ["none (sdpa attention)"]


# ------------------------------------------------------------------------------------------ chunked loss


@pytest.fixture(scope="module")
def tiny():
    from gac.models import load_model

    return load_model("tiny")[0]


def _unchunked(model, x):
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                           reduction="sum")


@pytest.mark.parametrize("chunk", [1, 7, 64, None])
def test_chunked_loss_equals_the_unchunked_one(tiny, chunk):
    from gac.evaluation.perplexity import window_nll

    x = torch.randint(0, tiny.config.vocab_size, (3, 96), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(window_nll(tiny, x, chunk).float(), _unchunked(tiny, x), rtol=1e-5, atol=0)


def test_models_without_a_plain_head_are_scored_window_by_window(tiny, monkeypatch):
    import importlib

    perplexity = importlib.import_module("gac.evaluation.perplexity")  # the module (the package exports a function)
    x = torch.randint(0, tiny.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    calls = []
    real = type(tiny).forward

    def counting(self, *a, **k):
        calls.append(k["input_ids"].shape[0])
        return real(self, *a, **k)

    monkeypatch.setattr(perplexity, "_plain_head", lambda model: None)  # as for a family gac has no layout for
    monkeypatch.setattr(type(tiny), "forward", counting)
    with torch.inference_mode():
        got = perplexity.window_nll(tiny, x, 5)
    assert calls == [1, 1]  # one window at a time: [L, vocab] logits at most
    monkeypatch.setattr(type(tiny), "forward", real)
    with torch.inference_mode():
        torch.testing.assert_close(got.float(), _unchunked(tiny, x), rtol=1e-5, atol=0)


def test_perplexity_protocol_unchanged_by_the_chunks(tiny):
    from gac.evaluation.perplexity import perplexity_of_ids

    ids = torch.randint(0, tiny.config.vocab_size, (1000,), generator=torch.Generator().manual_seed(2))
    a = perplexity_of_ids(tiny, ids, seq_len=128, batch_size=4)
    b = perplexity_of_ids(tiny, ids, seq_len=128, batch_size=4, chunk_tokens=3)
    assert a["n_windows"] == 7 and a["ppl"] == pytest.approx(b["ppl"], rel=1e-6)


def test_nvidia_smi_is_asked_about_the_gpu_torch_uses(monkeypatch):
    """With CUDA_VISIBLE_DEVICES=3, torch's cuda:0 is the machine's GPU 3: nvidia-smi is asked by UUID."""
    import shutil
    import subprocess

    import gac.evaluation.bench_device as bench

    asked = []

    def run(cmd, **k):
        asked.append(cmd[cmd.index("-i") + 1])
        return subprocess.CompletedProcess(cmd, 0, "NVIDIA H100 80GB HBM3, 550.54, 1980 MHz, 2619 MHz, 1980 MHz, "
                                                    "2619 MHz, 700 W, 35, Enabled, Default\n", "")

    monkeypatch.setattr(shutil, "which", lambda exe: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", run)
    props = SimpleNamespace(uuid="8f3b2c1e-0000-4000-8000-123456789abc")
    info = bench._nvidia_smi(bench._smi_id(props, 0))
    assert asked == ["GPU-8f3b2c1e-0000-4000-8000-123456789abc"] and info["nvidia_smi.clocks.sm"] == "1980 MHz"
    assert bench._smi_id(SimpleNamespace(), 2) == "2"


def test_the_memory_estimate_uses_the_loss_chunk_perplexity_uses():
    import importlib

    from gac.compression import footprint

    assert footprint.LOSS_CHUNK_BYTES == importlib.import_module("gac.evaluation.perplexity").LOSS_CHUNK_BYTES
