"""PaLU's latent KV cache measured: cache bytes per token and decode ms/token, side by side.

    python benchmarks/palu_cache.py --out palu_cache.json                 # smollm2, writes docs/results-palu-cache.md
    python benchmarks/palu_cache.py --model tiny --out /tmp/p.json --doc /tmp/p.md --rounds 3

Five variants of one model in one process: the dense model, and PaLU at ``--ratio`` (gac's default procedure: whitened
SVD, Fisher scores, ``fisher_uniform``; calibrated once) planned with the ``unaligned`` and the ``gac`` strategy,
each as *parameter-only* PaLU (``cache=full``: the rebuilt K/V cached, the same weights) and with the *latent cache*
(``cache=latent``: the K/V codes cached, past tokens rebuilt in attention).

* **cache bytes per token**: a ``--prompt``-token prefill into transformers' ``DynamicCache``, then the bytes of the
  storages the cache holds (:func:`gac.compression.latent_cache.cache_bytes`: the tensors actually held, not a
  formula) over the prompt's tokens;
* **decode ms/token**: gac's decode step (:func:`gac.evaluation.latency.decode_step`: an untimed prefill, then
  ``--new`` greedy one-token steps with the cache, timed as a whole), in ``--rounds`` rounds that each visit every
  variant once in a fresh seeded shuffle (:func:`gac.evaluation.bench_stats.round_orders`), ``--warmup`` untimed and
  ``--iters`` timed calls per visit, ``--threads`` torch threads and the clock gac's rule picks for them
  (:func:`gac.evaluation.latency.timer_for`: thread CPU time with one thread); the statistic is the median over rounds,
  ratios with the paired bootstrap 95% interval over rounds (:func:`gac.stats.paired_ratio_ci`);
* **exact**: the latent variant's greedy tokens equal its parameter-only twin's over the ``--new`` steps.

The load average is printed beside every round and recorded; a run whose 1-minute load average exceeded
``--threads`` + 0.5 at any round is marked "under load (provisional)" in the doc. With the defaults on smollm2 it
took 549 s on a shared 2-core CPU at load average 8-13 (84 s of it calibrating PaLU); meant to run alone, where
it is a fraction of that.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "results-palu-cache.md"


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--ratio", type=float, default=0.5, help="share of the K/V weights PaLU removes")
    ap.add_argument("--text", default="enwiki", help="calibration text (tiny when enwiki is not built)")
    ap.add_argument("--calib", default="8x128", help="calibration samples x tokens")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before decoding")
    ap.add_argument("--new", type=int, default=16, help="greedy tokens per timed decode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="the JSON results file (refused if it exists)")
    ap.add_argument("--doc", default=str(DOC), help="the markdown results doc to write ('' for none)")
    a = ap.parse_args(argv)
    try:
        n, ln = (int(x) for x in a.calib.lower().split("x"))
    except ValueError:
        ap.error(f"--calib {a.calib!r} is not SAMPLESxTOKENS, e.g. 8x128")
    a.calib = (n, ln)
    if not 0 < a.ratio < 1:
        ap.error("--ratio must be in (0, 1)")
    if min(a.prompt, a.new, a.rounds - 1, a.iters, a.threads, n, ln) < 1 or a.warmup < 0:
        ap.error("--prompt, --new, --iters, --threads and the calibration need >= 1, --rounds >= 2, --warmup >= 0")
    if Path(a.out).exists():
        ap.error(f"--out {a.out} exists; choose another file (a result is never overwritten)")
    return a


def _load() -> float:
    return os.getloadavg()[0]


def main(argv=None) -> int:
    a = _args(argv)
    import torch

    from gac.compression.latent_cache import cache_bytes, remove
    from gac.compression.preparation import prepare
    from gac.evaluation.bench_device import device_info
    from gac.evaluation.bench_stats import round_orders
    from gac.evaluation.latency import CPU_CLOCKS, decode_step, random_ids, time_calls, timer_for
    from gac.io import write_text_atomic
    from gac.models import load_model
    from gac.stats import paired_ratio_ci
    from gac.text import calibration_batches

    t_start = time.perf_counter()
    torch.set_num_threads(a.threads)
    dev = torch.device("cpu")
    loads = [_load()]
    model, tok = load_model(a.model, dtype=torch.float32)
    model.eval()
    try:
        calib = calibration_batches(tok, a.text, a.calib[0], a.calib[1], seed=0, split="train")
        text = a.text
    except Exception:  # noqa: BLE001 - enwiki not built here: tiny's text (the plan's ranks only need a calibration)
        calib, text = calibration_batches(tok, "tiny", a.calib[0], a.calib[1], seed=0, split="train"), "tiny"
    prep = prepare(model, tok, "palu", calib_ids=calib)
    print(f"{a.model}: PaLU prepared on {tuple(calib.shape)} of {text} in {time.perf_counter() - t_start:.0f} s "
          f"(load average {_load():.2f})", flush=True)
    variants = [{"label": "dense", "model": model, "strategy": None, "cache": "full"}]
    for strategy in ("unaligned", "gac"):
        cm, plan, rep = prep.compress(a.ratio, strategy)
        twin = copy.deepcopy(cm, memo={id(p): p for p in cm.parameters()})  # the same weights, the rebuilt K/V cached
        remove(twin)
        ranks = sorted(set(plan.dims.values()))
        info = {"strategy": strategy, "params": plan.params, "dense_params": prep.dense_params,
                "ranks": ranks, "codes_per_token": sum(plan.dims.values())}
        variants.append({"label": f"PaLU {strategy}, parameters only", "model": twin, "cache": "full", **info})
        variants.append({"label": f"PaLU {strategy}, latent cache", "model": cm, "cache": "latent", **info})
    del prep
    prompt = random_ids(model, 1, a.prompt, a.seed, dev)
    with torch.inference_mode():
        from transformers import DynamicCache

        for v in variants:  # the bytes the cache holds after the prompt, and the greedy tokens of a decode
            c = DynamicCache(config=v["model"].config)
            out = v["model"](input_ids=prompt, past_key_values=c, use_cache=True, logits_to_keep=1)
            v["cache_bytes_per_token"] = cache_bytes(c) / a.prompt
            toks, t = [], out.logits[:, -1:].argmax(-1)
            for _ in range(a.new):
                toks.append(int(t))
                o = v["model"](input_ids=t, past_key_values=c, use_cache=True, logits_to_keep=1)
                t = o.logits[:, -1:].argmax(-1)
            v["tokens"] = toks
    for i, v in enumerate(variants):
        if v["cache"] == "latent":
            v["exact"] = v["tokens"] == variants[i - 1]["tokens"]
    clock_name = timer_for(dev, a.threads)
    clock = CPU_CLOCKS.get(clock_name)
    samples = [[] for _ in variants]
    with torch.inference_mode():
        for r, order in enumerate(round_orders(len(variants), a.rounds, a.seed)):
            for i in order:
                step = decode_step(variants[i]["model"], prompt, a.new)
                for _ in range(a.warmup):
                    step()()
                ms = time_calls(step, dev, a.iters, clock=clock)
                samples[i].append(statistics.median(ms) / a.new)
            loads.append(_load())
            print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{variants[i]['label']} {samples[i][-1]:.2f}"
                                                            for i in range(len(variants)))
                  + f" ms/token; load average {loads[-1]:.2f}", flush=True)
    base = samples[0]
    rows = []
    for i, v in enumerate(variants):
        ratio = paired_ratio_ci(samples[i], base, seed=a.seed) if i else (1.0, 1.0, 1.0)
        twin = paired_ratio_ci(samples[i], samples[i - 1], seed=a.seed) if v["cache"] == "latent" else None
        rows.append({k: v[k] for k in v if k not in ("model", "tokens")} | {
            "decode_ms_per_token": statistics.median(samples[i]), "samples_ms": samples[i],
            "decode_vs_dense": ratio, "decode_vs_parameters_only": twin,
            "cache_vs_dense": v["cache_bytes_per_token"] / variants[0]["cache_bytes_per_token"]})
    provisional = max(loads) > a.threads + 0.5
    doc = {"model": a.model, "ratio": a.ratio, "calibration": [text, *a.calib], "prompt": a.prompt, "new": a.new,
           "rounds": a.rounds, "warmup": a.warmup, "iters": a.iters, "threads": a.threads, "timer": clock_name,
           "seed": a.seed, "dtype": "float32", "device": device_info(dev), "platform": platform.platform(),
           "load_average": {"start": loads[0], "max": max(loads), "end": loads[-1], "per_round": loads[1:]},
           "provisional": provisional, "rows": rows, "total_s": time.perf_counter() - t_start,
           "command": "python benchmarks/palu_cache.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_text_atomic(a.out, json.dumps(doc, indent=1), overwrite=True)  # --out was refused above if it existed
    if a.doc:
        write_text_atomic(a.doc, render(doc), overwrite=True)
    print(f"wrote {a.out}" + (f" and {a.doc}" if a.doc else "") + f" in {doc['total_s']:.0f} s; load average "
          f"{loads[0]:.2f} -> max {max(loads):.2f}" + (" (under load: provisional)" if provisional else ""))
    return 0


def _ranks(ranks: list[int]) -> str:
    """The plan's distinct group ranks, briefly: their range, how many, whether all are multiples of 8."""
    eights = ", all multiples of 8" if all(r % 8 == 0 for r in ranks) else ""
    return f"{min(ranks)}-{max(ranks)} ({len(ranks)} distinct{eights})"


