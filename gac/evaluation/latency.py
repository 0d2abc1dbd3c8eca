"""Prefill and decode latency of a causal LM.

Protocol (the paper's, on CUDA): CUDA events around every measured call, 50 warm-up calls, 200 measured calls,
3 trials; the result is the median over trials of each trial's median, with the spread across trials. On CPU the
same harness takes the clock of :func:`timer_for` with fewer iterations (defaults below).

This module holds the timing rules every measurement of gac follows (a job's latency, the bench, a latency plan's
tables and their kernels): :data:`DEFAULTS`, the warm-up and iteration counts, and :func:`timer_for`, the clock.

* prefill: one forward pass over ``batch x seq_len`` random tokens (``model(input_ids, use_cache=False)``, full
  logits), default batch 1, S=1024.
* decode: ms per generated token with a KV cache: an untimed prefill of ``prompt_len`` tokens, then ``new_tokens``
  greedy steps of one token each (``DynamicCache``), timed as a whole and divided by ``new_tokens``; a PaLU model
  with the latent cache decodes with it (``kv_cache``: ``latent``, :mod:`gac.compression.latent_cache`).

Every result records the device name, dtype, attention implementation and the SDPA backend actually used: one
extra, untimed call with the same shapes, during which every ``scaled_dot_product_attention`` call is put to
PyTorch's own dispatcher (``torch._fused_sdp_choice``, the function ``scaled_dot_product_attention`` itself calls
to pick its backend) with the call's own arguments: flash, efficient, cudnn or math. No profiler session is
opened here: on CUDA one would leave CUPTI attached and slow every kernel timed after it (pytorch issue 144455).
"""

from __future__ import annotations

import logging
import platform
import statistics
import time
from collections.abc import Callable

from gac.devices import model_device
from gac.dtypes import dtype_str
from gac.errors import GacError

log = logging.getLogger(__name__)

#: how many calls every timing of gac makes by default, one table: kind -> device type -> (warm-up calls, timed calls,
#: trials); the bench's entry holds its protocol's fields (gac.evaluation.bench.Protocol)
DEFAULTS = {
    "prefill": {"cuda": (50, 200, 3), "cpu": (3, 10, 3)},  # a job's prefill latency: the paper's protocol on CUDA
    "decode": {"cuda": (5, 20, 3), "cpu": (1, 3, 3)},  # a job's decode latency (whole generations)
    # a latency table's kernels (gac.profiling.timing.TimingProtocol: paper() on CUDA, quick() on a CPU)
    "kernel": {"cuda": (50, 200, 3), "cpu": (3, 10, 3)},
    # the uncompressed prefill a measured latency plan's fixed_ms comes from (gac.jobs.run.latency_plan): one trial
    "plan_prefill": {"cuda": (3, 15, 1), "cpu": (3, 15, 1)},
    # the bench's visits: rounds, warm-up and timed calls per visit, decode, torch threads on a CPU
    "bench": {"cuda": {"rounds": 30, "warmup": 10, "iters": 20, "decode_warmup": 1, "decode_iters": 3, "threads": None},
              "cpu": {"rounds": 15, "warmup": 2, "iters": 5, "decode_warmup": 1, "decode_iters": 2, "threads": 1}},
}
#: the clocks of a CPU timing, by the name a result records (:func:`timer_for`)
#: the CPU clocks the rule (:func:`timer_for`) chooses between, by name: in nanoseconds, and in seconds
CPU_CLOCKS_NS = {"thread_time": time.thread_time_ns, "perf_counter": time.perf_counter_ns}
CPU_CLOCKS = {name: getattr(time, name) for name in CPU_CLOCKS_NS}


def timer_for(device, threads: int | None = None) -> str:
    """The clock a timing on ``device`` uses, the one rule of gac: ``cuda_events`` on a GPU; on a CPU this thread's
    CPU time (``thread_time``) when torch computes on one thread (``threads``, default torch's own count): all the
    work is then this thread's, and a loaded, shared machine slows the wall clock but not the number; with more
    threads their work is not this thread's, so the wall clock (``perf_counter``). A job's CPU latency thus counts
    wall time at the job's thread count, a latency plan's tables (timed on one thread,
    :func:`gac.profiling.timing.cpu_thread_clock`) and ``gac bench`` (one thread by default) thread CPU time."""
    import torch

    if str(getattr(device, "type", device)).split(":")[0] == "cuda":
        return "cuda_events"
    return "thread_time" if (torch.get_num_threads() if threads is None else threads) == 1 else "perf_counter"

# profiler op name -> SDPA backend (first match in this order wins per call)
_SDPA_OPS = (
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash (cpu)"),
    ("aten::_scaled_dot_product_flash_attention", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "efficient"),
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("aten::_scaled_dot_product_attention_math", "math"),
)


