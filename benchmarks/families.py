"""Unaligned vs gac plans on other model families, side by side on one device: does alignment pay off beyond Llama?

    python benchmarks/families.py                                   # a GPU: phi4_mini, qwen3_8b, mixtral_8x7b (8 layers)
    python benchmarks/families.py --models tiny --device cpu --dtype float32 --seq-len 128 --rounds 3 --calib 2x64

For each model (a ``conf/model`` config: its ``arch`` block with ``--layers`` decoder layers, random weights in
``--dtype``; latency depends on shapes, not values) and each compressor, the compressor is prepared once on the model
(calibration on random token ids: the plans' dims are what matters here, not their quality), then planned at
``--ratio`` with the ``unaligned`` and ``gac`` strategies under the same parameter budget. Every plan's structure and
the uncompressed baseline are measured by the side-by-side bench (:func:`gac.evaluation.bench.run_bench`: interleaved
rounds, CUDA events, paired bootstrap 95% intervals); the table gives each plan's prefill latency against the
baseline and gac's against its unaligned sibling. On a CPU the numbers say nothing about GPU kernels.

Low-rank compressors use the ``proportional`` allocation (ASVD's sensitivity search would cost minutes per model and
is beside the point); LLM-Pruner its own (uniform). Fused weights (Phi-4-mini's ``qkv_proj``) are split by role,
mixture-of-experts models get one expert width per layer, kept in the fused experts
(LLM-Pruner's default; docs/families.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _config(name: str, layers: int | None):
    """The model's config: its ``arch`` block (random weights), or the named model's own config (``tiny``), with
    ``layers`` decoder layers."""
    from omegaconf import OmegaConf

    from gac.compression.discovery import text_config
    from gac.compression.structure import architecture
    from gac.io import conf_dir

    doc = OmegaConf.to_container(OmegaConf.load(f"{conf_dir()}/model/{name}.yaml"), resolve=True)
    arch = dict(doc["arch"]) if doc.get("arch") else None
    config = architecture(doc.get("spec") or name, arch is not None, arch)
    if layers:
        cfg = text_config(config)
        cfg.num_hidden_layers = int(layers)
        for k in ("layer_types", "mlp_only_layers"):  # per-layer lists follow the depth
            if isinstance(getattr(cfg, k, None), list):
                setattr(cfg, k, getattr(cfg, k)[: int(layers)])
    return config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["phi4_mini", "qwen3_8b", "mixtral_8x7b"])
    ap.add_argument("--compressors", nargs="+", default=["asvd", "llm_pruner"])
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of each model (default 8)")
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls per visit (default: the bench's)")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per visit (default: the bench's)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--calib", default="8x256", help="calibration samples x tokens (random ids)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    from gac.compression.preparation import prepare
    from gac.compression.structure import Structure
    from gac.evaluation.bench import Protocol, Variant, run_bench
    from gac.evaluation.bench_format import format_bench

    n, t = (int(x) for x in args.calib.split("x"))
    docs = []
    for name in args.models:
        config = _config(name, args.layers)
        base = Structure(config, args.dtype)
        model = base.build(args.device)
        ids = torch.randint(0, int(config.get_text_config().vocab_size), (n, t), generator=torch.Generator().manual_seed(0))
        variants = [Variant("Baseline", base)]
        for comp in args.compressors:
            t0 = time.perf_counter()
            prep = prepare(model, None, comp, calib_ids=ids, allocation="proportional" if comp != "llm_pruner" else None)
            for strategy in ("unaligned", "gac"):
                plan, _ = prep.plan(args.ratio, strategy)
                label = f"{comp} {strategy}"
                variants.append(Variant(label, Structure(config, args.dtype, comp, {}, dict(plan.dims)),
                                        info={"compressor": comp, "strategy": strategy, "aligned": plan.aligned_fraction,
                                              "params": plan.params, "budget": plan.budget},
                                        sibling=f"{comp} unaligned" if strategy == "gac" else None))
            print(f"{name}: {comp} prepared and planned in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            del prep
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        doc = run_bench(variants, Protocol(points=((1, args.seq_len),), rounds=args.rounds, warmup=args.warmup,
                                           iters=args.iters), args.device)
        doc["model"] = {"name": name, "layers": args.layers, "dtype": args.dtype}
        print(f"\n## {name} ({args.layers} layers, {args.dtype}, S={args.seq_len}, ratio {args.ratio})")
        for v in variants[1:]:
            print(f"  {v.label}: aligned {100 * v.info['aligned']:.0f}%, params {v.info['params']:,} / budget "
                  f"{v.info['budget']:,}")
        print(format_bench(doc))
        docs.append(doc)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(docs, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
