"""Prefill of a dense mixture-of-experts model against its pruned experts at one parameter budget, side by side.

    python benchmarks/moe_prefill.py --out docs/results-moe.md          # about 1.5 CPU minutes (alone: ~2 min)
    python benchmarks/moe_prefill.py --quick --out /tmp/moe.md          # a smoke run (tests/test_benchmarks.py)

A random-weight Mixtral-shaped model (``--hidden`` 1024, ``--experts`` 8 routed ``--top-k`` 2 per token, each of
width ``--intermediate`` 2816, ``--layers`` 4; latency depends on shapes, not values) and three LLM-Pruner plans of
its experts at ``--ratio`` under the same budget (``floor((1 - ratio) x`` the experts' dense weights), aligned by
gac's knapsack (unit 8):

* **shared (fused)**: one width per layer for all its experts (``expert_width=shared``, the default), kept in
  transformers' fused 3-D experts class, run by its own forward (``grouped_mm`` where torch has it);
* **per-expert, equal (ExpertMLPs)**: every expert its own target (``expert_width=per_expert``) with the same d*
  (LLM-Pruner's uniform allocation), installed as ``ExpertMLPs``: one Linear pair per expert, in a loop;
* **per-expert, ragged (ExpertMLPs)**: the same, d* alternating 25% above and below (what a score-driven allocation
  gives), the widths that cannot share one 3-D tensor.

The plans are made by gac's aligner from d* (no calibration: their widths are what latency depends on). Every
variant and the dense model are measured by gac's side-by-side bench (:func:`gac.evaluation.bench.run_bench`:
interleaved shuffled rounds, ``--threads`` fixed, paired bootstrap 95% intervals over rounds). The load average is
printed and recorded before and after the measurement; a run that starts above the threads it uses plus 0.5 is
marked "under load (provisional)". ``--out FILE`` writes the markdown table (and ``FILE`` with ``.json``: the bench
document) between this script's markers in FILE, leaving the rest of FILE as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

MARKER = "moe_prefill"  # its table sits between <!-- moe_prefill: begin --> and <!-- moe_prefill: end --> in --out


def _config(a):
    from transformers import MixtralConfig

    return MixtralConfig(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                         num_attention_heads=a.hidden // 128, num_key_value_heads=max(1, a.hidden // 512),
                         head_dim=128, num_local_experts=a.experts, num_experts_per_tok=a.top_k, vocab_size=a.vocab,
                         max_position_embeddings=max(4096, a.seq_len), sliding_window=None, tie_word_embeddings=False)


def _plans(config, ratio: float, unit: int = 8) -> dict:
    """variant label -> (compressor options, plan) for the three plans of the module docstring (one budget)."""
    from gac.align import align
    from gac.align.targets import Target, budget_for_ratio
    from gac.compression.compressors import get_compressor
    from gac.compression.discovery import discover, skeleton

    meta = skeleton(config)
    lay = discover(meta)
    opts = {"shared": {"layers": "0:"}, "per_expert": {"layers": "0:", "expert_width": "per_expert"}}
    units = {k: get_compressor("llm_pruner", **o).units(meta, lay) for k, o in opts.items()}
    dense = sum(u.dense_params for u in units["shared"])
    budget = budget_for_ratio(dense, ratio)

    def plan(us, spread):
        ts = [Target(u.name, (1 - ratio) * u.d_full * (1 + spread * (-1) ** i), 1.0, u.params_per_dim,
                     d_max=u.d_cap, kind="width") for i, u in enumerate(us)]
        return align(ts, budget, "gac", unit)

    return {"shared (fused)": (opts["shared"], plan(units["shared"], 0.0)),
            "per-expert, equal (ExpertMLPs)": (opts["per_expert"], plan(units["per_expert"], 0.0)),
            "per-expert, ragged (ExpertMLPs)": (opts["per_expert"], plan(units["per_expert"], 0.25))}


def _table(doc: dict, plans: dict, dense: int, a, loads: tuple, provisional: bool, command: str) -> str:
    dev, proto = doc["device"], doc["protocol"]
    arch = doc["architecture"]
    status = "**under load (provisional)**" if provisional else "alone on the machine"
    lines = [
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {status}; load average "
        f"{loads[0]:.2f} before, {loads[1]:.2f} after the measurement, on {os.cpu_count()} cores).",
        f"Device: {dev.get('name', dev)}; torch {dev.get('torch', '?')}, {proto['threads']} thread(s), "
        f"{doc['dtype']}, timer {proto['timer']}. Model: Mixtral-shaped, random weights, hidden "
        f"{arch['hidden_size']}, {a.experts} experts of width {arch['intermediate_size']} (top-{a.top_k}), "
        f"{arch['num_hidden_layers']} layers; prefill batch 1 x {a.seq_len} tokens; experts pruned at ratio {a.ratio} "
        f"(one budget). {proto['rounds']} interleaved rounds x ({proto['warmup']} warm-up + {proto['iters']} timed "
        f"calls); median over rounds, paired bootstrap 95% CI over rounds ({doc['bootstrap']['resamples']} "
        f"resamples).",
        "",
        "| variant | expert widths | expert params / budget | FLOPs vs dense | prefill ms | vs dense [95% CI] |",
        "|---|---|---|---:|---:|---|",
    ]
    for v in doc["variants"]:
        label = v["label"]
        if v["baseline"]:
            widths, params = f"{a.intermediate} (every expert)", f"{dense:,} (dense)"
            ratio = ""
        else:
            _, plan = plans[label]
            ws = sorted(set(plan.dims.values()))
            widths = (f"{ws[0]} per layer" if label.startswith("shared") else
                      (f"{ws[0]} each" if len(ws) == 1 else f"{ws[0]}-{ws[-1]} per expert"))
            params = f"{plan.params:,} / {plan.budget:,}"
            lo, hi = v["ratio_ci95"]
            ratio = f"{100 * (v['ratio_to_baseline'] - 1):+.1f}% [{100 * (lo - 1):+.1f}, {100 * (hi - 1):+.1f}]"
        lines.append(f"| {label} | {widths} | {params} | {v['flops_ratio']:.3f} | {v['median_ms']:.1f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816, help="each expert's width")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1, help="warm-up calls per visit")
    ap.add_argument("--iters", type=int, default=2, help="timed calls per visit")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (fixed for the whole measurement)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quick", action="store_true", help="a tiny model and 2 rounds: checks the script runs")
    ap.add_argument("--out", required=True, help="the markdown file the table goes into (FILE.json: the bench document)")
    a = ap.parse_args(argv)
    if a.quick:
        a.hidden, a.intermediate, a.experts, a.layers, a.vocab, a.seq_len = 256, 512, 4, 2, 256, 32
        a.rounds, a.warmup, a.iters = 2, 0, 1
    command = "python benchmarks/moe_prefill.py " + " ".join(argv if argv is not None else sys.argv[1:])

    from gac.compression.structure import Structure
    from gac.evaluation.bench import Protocol, Variant, run_bench
    from gac.evaluation.bench_format import format_bench
    from gac.io import write_marked_block

    config = _config(a)
    plans = _plans(config, a.ratio)
    base = Structure(config, a.dtype)
    dense = _dense_experts(config)
    variants = [Variant("dense", base)] + [
        Variant(label, Structure(config, a.dtype, "llm_pruner", opts, dict(plan.dims)),
                info={"params": plan.params, "budget": plan.budget, "aligned": plan.aligned_fraction})
        for label, (opts, plan) in plans.items()]
    for v in variants[1:]:
        print(f"{v.label}: params {v.info['params']:,} / budget {v.info['budget']:,}, aligned "
              f"{100 * v.info['aligned']:.0f}%", file=sys.stderr)
    load0 = os.getloadavg()[0]
    doc = run_bench(variants, Protocol(points=((1, a.seq_len),), rounds=a.rounds, warmup=a.warmup, iters=a.iters,
                                       threads=a.threads if a.device == "cpu" else None), a.device)
    load1 = os.getloadavg()[0]
    threads = doc["protocol"]["threads"] or 1
    provisional = load0 > threads + 0.5
    print(format_bench(doc))
    for v in doc["variants"]:
        print(f"{v['label']}: {v['median_ms']:.1f} ms (x{v['ratio_to_baseline']:.3f} of dense); load average "
              f"{load0:.2f} before, {load1:.2f} after")
    out = Path(a.out)
    write_marked_block(out, MARKER, _table(doc, plans, dense, a, (load0, load1), provisional, command))
    doc["load_average"] = {"before": load0, "after": load1, "provisional": provisional}
    with open(out.with_suffix(".json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


def _dense_experts(config) -> int:
    """The dense experts' weight parameters (every layer's)."""
    from gac.compression.discovery import discover, skeleton

    return sum(b.num_experts * 3 * b.hidden * b.width for b in discover(skeleton(config)).experts)


if __name__ == "__main__":
    sys.exit(main())
