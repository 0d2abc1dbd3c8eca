"""Side-by-side latency: every variant of a sweep measured in one process, on one device, interleaved.

A per-job latency is measured alone, at its own time, on whatever node the job got; the ratio of two such numbers
mixes the variants with the drift and the neighbours of two moments. Here the ratio is the measured quantity:

* **variants** are :class:`~gac.compression.structure.Structure` s (a plan's shapes with random weights; latency
  depends on shapes, not values), built once on the device; the first is the uncompressed baseline;
* **rounds**: ``R`` rounds; each round visits every variant exactly once, in a freshly shuffled order
  (:func:`gac.evaluation.bench_stats.round_orders`, seeded); a visit = its own ``warmup`` untimed calls, then ``iters`` timed calls per
  (batch, S) point; the visit's sample is the median of its timed calls. Drift and noisy neighbours therefore hit
  every variant alike, and no variant always runs after the same one;
* **timer**: CUDA events around each call, read after one synchronize per visit (:func:`time_calls`); on CPU
  ``perf_counter``;
* **statistics**: per variant the median of its ``R`` visit samples; the ratio to the baseline (and to its
  unaligned sibling) is the ratio of the two medians, with a **paired bootstrap** 95% interval over rounds
  (:func:`gac.stats.paired_ratio_ci`: rounds resampled with replacement, the same rounds for both sides, the ratio of the
  medians of the resampled rounds, percentiles 2.5 / 97.5, fixed seed);
* **FLOPs** from the shapes (:mod:`gac.evaluation.flops`) and the *alignment efficiency* = (FLOPs ratio to the
  baseline) / (latency ratio to the baseline): 1.0 is as fast as the FLOPs allow, below 1 slower;
* **kernels**: one extra, untimed call per variant and point under ``torch.profiler`` gives the top kernels by
  time (CUDA kernels on a GPU, CPU ops by self time on a CPU) and the SDPA backend actually used;
* **memory**: all variants stay resident on the device when their estimated size (unique weights, shared tensors
  counted once, plus activations at the largest point) fits in 80% of its free memory; otherwise they live on the
  host and each is moved to the device for its visit, outside the timed region (``memory_mode`` says which).

On a CPU the bench says so: CPU latency says nothing about GPU kernels. The CPU protocol pins torch to one thread
by default (two threads on a shared 2-core machine measured up to 4x slower medians whenever a neighbour woke up;
docs/bench.md).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.evaluation.bench_device import check_device, device_info
from gac.evaluation.bench_stats import round_orders, summarise
from gac.evaluation.latency import DEFAULTS as TIMING_DEFAULTS
from gac.evaluation.latency import timer_for
from gac.progress import progress

log = logging.getLogger(__name__)

#: device type -> protocol defaults (rounds, warm-up calls per visit, timed calls per visit): the timing table's
DEFAULTS = TIMING_DEFAULTS["bench"]
MEMORY_MODES = ("auto", "resident", "swap")
TIMERS = ("auto", "wall", "cpu")
MAX_BOOTSTRAP = 1_000_000  # paired bootstrap resamples: its table holds resamples x rounds numbers
MEMORY_FRACTION = 0.8  # variants stay resident when their estimate fits in this share of the free device memory


@dataclass
class Variant:
    """One model to measure: a label, its structure, and where it came from."""

    label: str
    structure: object  # gac.compression.structure.Structure
    key: str | None = None  # the results-store record it measures (None: a plan file, or the built baseline)
    info: dict = field(default_factory=dict)  # job fields (compressor, strategy, ratio, proxy, ...)
    sibling: str | None = None  # label of its unaligned sibling in the same bench


@dataclass
class Protocol:
    """What is measured and how; ``None`` takes the device default (:data:`DEFAULTS`)."""

    points: tuple = ((1, 1024),)  # (batch, seq_len) prefill points; the first is the main one
    rounds: int | None = None
    warmup: int | None = None
    iters: int | None = None
    decode_tokens: int = 0  # > 0: also decode ms/token over this many new tokens after a decode_prompt prefill
    decode_prompt: int = 128
    decode_warmup: int | None = None
    decode_iters: int | None = None
    seed: int = 0
    bootstrap: int = 2000
    threads: int | None = None  # CPU: torch threads during the bench (default 1)
    memory: str = "auto"
    profile: bool = True
    top: int = 5
    timer: str = "auto"  # auto: CUDA events on a GPU; on a CPU thread CPU time with 1 thread, else wall clock
    engines: tuple = ("torch",)  # what runs each variant's prefill (gac.engines); several: an axis of the bench

    def resolved(self, device_type: str) -> dict:
        from gac.checks import check_seed, check_threads

        d = DEFAULTS["cuda" if device_type == "cuda" else "cpu"]
        out = {k: (getattr(self, k) if getattr(self, k) is not None else d[k])
               for k in ("rounds", "warmup", "iters", "decode_warmup", "decode_iters", "threads")}
        points = []
        for p in self.points:
            try:
                b, s = (int(x) for x in p)
            except (TypeError, ValueError):
                raise GacError(f"bench point {p!r} is not (batch, seq_len); write points like [[1, 1024], [4, 512]]") from None
            if b < 1 or s < 1:
                raise GacError(f"bench point (batch {b}, seq_len {s}) needs batch >= 1 and seq_len >= 1")
            if (b, s) not in points:
                points.append((b, s))
        if not points:
            raise GacError("the bench needs at least one (batch, seq_len) point")
        given = {**out, "decode_tokens": self.decode_tokens, "decode_prompt": self.decode_prompt}
        for k, lo in (("rounds", 2), ("warmup", 0), ("iters", 1), ("decode_warmup", 0), ("decode_iters", 1),
                      ("decode_tokens", 0), ("decode_prompt", 1)):
            if isinstance(given[k], bool) or not isinstance(given[k], int) or given[k] < lo:
                raise GacError(f"bench {k} must be an integer >= {lo}, got {given[k]!r}")
        if out["threads"] is not None:
            out["threads"] = check_threads(out["threads"], "bench threads")
        if self.timer not in TIMERS:
            raise GacError(f"bench timer {self.timer!r} is not one of {', '.join(TIMERS)}")
        timer = self.timer
        if device_type == "cuda":
            if timer == "cpu":
                raise GacError("timer=cpu measures CPU work; on a GPU the bench times with CUDA events (timer=auto)")
            timer = "cuda_events"
        elif timer == "auto":
            timer = timer_for(device_type, out["threads"])
        elif timer == "cpu":
            if out["threads"] != 1:
                raise GacError("timer=cpu (thread CPU time) needs threads=1: with more threads it would sum their work")
            timer = "thread_time"
        else:
            timer = "perf_counter"
        if self.memory not in MEMORY_MODES:
            raise GacError(f"bench memory mode {self.memory!r} is not one of {', '.join(MEMORY_MODES)}")
        if isinstance(self.bootstrap, bool) or not isinstance(self.bootstrap, int) or not (
                100 <= self.bootstrap <= MAX_BOOTSTRAP):
            raise GacError(f"bench bootstrap must be a whole number of resamples from 100 to {MAX_BOOTSTRAP:,} (its "
                           f"table is resamples x rounds numbers), got {self.bootstrap!r}")
        engines = tuple(str(e) for e in (self.engines or ()))
        if not engines or len(set(engines)) != len(engines):
            raise GacError(f"bench engines must be one or more distinct engines, got {list(engines)}")
        if engines != ("torch",):
            other = next(e for e in engines if e != "torch")
            if device_type != "cpu":
                raise GacError(f"engine {other} runs on the CPU here; bench it with --device cpu (or --engine torch)")
            if self.decode_tokens:
                raise GacError(f"decode is timed in PyTorch only; engine {other} measures prefill: drop "
                               f"--decode-tokens (or bench --engine torch)")
        return {**out, "points": points, "timer": timer, "engines": engines, "decode_tokens": int(self.decode_tokens),
                "decode_prompt": int(self.decode_prompt), "seed": check_seed(self.seed, "bench seed"),
                "bootstrap": int(self.bootstrap),
                "memory": self.memory, "profile": bool(self.profile), "top": int(self.top)}


# ---------------------------------------------------------------------------------------------- memory
def _param_table(model) -> dict[str, tuple]:
    return {n: (tuple(p.shape), p.dtype, p.numel() * p.element_size()) for n, p in model.named_parameters()}


def memory_estimate(variants: Sequence[Variant], points) -> dict:
    """Bytes of every variant's weights with the tensors it shares with the baseline counted once, and an estimate
    of the activations of the largest point (logits, MLP and attention intermediates)."""
    base = _param_table(variants[0].structure.skeleton())
    per = {variants[0].label: sum(b for _, _, b in base.values())}
    for v in variants[1:]:
        own = _param_table(v.structure.skeleton())
        per[v.label] = sum(b for n, (shape, dt, b) in own.items() if base.get(n, (None, None))[:2] != (shape, dt))
    cfg = variants[0].structure.config
    elt = variants[0].structure.dtype.itemsize
    hidden, inter = int(cfg.hidden_size), int(getattr(cfg, "intermediate_size", 4 * cfg.hidden_size))
    vocab, heads = int(cfg.vocab_size), int(cfg.num_attention_heads)
    act = max(b * s * (2 * vocab + 4 * inter + 8 * hidden) * elt + b * heads * s * s * elt for b, s in points)
    full = max(per[variants[0].label] + (per[v.label] if i else 0) for i, v in enumerate(variants))
    return {"weights": sum(per.values()), "per_variant": per, "activations": int(act), "largest_model": full}


def _host_available() -> int | None:
    """Bytes this process may still take on the host: MemAvailable, bounded by the job's own cgroup limit (a Slurm
    job's ``--mem``: the node's free memory is not the job's), page cache counted as free
    (:func:`gac.compression.resources.device_memory`)."""
    from gac.compression.resources import device_memory

    avail = device_memory("cpu")["available_mb"]
    return None if avail is None else int(avail * 2**20)


def plan_memory(variants, points, dev, mode: str) -> tuple[str, str, dict]:
    """``("resident" | "swap", why, estimate)``."""

    est = memory_estimate(variants, points)
    need = est["weights"] + est["activations"]
    gb = lambda x: f"{x / 2**30:.2f} GB"  # noqa: E731
    if dev.type == "cpu":
        avail = _host_available()
        if avail is not None and need > avail:
            raise GacError(f"the {len(variants)} variants need about {gb(need)} but the host has {gb(avail)} available "
                           f"to this job (its memory limit included); bench fewer variants at a time (--where ...)")
        return "resident", f"cpu: all {len(variants)} variants in host memory ({gb(need)} estimated)", est
    from gac.compression.resources import device_memory

    free = device_memory(str(dev))["available_mb"] * 2**20  # the driver's free + this process's unused cache
    budget = MEMORY_FRACTION * free
    if mode == "resident" or (mode == "auto" and need <= budget):
        if need > free:
            raise GacError(f"the variants need about {gb(need)} resident but {dev} has {gb(free)} free; use memory=swap")
        return "resident", f"all variants resident on {dev}: {gb(need)} estimated of {gb(free)} free", est
    avail = _host_available()
    if avail is not None and est["weights"] > avail:
        raise GacError(f"the variants need about {gb(est['weights'])} on the host to take turns on {dev}, but the host "
                       f"has {gb(avail)} available to this job (its memory limit included); bench fewer variants at a "
                       f"time (--where ...)")
    one = est["largest_model"] + est["activations"]
    if one > free:
        raise GacError(f"one variant needs about {gb(one)} on {dev} but only {gb(free)} is free, and latency is a "
                       f"single-GPU measurement (a model that fits no one GPU has none: its model.device_map=auto jobs "
                       f"record its quality metrics); use a smaller dtype, fewer points, or a larger GPU")
    return "swap", (f"variants on the host, each moved to {dev} for its visit (outside the timed region): "
                    f"{gb(need)} estimated for all, {gb(free)} free"), est


# ---------------------------------------------------------------------------------------------- the bench
def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _check_variants(variants: Sequence[Variant]) -> None:
    if len(variants) < 2:
        raise GacError("the bench needs the baseline and at least one variant")
    if not variants[0].structure.is_baseline:
        raise GacError("the first bench variant must be the uncompressed baseline")
    labels = [v.label for v in variants]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise GacError(f"bench labels must be unique; repeated: {dup}")
    base = variants[0].structure
    ref = base.config.to_dict()
    for v in variants[1:]:
        if v.structure.is_baseline:
            raise GacError(f"{v.label}: only the first variant may be uncompressed")
        if v.structure.config is not base.config and v.structure.config.to_dict() != ref:
            raise GacError(f"{v.label} has another architecture than the baseline; bench one model at a time")
        if v.structure.dtype != base.dtype:
            raise GacError(f"{v.label} is {v.structure.dtype} but the baseline is {base.dtype}; bench one dtype at a time")
    for v in variants[1:]:
        if v.sibling is not None and v.sibling not in labels:
            raise GacError(f"{v.label}: its sibling {v.sibling!r} is not in the bench")


def run_bench(variants: Sequence[Variant], protocol: Protocol | None = None, device="cpu", open_engine=None,
              tokenizer=None) -> dict:
    """Measure ``variants`` (the first is the baseline) side by side; returns the bench document (module docstring).

    ``protocol.engines`` other than torch are opened by ``open_engine`` (:func:`gac.engines.open_engine`; llama.cpp
    needs ``tokenizer``): every (engine, variant) pair is a cell of the rounds, each engine's variants are compared
    with its own baseline, and every engine after the first with the first (module docstring)."""
    import torch

    from gac.evaluation.latency import random_ids

    protocol = protocol or Protocol()
    t_start = time.perf_counter()
    dev = check_device(device)
    p = protocol.resolved(dev.type)
    _check_variants(variants)
    engines = p["engines"]
    if engines != ("torch",) and open_engine is None:
        raise GacError("the bench's engines other than torch need a way to open them (gac.engines.open_engine)")
    base = variants[0].structure
    limit = base.max_length
    for _b, s in p["points"]:
        if limit is not None and s > limit:
            raise GacError(f"bench seq_len {s} is above the model's maximum sequence length ({limit}); use at most {limit}")
    if p["decode_tokens"] and limit is not None and p["decode_prompt"] + p["decode_tokens"] > limit:
        raise GacError(f"decode prompt {p['decode_prompt']} + {p['decode_tokens']} new tokens exceeds the model's "
                       f"maximum sequence length ({limit})")
    mode, memory_note, est = plan_memory(variants, p["points"], dev, p["memory"])
    prev_threads = torch.get_num_threads()
    if dev.type == "cpu" and p["threads"]:
        torch.set_num_threads(p["threads"])
    host = torch.device("cpu")
    models: list = []
    nv = len(variants)
    try:
        with contextlib.ExitStack() as opened:
            if dev.type == "cuda":
                from gac.compression.resources import reset_gpu_peak

                reset_gpu_peak(dev)  # the bench's own peak; a meter stage around it keeps its own
            t0 = time.perf_counter()
            where = dev if mode == "resident" else host
            for i, v in enumerate(variants):
                models.append(v.structure.build(where, share_from=models[0] if i else None, seed=p["seed"] + i))
            inputs = {pt: random_ids(models[0], pt[0], pt[1], p["seed"], dev) for pt in p["points"]}
            # one cell per (engine, variant), engine-major: torch cells call the model, the others their engine
            cells = [_Cell(m, None, None) if e == "torch" else
                     _Cell(m, *_opened(opened, open_engine, e, m, tokenizer, p, inputs)) for e in engines for m in models]
            build_s = time.perf_counter() - t0
            prompt = random_ids(models[0], 1, p["decode_prompt"], p["seed"], dev) if p["decode_tokens"] else None
            samples = [{pt: [] for pt in p["points"]} for _ in cells]
            wall = [{pt: [] for pt in p["points"]} for _ in cells]
            decode = [[] for _ in cells]
            orders = round_orders(len(cells), p["rounds"], p["seed"])
            t0 = time.perf_counter()
            with progress(len(orders), "bench", "rounds") as bar:
                for order in orders:
                    for c in order:
                        _visit(cells[c], inputs, prompt, p, dev, mode, host, samples[c], decode[c], wall[c])
                    bar.update()
            measure_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            kernels = [_kernels(c.model, inputs, p, dev, mode, host) if p["profile"] and c.engine is None else {}
                       for c in cells]
            profile_s = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
            info = device_info(dev)
            described = [_engine_record(e, cells[k * nv].engine, p) for k, e in enumerate(engines)]
    finally:
        torch.set_num_threads(prev_threads)
        del models
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    per_engine = []
    for k in range(len(engines)):
        part = slice(k * nv, (k + 1) * nv)
        per_engine.append(summarise(variants, p, samples[part], decode[part], kernels[part], wall[part]))
    for k in range(1, len(engines)):
        compare_engines(per_engine[k], samples[k * nv:(k + 1) * nv], samples[:nv], engines[0], p)
    doc = per_engine[0]
    doc["engine"] = described[0]
    if len(engines) > 1:
        doc["engine_axis"] = [{"engine": d, "variants": s["variants"]} for d, s in zip(described, per_engine)]
    doc.update(
        device=info,
        dtype=dtype_str(base.dtype),
        architecture={k: getattr(base.config, k, None) for k in (
            "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")},
        protocol={**{k: p[k] for k in ("rounds", "warmup", "iters", "seed", "bootstrap", "threads", "decode_tokens",
                                       "decode_prompt", "decode_warmup", "decode_iters")},
                  "engines": list(engines),
                  "points": [list(x) for x in p["points"]],
                  "order": "every round visits every variant once, in a fresh shuffle (seeded)",
                  "sample": "median of a visit's timed calls",
                  "statistic": "median over rounds; ratios of medians with a paired bootstrap 95% CI over rounds",
                  "timer": p["timer"],
                  "memory_mode": mode, "memory_note": memory_note,
                  "memory_estimate_bytes": {"weights": est["weights"], "activations": est["activations"]},
                  "peak_memory_bytes": peak},
        timings={"build_s": build_s, "measure_s": measure_s, "profile_s": profile_s,
                 "total_s": time.perf_counter() - t_start},
    )
    return doc


@dataclass
class _Cell:
    """What one visit times: a variant's model, through the engine that runs it (None: the model itself, torch)."""

    model: object
    engine: object = None
    calls: dict | None = None  # point -> the engine's prefill call (its setup done once, outside every visit)


