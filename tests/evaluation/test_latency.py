"""Latency harness: warm-up and iterations honoured, positive medians, context recorded, CUDA path on GPUs."""

from __future__ import annotations

import pytest
import torch

from gac.errors import GacError
from gac.evaluation import decode_latency, prefill_latency


class _Counter:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self)

    def __call__(self, *args):
        self.n += 1


def test_prefill_honours_warmup_iters_trials(tiny):
    model, _ = tiny
    c = _Counter(model)
    try:
        r = prefill_latency(model, batch=2, seq_len=32, warmup=2, iters=5, trials=3, detect_backend=False)
    finally:
        c.handle.remove()
    assert c.n == 3 * (2 + 5)
    assert r["n_samples"] == 15 and len(r["trial_medians_ms"]) == 3
    assert r["median_ms"] > 0 and r["min_trial_ms"] <= r["median_ms"] <= r["max_trial_ms"]
    assert (r["batch"], r["seq_len"], r["warmup"], r["iters"], r["trials"]) == (2, 32, 2, 5, 3)
    # the one clock rule: thread CPU time on one torch thread, else the wall clock
    assert r["timer"] == ("thread_time" if torch.get_num_threads() == 1 else "perf_counter")
    assert r["device"] == "cpu" and r["dtype"] == "float32"
    assert r["tokens_per_s"] == pytest.approx(2 * 32 / (r["median_ms"] / 1e3))


def test_decode_counts_one_forward_per_token_and_reports_ms_per_token(tiny):
    model, _ = tiny
    c = _Counter(model)
    try:
        r = decode_latency(model, prompt_len=16, new_tokens=4, warmup=1, iters=2, trials=2, detect_backend=False)
    finally:
        c.handle.remove()
    assert c.n == 2 * (1 + 2) * (1 + 4)  # trials x (warm-up + measured) x (prefill + new tokens)
    assert r["n_samples"] == 4 and r["unit"] == "ms per token" and r["median_ms"] > 0
    assert r["tokens_per_s"] == pytest.approx(1e3 / r["median_ms"])


def test_the_sdpa_backend_actually_used_is_recorded(tiny):
    model, _ = tiny
    r = prefill_latency(model, seq_len=16, warmup=0, iters=1, trials=1)
    assert r["attn_implementation"] == "sdpa"
    assert r["sdpa_backend"] and r["sdpa_backend"][0] in {"flash (cpu)", "math", "efficient", "flash", "cudnn"}
    assert r["device_name"]


def test_eager_attention_reports_no_sdpa(tiny):
    model, _ = tiny
    model.config._attn_implementation = "eager"
    try:
        r = prefill_latency(model, seq_len=16, warmup=0, iters=1, trials=1)
    finally:
        model.config._attn_implementation = "sdpa"
    assert r["sdpa_backend"] == ["none (eager attention)"]


def test_cpu_defaults_are_fewer_than_the_cuda_protocol():
    from gac.evaluation.latency import DEFAULTS

    assert DEFAULTS["prefill"]["cuda"] == (50, 200, 3)  # the paper's protocol
    assert all(c <= g for c, g in zip(DEFAULTS["prefill"]["cpu"], DEFAULTS["prefill"]["cuda"], strict=True))


def test_bad_latency_arguments(tiny):
    model, _ = tiny
    with pytest.raises(GacError, match="above the model's maximum"):
        prefill_latency(model, seq_len=model.config.max_position_embeddings + 1)
    with pytest.raises(GacError, match="above the model's maximum"):
        decode_latency(model, prompt_len=model.config.max_position_embeddings, new_tokens=8)
    with pytest.raises(GacError, match="iters >= 1"):
        prefill_latency(model, seq_len=8, iters=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_events_protocol(tiny):
    from gac.models import load_model

    model, _ = load_model("tiny", dtype="fp16", device="cuda")
    r = prefill_latency(model, seq_len=1024)
    assert r["timer"] == "cuda_events" and (r["warmup"], r["iters"], r["trials"]) == (50, 200, 3)
    assert r["n_samples"] == 600 and r["median_ms"] > 0 and r["dtype"] == "float16"
    assert len(r["sdpa_backend"]) == 1 and r["sdpa_backend"][0] in {"flash", "efficient", "cudnn", "math"}
    d = decode_latency(model, new_tokens=32)
    assert d["timer"] == "cuda_events" and d["median_ms"] > 0