def device_name(device) -> str:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def profile_call(fn: Callable[[], object], device=None):
    """A ``torch.profiler`` trace of one call of ``fn``: CPU activities, plus CUDA kernels on a CUDA device."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize(device)
    return prof


def sdpa_from_trace(prof, attn_implementation: str | None) -> list[str]:
    """The SDPA backends a profiler trace shows (flash, efficient, cudnn, math, ...)."""
    names = {e.key for e in prof.key_averages()}
    found = []
    for op, backend in _SDPA_OPS:
        if op in names and backend not in found:
            if backend == "flash" and "flash (cpu)" in found:
                continue
            found.append(backend)
    if not found:
        sdpa_called = any("scaled_dot_product" in n for n in names)
        found = ["unknown (sdpa called)"] if sdpa_called else [f"none ({attn_implementation or 'custom'} attention)"]
    return found


_CHOICE_NAMES = (("MATH", "math"), ("FLASH_ATTENTION", "flash"), ("EFFICIENT_ATTENTION", "efficient"),
                 ("CUDNN_ATTENTION", "cudnn"), ("OVERRIDEABLE", "overrideable"))


def backend_of_choice(idx: int, device_type: str = "cuda") -> str:
    """The name of a ``torch._fused_sdp_choice`` result (an ``SDPBackend`` value); on a CPU, flash is
    ``"flash (cpu)"`` (ATen's own CPU kernel, nothing like FlashAttention-2's CUDA templates)."""
    from torch.nn.attention import SDPBackend

    for enum_name, name in _CHOICE_NAMES:
        enum = getattr(SDPBackend, enum_name, None)
        if enum is not None and int(enum.value) == int(idx):
            return "flash (cpu)" if name == "flash" and device_type == "cpu" else name
    return f"unknown ({idx})"


def _ask_dispatcher(args, kwargs) -> str:
    import torch

    q, k, v = args[:3]
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
    causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
    extra = {"scale": kwargs.get("scale", args[6] if len(args) > 6 else None)}
    gqa = kwargs.get("enable_gqa", args[7] if len(args) > 7 else False)
    if gqa:
        extra["enable_gqa"] = True  # torch >= 2.5; older ones never receive it (transformers repeats K/V there)
    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None:
        return "unknown (sdpa called)"
    try:
        idx = choice(q, k, v, mask, dropout, causal, **extra)
    except Exception as e:  # a private API: any failure means "cannot tell", never a failed measurement
        log.debug("torch._fused_sdp_choice failed: %s", e)
        return "unknown (sdpa called)"
    return backend_of_choice(int(idx), q.device.type)


def sdpa_dispatch(fn: Callable[[], object], attn_implementation: str | None) -> list[str]:
    """The SDPA backends one call of ``fn`` runs, in call order without repeats: every
    ``scaled_dot_product_attention`` call inside it is put to PyTorch's dispatcher with its own arguments (module
    docstring). ``["none (eager attention)"]`` when ``fn`` calls no SDPA."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    found: list[str] = []

    class _Ask(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                name = _ask_dispatcher(args, kwargs)
                if name not in found:
                    found.append(name)
            return func(*args, **kwargs)

    with _Ask():
        fn()
    return found or [f"none ({attn_implementation or 'custom'} attention)"]


def sdpa_backends(fn: Callable[[], object], attn_implementation: str | None) -> list[str]:
    """The SDPA backends ``fn`` actually runs (:func:`sdpa_dispatch`; no profiler session)."""
    return sdpa_dispatch(fn, attn_implementation)


def top_kernels(prof, device, n: int = 5) -> list[dict]:
    """The ``n`` kernels that took the most time in a trace: CUDA kernels on a GPU, CPU ops by self time on a CPU.

    Each: ``{"name", "ms", "pct", "calls"}`` (``ms``: total self time in the traced call, ``pct``: of the summed
    self time of all kernels / ops).
    """
    import torch

    cuda = torch.device(device).type == "cuda"
    rows = []
    for e in prof.key_averages():
        if cuda:
            if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0.0)
        else:
            us = e.self_cpu_time_total
        if us and us > 0:
            rows.append((e.key, float(us), int(e.count)))
    total = sum(us for _, us, _ in rows) or 1.0
    rows.sort(key=lambda r: -r[1])
    return [{"name": k, "ms": us / 1e3, "pct": 100.0 * us / total, "calls": c} for k, us, c in rows[:n]]


