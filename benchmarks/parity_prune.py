"""Parity of gac's PaLU and LLM-Pruner with their reference procedures on ``tiny`` (issue #13).

    python benchmarks/parity_prune.py                  # both compressors, rho 0.15 0.30
    python benchmarks/parity_prune.py --compressors llm_pruner --eval-windows 8  # a quick look
    python benchmarks/parity_prune.py --model smollm2 --ratios 0.15 --no-before
    python benchmarks/parity_prune.py --compressors palu --palu-fisher-loss two_ahead   # the reference's loss too
    python benchmarks/parity_prune.py --quick          # seconds: a smoke run at small sizes

Each run holds the serial CPU lock (``gac.machine.hold_cpu_lock``) while it measures; ``--quick`` does not.

Protocol (the issue's): calibration 32 x 256 tokens of tiny's train text (seed 0) for gac and for the reference;
perplexity on tiny's full test text in 1024-token windows (baseline 233.37); ``--model`` another model on the same
texts (``--text``; SmolLM2-135M: issue 24). For each compressor and rho:

1. the reference procedure (``benchmarks/parity_refs/<name>.py``: an independent re-implementation of the authors'
   default procedure, sharing no compression code with gac) at rho -> its model and kept parameter count;
2. gac with its defaults (``prepare(model, tok, name)``: the compressor's default proxy and allocation) and the
   ``unaligned`` strategy at exactly that parameter count -> gac's PPL vs the reference's (target: within 0.5%);
3. gac's ``gac`` strategy (aligned to 8) at the same budget -> aligned vs unaligned.

Also printed: LLM-Pruner's channel-importance agreement (Spearman per pruned layer, gac's ``taylor`` proxy vs the
reference's ``param_first``), and PaLU's ranks per projection (reference vs gac).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time


def _load_ref(name: str):
    """``benchmarks/parity_refs/<name>.py`` as a module, loaded from its file."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parity_refs", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"parity_ref_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compressors", nargs="+", default=["palu", "llm_pruner"], choices=["palu", "llm_pruner"])
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.15, 0.30])
    ap.add_argument("--model", default="tiny", help="tiny (default), smollm2 or a local Hugging Face directory")
    ap.add_argument("--text", default="tiny", help="calibration (train split) and perplexity (test split) text source")
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seq-len", type=int, default=256)
    ap.add_argument("--eval-seq-len", type=int, default=1024)
    ap.add_argument("--eval-windows", type=int, default=None, help="score only the first N windows (quick looks)")
    ap.add_argument("--eval-batch", type=int, default=1, help="windows per perplexity forward")
    ap.add_argument("--no-before", action="store_true",
                    help="skip the 'gac before #13' column (PaLU: svd + fisher + proportional + break-even cap; "
                         "LLM-Pruner: gradient + proportional)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's; 1 on the shared 2-core machine, where a 256-token "
                         "SmolLM2 forward took 1.0 s on 1 thread and 7.4 s on 2 contended ones)")
    ap.add_argument("--palu-fisher-loss", default="next_token", choices=["next_token", "two_ahead"],
                    help="gac PaLU's fisher_loss option (two_ahead: the reference code's doubly shifted loss)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="a smoke run: rho 0.3, calibration 2 x 64, two 128-token "
                    "windows, no 'before' column (no CPU lock; the numbers mean nothing)")
    args = ap.parse_args(argv)
    if args.quick:
        args.ratios, args.calib_samples, args.calib_seq_len = [0.3], 2, 64
        args.eval_seq_len, args.eval_windows, args.no_before = 128, 2, True
    from gac.machine import hold_cpu_lock

    hold_cpu_lock(enabled=not args.quick)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import torch
    from scipy.stats import spearmanr

    from gac.compression.calibration import Calibration
    from gac.compression.preparation import prepare
    from gac.evaluation import perplexity
    from gac.models import load_model

    torch.manual_seed(0)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    model, tok = load_model(args.model, dtype=torch.float32)
    model.eval()
    calib = Calibration(args.text, args.calib_samples, args.calib_seq_len, seed=0).token_ids(tok)

    def ppl(m) -> float:
        return perplexity(m, tok, args.text, seq_len=args.eval_seq_len, batch_size=args.eval_batch,
                          max_windows=args.eval_windows)["ppl"]

    base = ppl(model)
    print(f"{args.model}: baseline PPL {base:.2f}; calibration {tuple(calib.shape)} of {args.text}; eval windows of "
          f"{args.eval_seq_len}"
          f"{'' if args.eval_windows is None else f' (first {args.eval_windows})'}; load average {load0[0]:.2f}")
    rows, extra = [], []
    for name in args.compressors:
        ref_mod = _load_ref(name)
        prep = prepare(model, tok, name, calib_ids=calib,
                       compressor_options={"fisher_loss": args.palu_fisher_loss, "rank_cap": "full"}  # the reference's cap
                       if name == "palu" else None)
        print(f"\n{name}: gac defaults proxy={prep.proxy} allocation={prep.allocation} options={prep.compressor.options()}")
        before = None
        if not args.no_before:
            old_opts = {"decomposition": "svd", "rank_cap": "break_even"} if name == "palu" else None
            before = prepare(model, tok, name, "fisher" if name == "palu" else "gradient", calib_ids=calib,
                             allocation="proportional", compressor_options=old_opts)
        if name == "palu":
            fr = {k: float(v.mean()) for k, v in ref_mod.fisher_info(__import__("copy").deepcopy(model), calib).items()}
            f1 = {k: float(v.mean()) for k, v in
                  ref_mod.fisher_info(__import__("copy").deepcopy(model), calib, double_shift=False).items()}
            fg = {}
            for u in prep.units:
                fg.setdefault(u.meta["module"], []).append(prep.scores[u.name])
            fg = {k: sum(v) / len(v) for k, v in fg.items()}
            ks = sorted(fg)
            same = f1 if args.palu_fisher_loss == "next_token" else fr
            dev = max(abs(fg[k] / same[k] - 1) for k in ks)
            rho_q = float(spearmanr([fg[k] for k in ks], [fr[k] for k in ks])[0])
            print(f"Fisher per projection: gac fisher_rms (fisher_loss={args.palu_fisher_loss}) vs the reference's "
                  f"procedure with the same loss: max relative difference {dev:.2e}; vs the reference's "
                  f"double-shifted loss: Spearman {rho_q:.4f}, ratios " + ", ".join(f"{fg[k] / fr[k]:.2f}" for k in ks))
            extra.append({"compressor": name, "fisher_gac": fg, "fisher_ref": fr, "fisher_ref_plain_loss": f1})
        if name == "llm_pruner":
            imp = ref_mod.channel_importance(__import__("copy").deepcopy(model), calib,
                                             [u.meta["layer"] for u in prep.units])
            rhos = []
            for u in prep.units:
                f = prep.factors[u.name]
                e = torch.empty_like(f["energy"])
                e[f["order"]] = f["energy"]
                rhos.append((u.meta["layer"], float(spearmanr(e.numpy(), imp[u.meta["layer"]].numpy())[0])))
            print("channel-importance Spearman (gac taylor vs reference param_first), per layer: "
                  + ", ".join(f"{i}: {r:.6f}" for i, r in rhos))
            extra.append({"compressor": name, "spearman": dict(rhos)})
        for rho in args.ratios:
            t0 = time.perf_counter()
            ref = ref_mod.reference(model, tok, calib, rho)
            t_ref = time.perf_counter() - t0
            if ref["dense_params"] != prep.dense_params:
                raise SystemExit(f"{name}: the reference compresses {ref['dense_params']} dense weights, gac "
                                 f"{prep.dense_params}: not the same units")
            kept = ref["kept_params"]
            r_gac = 1.0 - (kept + 0.5) / prep.dense_params  # budget floor((1 - r) * dense) == kept exactly
            p_ref = ppl(ref["model"])
            cu, plan_u, rep_u = prep.compress(r_gac, "unaligned")
            cg, plan_g, rep_g = prep.compress(r_gac, "gac")
            if plan_u.budget != kept:
                raise SystemExit(f"budget {plan_u.budget} != reference kept {kept}")
            p_u, p_g = ppl(cu), ppl(cg)
            r32 = None
            if name == "palu":  # the reference's own rounding: each group's rank to the nearest multiple of 32
                c32, plan_32, _ = prep.compress(r_gac, "round_nearest", unit=32)
                r32 = {"ppl": ppl(c32), "params": plan_32.params, "dims": plan_32.dims}
                r32["vs_ref_pct"] = 100 * (r32["ppl"] / p_ref - 1)
                del c32
            p_b = None
            if before is not None:
                cb, plan_b, _ = before.compress(r_gac, "unaligned")
                p_b = ppl(cb)
                del cb
            row = {"compressor": name, "rho": rho, "dense": prep.dense_params, "kept": kept,
                   "kept_frac": kept / prep.dense_params, "ref_ppl": p_ref, "unaligned_ppl": p_u,
                   "unaligned_params": plan_u.params, "unaligned_vs_ref_pct": 100 * (p_u / p_ref - 1),
                   "unaligned_aligned_frac": plan_u.aligned_fraction, "gac_ppl": p_g, "gac_params": plan_g.params,
                   "gac_vs_unaligned_pct": 100 * (p_g / p_u - 1), "gac_aligned_frac": plan_g.aligned_fraction,
                   "before_ppl": p_b, "before_vs_ref_pct": None if p_b is None else 100 * (p_b / p_ref - 1),
                   "ref_s": t_ref, "ref_notes": ref["notes"], "unaligned_dims": plan_u.dims, "gac_dims": plan_g.dims,
                   "round32": r32}
            rows.append(row)
            print(f"rho={rho}: reference kept {kept} / {prep.dense_params} ({row['kept_frac']:.4f}) PPL {p_ref:.3f}; "
                  f"gac unaligned {p_u:.3f} ({row['unaligned_vs_ref_pct']:+.3f}%); gac aligned {p_g:.3f} "
                  f"({row['gac_vs_unaligned_pct']:+.3f}% vs unaligned)")
            if r32 is not None:
                print(f"  gac round_nearest unit 32 (the reference's rounding): {r32['ppl']:.3f} "
                      f"({r32['vs_ref_pct']:+.3f}% vs ref) at {r32['params']} parameters (reference {kept})")
            if p_b is not None:
                print(f"  gac before #13 (unaligned, same budget): {p_b:.3f} ({row['before_vs_ref_pct']:+.3f}% vs ref)")
            print(f"  reference: {ref['notes']}")
            print(f"  gac unaligned dims: {dict(plan_u.dims)}")
            print(f"  gac aligned dims:   {dict(plan_g.dims)}")
            del ref, cu, cg
    load1 = os.getloadavg()
    print("\n| compressor | rho | kept / dense | reference PPL | gac before #13 (vs ref) | gac unaligned PPL (vs ref) | "
          "gac aligned PPL (vs unaligned) | aligned (unaligned -> gac) |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b = "-" if r["before_ppl"] is None else f"{r['before_ppl']:.2f} ({r['before_vs_ref_pct']:+.2f}%)"
        print(f"| {r['compressor']} | {r['rho']:.2f} | {r['kept']:,} / {r['dense']:,} ({100 * r['kept_frac']:.1f}%) | "
              f"{r['ref_ppl']:.2f} | {b} | {r['unaligned_ppl']:.2f} ({r['unaligned_vs_ref_pct']:+.2f}%) | "
              f"{r['gac_ppl']:.2f} ({r['gac_vs_unaligned_pct']:+.2f}%) | "
              f"{100 * r['unaligned_aligned_frac']:.0f}% -> {100 * r['gac_aligned_frac']:.0f}% |")
    wall = time.perf_counter() - t_start
    print(f"\nbaseline {base:.2f}; wall {wall:.0f} s; load average {load0[0]:.2f} at start, {load1[0]:.2f} at end; "
          f"torch threads {torch.get_num_threads()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"baseline": base, "rows": rows, "extra": extra, "load": [load0, load1], "wall_s": wall}, f,
                      indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
