"""Compressors x strategies at equal budget on ``tiny``: perplexity, alignment, params vs budget, wall time.

    python benchmarks/compressors.py                      # tiny, ASVD + LLM-Pruner, ratios 0.15 0.30
    python benchmarks/compressors.py --compressors asvd svd_llm llm_pruner palu --json out.json
    python benchmarks/compressors.py --quick                 # seconds: small calibration and windows, ratio 0.3

Each compressor is scored and factorised once (``gac.compression.preparation.prepare``); every (ratio, strategy) row re-uses that
state, so "wall" is the one-off preparation plus that row's allocation, alignment and layer swap. Perplexity is
token perplexity on tiny's held-out test plays (``gac.evaluation.perplexity``). ``--model random`` runs a random
tiny-shaped Llama on random tokens (a smoke test; its perplexities mean nothing).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--compressors", nargs="+", default=["asvd", "llm_pruner"])
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.15, 0.30])
    ap.add_argument("--strategies", nargs="+",
                    default=["unaligned", "round_nearest", "rebalance", "gac", "gac::proxy", "gac:8"],
                    help="strategy[:window[:knapsack_score]], e.g. gac:8 or gac::marginal; the window defaults to "
                         "gac.compression.prepared.COMPRESS_WINDOW, the knapsack score to gac.compression.prepared.DEFAULT_KNAPSACK_SCORE")
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seq-len", type=int, default=512)
    ap.add_argument("--eval-seq-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=None, help="score only the first N windows")
    ap.add_argument("--calib-text", default=None, help="calibration source (default: tiny for tiny, else wikitext2)")
    ap.add_argument("--eval-text", default=None, help="evaluation source (default: tiny for tiny, else wikitext2)")
    ap.add_argument("--unit", type=int, default=8)
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="a smoke run: calibration 4 x 64, two 128-token windows, "
                    "ratio 0.3, strategies unaligned and gac (no CPU lock)")
    args = ap.parse_args(argv)
    if args.quick:
        args.calib_samples, args.calib_seq_len, args.eval_seq_len, args.eval_windows = 4, 64, 128, 2
        args.ratios, args.strategies = [0.3], ["unaligned", "gac"]
    from gac.machine import hold_cpu_lock

    hold_cpu_lock(enabled=not args.quick)  # the wall column is a timing
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import torch

    from gac.compression.calibration import Calibration
    from gac.compression.preparation import prepare
    from gac.compression.prepared import COMPRESS_WINDOW, DEFAULT_KNAPSACK_SCORE
    from gac.compression.sensitivity import calibration_perplexity

    torch.manual_seed(0)
    if args.model == "random":
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.for_model("llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                                   max_position_embeddings=max(256, args.calib_seq_len, args.eval_seq_len))
        model, tok = AutoModelForCausalLM.from_config(cfg).eval(), None
        g = torch.Generator().manual_seed(0)
        calib_ids = torch.randint(0, 4096, (args.calib_samples, args.calib_seq_len), generator=g)
        held = torch.randint(0, 4096, (8, args.eval_seq_len), generator=g)

        def evaluate(m):
            return calibration_perplexity(m, held)
    else:
        from gac.evaluation import perplexity
        from gac.models import load_model

        model, tok = load_model(args.model, dtype=torch.float32)
        default = "tiny" if args.model == "tiny" else "wikitext2"
        calib_ids = Calibration(args.calib_text or default, args.calib_samples, args.calib_seq_len).token_ids(tok)

        def evaluate(m):
            return perplexity(m, tok, args.eval_text or default, seq_len=args.eval_seq_len,
                              max_windows=args.eval_windows)["ppl"]

    model.eval()
    base = evaluate(model)
    rows = [{"compressor": "baseline", "ratio": 0.0, "strategy": "-", "ppl": base}]
    print(f"model {args.model}: baseline perplexity {base:.3f}; torch threads {torch.get_num_threads()}; "
          f"candidate window {COMPRESS_WINDOW} unit(s) unless ':w' is given")
    hdr = f"{'compressor':<11} {'ratio':>5} {'strategy':<13} {'ppl':>9} {'aligned%':>8} {'params':>10} {'budget':>10} {'params/B':>8} {'wall_s':>7}"
    for comp in args.compressors:
        t0 = time.perf_counter()
        prep = prepare(model, tok, comp, calib_ids=calib_ids)
        t_prep = time.perf_counter() - t0
        print(f"\n{comp}: proxy {prep.proxy}, {len(prep.units)} targets, {prep.dense_params:,} dense weight params; "
              f"prepare {t_prep:.1f}s (calibration {prep.timings['calibration_s']:.1f}s, factorize {prep.timings['factorize_s']:.1f}s)")
        print(hdr)
        for ratio in args.ratios:
            for spec in args.strategies:
                strategy, _, rest = spec.partition(":")
                w, _, ks = rest.partition(":")
                window = int(w) if w else COMPRESS_WINDOW
                t1 = time.perf_counter()
                cm, plan, report = prep.compress(ratio, strategy, unit=args.unit, window=window,
                                                 knapsack_score=ks or DEFAULT_KNAPSACK_SCORE)
                strategy = spec
                wall = t_prep + time.perf_counter() - t1
                p = evaluate(cm)
                row = {"compressor": comp, "ratio": ratio, "strategy": strategy, "ppl": p,
                       "aligned_fraction": plan.aligned_fraction, "params": plan.params, "budget": plan.budget,
                       "budget_met": plan.budget_met, "objective": plan.objective, "wall_s": wall,
                       "prepare_s": t_prep}
                rows.append(row)
                print(f"{comp:<11} {ratio:>5.2f} {strategy:<13} {p:>9.3f} {100 * plan.aligned_fraction:>7.1f}% "
                      f"{plan.params:>10,} {plan.budget:>10,} {plan.params / plan.budget:>8.4f} {wall:>7.2f}")
                del cm
                assert math.isfinite(p), f"non-finite perplexity for {comp} {ratio} {strategy}"
    for comp in args.compressors:
        for ratio in args.ratios:
            r = {x["strategy"]: x for x in rows if x["compressor"] == comp and x["ratio"] == ratio}
            if "gac" in r and "round_nearest" in r:
                g, rn = r["gac"]["ppl"], r["round_nearest"]["ppl"]
                print(f"{comp} {ratio:.2f}: gac {g:.3f} vs round_nearest {rn:.3f} "
                      f"({'no worse' if g <= rn else 'WORSE'})"
                      + (f", vs unaligned {r['unaligned']['ppl']:.3f}" if "unaligned" in r else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