def render(doc: dict) -> str:
    """The results doc: what was measured, how, and the table."""
    d = doc["device"]
    mark = " — **under load (provisional)**" if doc["provisional"] else ""
    la = doc["load_average"]
    lines = [
        "# PaLU's latent KV cache: cache bytes and decode latency",
        "",
        "Written by `benchmarks/palu_cache.py` (its docstring has the protocol); rerun it to replace this page.",
        "",
        f"**{doc['model']}**, float32, PaLU at ratio {doc['ratio']} of the K/V weights (gac's default procedure, "
        f"`rank_cap=break_even`; calibration {doc['calibration'][1]} x {doc['calibration'][2]} tokens of "
        f"{doc['calibration'][0]}); cache after a {doc['prompt']}-token prompt; decode = {doc['new']} greedy tokens "
        f"after it, {doc['rounds']} interleaved rounds x ({doc['warmup']} warm-up + {doc['iters']} timed) per "
        f"variant, {doc['threads']} torch thread(s), clock `{doc['timer']}`; ratios are medians over rounds with "
        f"paired bootstrap 95% intervals. Host: {d.get('name')} ({d.get('cpu_count')} CPUs), {doc['platform']}; load "
        f"average {la['start']:.2f} at the start, {la['max']:.2f} at most, {la['end']:.2f} at the end{mark}.",
        "",
        f"Command: `{doc['command']}`",
        "",
        "| variant | K/V weights | ranks per group | cache bytes / token | vs dense | decode ms / token | vs dense "
        "[95% CI] | latent vs parameter-only [95% CI] | greedy tokens equal |",
        "|---|---:|---|---:|---:|---:|---|---|---|",
    ]
    for r in doc["rows"]:
        ci = r["decode_vs_dense"]
        tw = r["decode_vs_parameters_only"]
        lines.append(
            f"| {r['label']} | {r['params']:,} of {r['dense_params']:,} | {_ranks(r['ranks'])} | "
            if r.get("params") else f"| {r['label']} | dense | - | ")
        lines[-1] += (f"{r['cache_bytes_per_token']:,.0f} | {r['cache_vs_dense']:.3f} | {r['decode_ms_per_token']:.2f}"
                      f" | {ci[0]:.3f} [{ci[1]:.3f}, {ci[2]:.3f}] | "
                      + (f"{tw[0]:.3f} [{tw[1]:.3f}, {tw[2]:.3f}]" if tw else "-") + " | "
                      + ({True: "yes", False: "**no**"}.get(r.get("exact"), "-")) + " |")
    lines += [
        "",
        "Parameter-only PaLU caches what the dense model caches (the rebuilt K/V); the latent cache holds each "
        "layer's K and V codes (the plan's ranks summed over the head groups) plus one cos/sin pair per token per "
        "rotary kind for the whole model. Decoding with the latent cache rebuilds every past token's K and V at each "
        "step (an up-projection per head group and RoPE), work the parameter-only model does not do: on a CPU, "
        "with unfused PyTorch ops, that is what the decode column prices; PaLU's own kernels fuse the rebuild into "
        "attention.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