def _resolve(kind: str, device, warmup, iters, trials) -> tuple[int, int, int]:
    dw, di, dt = DEFAULTS[kind]["cuda" if device.type == "cuda" else "cpu"]
    warmup, iters, trials = (dw if warmup is None else int(warmup), di if iters is None else int(iters),
                             dt if trials is None else int(trials))
    if warmup < 0 or iters < 1 or trials < 1:
        raise GacError(f"latency needs warmup >= 0, iters >= 1, trials >= 1 (got {warmup}, {iters}, {trials})")
    return warmup, iters, trials


def time_calls(step: Callable[[], Callable[[], object]], device, n: int, clock: Callable[[], float] | None = None,
               wall: list | None = None) -> list[float]:
    """``n`` timed calls (ms): ``step()`` does untimed setup and returns the callable to time.

    On CUDA every call sits between two CUDA events, read after one synchronize at the end (and one before the
    first, so earlier queued work is not counted); on CPU each call is timed with ``clock`` (default: the clock of
    :func:`timer_for`), and ``wall`` (a list) also receives each call's ``perf_counter`` time.
    """
    import torch

    if device.type == "cuda":
        # the events go on the stream of the device the work runs on: an event recorded on the current device's
        # stream while the model runs on another (cuda:1) times an idle stream, i.e. the host's enqueue time
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device)
            torch.cuda.synchronize(device)
            pairs = []
            for _ in range(n):
                timed = step()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                timed()
                end.record(stream)
                pairs.append((start, end))
            torch.cuda.synchronize(device)
            return [s.elapsed_time(e) for s, e in pairs]
    clock = clock or CPU_CLOCKS[timer_for(device)]
    samples = []
    for _ in range(n):
        timed = step()
        w0, t0 = time.perf_counter(), clock()
        timed()
        t1, w1 = clock(), time.perf_counter()
        samples.append((t1 - t0) * 1e3)
        if wall is not None:
            wall.append((w1 - w0) * 1e3)
    return samples


def measure(step: Callable[[], Callable[[], object]], device, warmup: int, iters: int, trials: int,
            threads: int | None = None) -> dict:
    """Time ``timed`` calls: ``step()`` does untimed setup and returns the callable to time.

    Each trial: ``warmup`` untimed calls, then ``iters`` calls timed by :func:`time_calls` with the clock of
    :func:`timer_for` at ``threads`` (default torch's own count). Returns per-trial medians and all samples (ms).
    """
    timer = timer_for(device, threads)
    clock = CPU_CLOCKS.get(timer)
    trial_samples: list[list[float]] = []
    for _ in range(trials):
        for _ in range(warmup):
            step()()
        trial_samples.append(time_calls(step, device, iters, clock=clock))
    medians = [statistics.median(s) for s in trial_samples]
    flat = sorted(x for s in trial_samples for x in s)
    q = statistics.quantiles(flat, n=4) if len(flat) >= 2 else [flat[0]] * 3
    med = statistics.median(medians)
    return {
        "median_ms": med,
        "trial_medians_ms": medians,
        "min_trial_ms": min(medians),
        "max_trial_ms": max(medians),
        # across trials: None from a single trial (no spread to speak of, not "0.0%")
        "spread_pct": None if len(medians) < 2 else (max(medians) - min(medians)) / med * 100 if med > 0 else 0.0,
        "p25_ms": q[0],
        "p75_ms": q[2],
        "n_samples": len(flat),
        "timer": timer,
    }


def _context(model, device) -> dict:
    import torch

    dtype = next(model.parameters()).dtype
    cfg = getattr(model, "config", None)
    return {
        "device": str(device),
        "device_name": device_name(device),
        "dtype": dtype_str(dtype),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
    }


def _check_len(model, n: int, what: str) -> None:
    from gac.evaluation.perplexity import model_max_length

    limit = model_max_length(model)
    if limit is not None and n > limit:
        raise GacError(f"{what}={n} is above the model's maximum sequence length ({limit}); use at most {limit}")


def random_ids(model, batch: int, n: int, seed: int, device):
    import torch

    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or 32000
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, n), generator=g).to(device)


def torch_engine() -> dict:
    """How a result timed through the model itself (PyTorch eager) names its engine, as an engine's ``describe()``
    names the others (:mod:`gac.engines`)."""
    import torch

    return {"name": "torch", "version": torch.__version__}