def _opened(stack, open_engine, name, model, tokenizer, p, inputs):
    """``(engine, {point: prefill call})`` of ``model`` in engine ``name`` at the protocol's threads, closed with
    ``stack``; its export goes to a temporary directory removed with it."""
    import tempfile

    work = stack.enter_context(tempfile.TemporaryDirectory(prefix="gac-bench-engine-"))
    eng = stack.enter_context(open_engine(name, model, tokenizer, work, threads=p["threads"]))
    return eng, {pt: eng.prefill_call(x) for pt, x in inputs.items()}


def _engine_record(name: str, engine, p) -> dict:
    """How the bench document names an engine: its ``describe()``, or torch's own (gac.evaluation.latency)."""
    import torch

    from gac.evaluation.latency import torch_engine

    if engine is not None:
        return engine.describe()
    return {**torch_engine(), "threads": p["threads"] if p["threads"] else torch.get_num_threads()}


def compare_engines(summary: dict, samples, first, first_name: str, p) -> None:
    """Each variant of another engine's ``summary`` against the same variant in the first engine, per point: the
    ratio of the medians with its paired bootstrap interval over the same rounds (``ratio_to_engine``)."""
    from gac.metrics import prefill_point
    from gac.stats import paired_ratio_ci

    for i, row in enumerate(summary["variants"]):
        for pt in p["points"]:
            r, lo, hi = paired_ratio_ci(samples[i][pt], first[i][pt], p["bootstrap"], p["seed"])
            row["points"][prefill_point(*pt)].update(ratio_to_engine=r, ratio_to_engine_ci95=[lo, hi],
                                                     engine_compared=first_name)