def prefill_latency(model, batch: int = 1, seq_len: int = 1024, warmup: int | None = None, iters: int | None = None,
                    trials: int | None = None, seed: int = 0, detect_backend: bool = True, engine=None) -> dict:
    """Prefill latency (ms) of one forward over ``batch x seq_len`` tokens; see the module docstring.

    ``warmup/iters/trials`` default to 50/200/3 on CUDA and 3/10/3 on CPU. ``engine``: a
    :class:`gac.engines.Engine` of ``model`` whose ``prefill_call`` is timed instead of the model's own forward
    (the same inputs, protocol and clock rule at the engine's threads); the result's ``engine`` names it.
    """
    import torch

    if batch < 1 or seq_len < 1:
        raise GacError(f"prefill needs batch >= 1 and seq_len >= 1 (got {batch}, {seq_len})")
    _check_len(model, seq_len, "seq_len")
    device = model_device(model)
    warmup, iters, trials = _resolve("prefill", device, warmup, iters, trials)
    x = random_ids(model, batch, seq_len, seed, device)
    model.eval()

    def call():
        return model(input_ids=x, use_cache=False)

    eager = engine is None or engine.name == "torch"
    if not eager:
        call = engine.prefill_call(x)
    with torch.inference_mode():
        res = measure(lambda: call, device, warmup, iters, trials, threads=None if eager else engine.threads)
        ctx = _context(model, device)
        ctx["sdpa_backend"] = sdpa_backends(call, ctx["attn_implementation"]) if detect_backend and eager else None
    if not eager:  # what ran the forward: the engine's threads and weights' type, not torch's
        ctx.update(threads=engine.threads, dtype=engine.dtype, attn_implementation=None)
    out = {"kind": "prefill", "batch": batch, "seq_len": seq_len, "warmup": warmup, "iters": iters, "trials": trials,
           **res, **ctx, "engine": torch_engine() if engine is None else engine.describe(),
           "tokens_per_s": batch * seq_len / (res["median_ms"] / 1e3)}
    spread = "n=1 trial" if out["spread_pct"] is None else f"spread {out['spread_pct']:.1f}% over {trials} trials"
    log.info("prefill b=%d S=%d: %.3f ms median (%s, %s, %s, sdpa %s)", batch, seq_len, out["median_ms"], spread,
             out["device_name"], out["dtype"], out["sdpa_backend"])
    return out


def decode_step(model, prompt, new_tokens: int) -> Callable[[], Callable[[], object]]:
    """One decode iteration for :func:`measure`: an untimed prefill of ``prompt`` (setup), returning the timed part,
    ``new_tokens`` greedy steps of one token each with the KV cache (``DynamicCache``)."""

    def step():
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        state = {"cache": out.past_key_values, "tok": out.logits[:, -1:].argmax(-1)}

        def generate():
            for _ in range(new_tokens):
                o = model(input_ids=state["tok"], past_key_values=state["cache"], use_cache=True, logits_to_keep=1)
                state["cache"], state["tok"] = o.past_key_values, o.logits[:, -1:].argmax(-1)

        return generate

    return step


def decode_latency(model, batch: int = 1, prompt_len: int = 128, new_tokens: int = 128, warmup: int | None = None,
                   iters: int | None = None, trials: int | None = None, seed: int = 0,
                   detect_backend: bool = True) -> dict:
    """Decode latency: ms per new token with a KV cache over ``new_tokens`` greedy steps after a ``prompt_len`` prefill.

    One iteration = an untimed prefill plus ``new_tokens`` timed steps; ``warmup/iters/trials`` count iterations and
    default to 5/20/3 on CUDA and 1/3/3 on CPU. ``median_ms`` is per token.
    """
    import torch

    from gac.compression.latent_cache import has_latent_cache

    if batch < 1 or prompt_len < 1 or new_tokens < 1:
        raise GacError(f"decode needs batch, prompt_len, new_tokens >= 1 (got {batch}, {prompt_len}, {new_tokens})")
    _check_len(model, prompt_len + new_tokens, "prompt_len + new_tokens")
    device = model_device(model)
    warmup, iters, trials = _resolve("decode", device, warmup, iters, trials)
    prompt = random_ids(model, batch, prompt_len, seed, device)
    model.eval()

    step = decode_step(model, prompt, new_tokens)
    with torch.inference_mode():
        res = measure(step, device, warmup, iters, trials)
        ctx = _context(model, device)
        ctx["sdpa_backend"] = sdpa_backends(step(), ctx["attn_implementation"]) if detect_backend else None
    per_tok = {k: (v / new_tokens if k.endswith("_ms") and isinstance(v, float) else v) for k, v in res.items()}
    per_tok["trial_medians_ms"] = [v / new_tokens for v in res["trial_medians_ms"]]
    out = {"kind": "decode", "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "warmup": warmup,
           "iters": iters, "trials": trials, **per_tok, **ctx, "unit": "ms per token",
           "tokens_per_s": batch / (per_tok["median_ms"] / 1e3), "cache": "DynamicCache",
           "kv_cache": "latent" if has_latent_cache(model) else "full"}  # PaLU's codes, or the K/V themselves
    log.info("decode b=%d prompt=%d new=%d: %.3f ms/token median (%s, %s)", batch, prompt_len, new_tokens,
             out["median_ms"], out["device_name"], out["dtype"])
    return out