def _visit(cell: _Cell, inputs, prompt, p, dev, mode, host, out: dict, decode: list, wall: dict) -> None:
    """One visit: (swap in), per point warm-up + timed calls -> the median, (decode), (swap out)."""
    import torch

    from gac.evaluation.latency import CPU_CLOCKS, decode_step, time_calls

    clock = CPU_CLOCKS.get(p["timer"])  # the protocol's own (timer=wall/cpu may differ from the rule's default)
    model = cell.model

    if mode == "swap":
        model.to(dev)
        _sync(dev)
    with torch.inference_mode():
        for pt, x in inputs.items():
            def call(x=x):
                return model(input_ids=x, use_cache=False)

            if cell.engine is not None:
                call = cell.calls[pt]

            for _ in range(p["warmup"]):
                call()
            w: list = []
            ms = time_calls(lambda call=call: call, dev, p["iters"], clock=clock, wall=w)
            out[pt].append(statistics.median(ms))
            wall[pt].append(statistics.median(w) if w else None)
        if prompt is not None:
            step = decode_step(model, prompt, p["decode_tokens"])
            for _ in range(p["decode_warmup"]):
                step()()
            ms = time_calls(step, dev, p["decode_iters"], clock=clock)
            decode.append(statistics.median(ms) / p["decode_tokens"])
    if mode == "swap":
        model.to(host)
        _sync(dev)
        torch.cuda.empty_cache()


def _kernels(model, inputs, p, dev, mode, host) -> dict:
    import torch

    from gac.evaluation.latency import profile_call, sdpa_from_trace, top_kernels

    if mode == "swap":
        model.to(dev)
    attn = getattr(model.config, "_attn_implementation", None)
    out = {}
    with torch.inference_mode():
        for pt, x in inputs.items():
            prof = profile_call(lambda x=x: model(input_ids=x, use_cache=False), dev)
            out[pt] = {"top_kernels": top_kernels(prof, dev, p["top"]), "sdpa_backend": sdpa_from_trace(prof, attn)}
    if mode == "swap":
        model.to(host)
        torch.cuda.empty_cache()
    return out
