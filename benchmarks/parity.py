"""gac against the reference procedure of each compressor, at equal parameters, on ``tiny`` (issue 13's protocol)
or another model (``--model``: SmolLM2-135M, issue 24).

    python benchmarks/parity.py                  # ASVD and SVD-LLM, rho 0.15 0.30
    python benchmarks/parity.py --compressors asvd --ratios 0.15 --json out.json
    python benchmarks/parity.py --model smollm2 --compressors svd_llm --ratios 0.15
    python benchmarks/parity.py --model smollm2 --compressors asvd --ratios 0.15 --probe-samples 1
    python benchmarks/parity.py --quick          # seconds: a smoke run of every compressor at small sizes

Each run holds the serial CPU lock (``gac.machine.hold_cpu_lock``) while it measures; ``--quick`` does not.

For each compressor that has an independent reference implementation in ``benchmarks/parity_refs/<name>.py``
(a function ``reference(model, tokenizer, calib_ids, ratio) -> dict(model, kept_params, dense_params, notes)``
written from the paper and the authors' code, sharing no compression code with gac) and each compression ratio
rho:

1. the reference compresses tiny at rho; its perplexity is measured and its kept parameter count P is read;
2. gac's ``unaligned`` strategy (the compressor's defaults: proxy, allocation) runs at the budget B = P, i.e. the
   same number of compressed-weight parameters as the reference kept, so the two perplexities compare directly
   (target: gac within 0.5% of the reference, or better);
3. gac's ``gac`` strategy (aligned, exact knapsack) runs at the same budget: what alignment costs or gains.

Protocol: perplexity on tiny's full test text in non-overlapping 1024-token windows (62 windows; baseline 233.37),
calibration 32 x 256 tokens from tiny's train text, seed 0, float32 on CPU. On another model the same texts
(``--text``) and windows. ``--probe-samples N``: ASVD's sensitivity probes (one calibration perplexity per weight
and kept ratio) run on the first N calibration samples, on both sides (gac's ``sensitivity_samples``, the
reference's ``probe_samples``); the activation statistics still use all of them. The reference probes with full
forwards (its own loop), so on SmolLM2-135M (210 weights x 6 ratios) its table costs about 1260 x N forwards of 256
tokens. ``svd_llm:update`` is SVD-LLM with the
reference's optional parameter-update step (``--step 2``) on both sides. gac prepares each compressor once
(scores, factors, sensitivity table) and reuses it for every ratio; a reference whose ``reference`` accepts a
``table`` keyword gets its own sensitivity table back for the next ratio (it does not depend on the ratio).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

REFS = Path(__file__).resolve().parent / "parity_refs"
ORDER = ("asvd", "svd_llm", "palu", "llm_pruner")


def available_refs() -> dict[str, Path]:
    found = {p.stem: p for p in sorted(REFS.glob("*.py")) if not p.stem.startswith("_")}
    return {k: found[k] for k in sorted(found, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))}


def load_ref(path: Path):
    spec = importlib.util.spec_from_file_location(f"parity_ref_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not callable(getattr(mod, "reference", None)):
        raise SystemExit(f"{path}: no reference(model, tokenizer, calib_ids, ratio) function")
    return mod.reference


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compressors", nargs="+", default=["asvd", "svd_llm", "svd_llm:update"],
                    help="references in benchmarks/parity_refs/ (default asvd svd_llm svd_llm:update; NAME:OPT runs "
                         "the reference with OPT=True and gac with the compressor option OPT=true; PaLU and "
                         "LLM-Pruner: benchmarks/parity_prune.py)")
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.15, 0.30])
    ap.add_argument("--model", default="tiny", help="tiny (default), smollm2 or a local Hugging Face directory")
    ap.add_argument("--text", default="tiny", help="calibration (train split) and perplexity (test split) text source")
    ap.add_argument("--probe-samples", type=int, default=None,
                    help="ASVD: sensitivity probes on the first N calibration samples, both sides (default: all)")
    ap.add_argument("--asvd-ref-svd", choices=("lowrank", "exact"), default="lowrank",
                    help="ASVD: the reference factorises with the authors' randomised torch.svd_lowrank (default) or "
                         "an exact SVD truncated to the same rank (isolates the factoriser; gac's is exact)")
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seq-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-seq-len", type=int, default=1024)
    ap.add_argument("--eval-windows", type=int, default=None, help="score only the first N windows (quick checks)")
    ap.add_argument("--eval-batch", type=int, default=1, help="windows per perplexity forward")
    ap.add_argument("--target", type=float, default=0.5, help="allowed PPL excess of gac unaligned over the reference, %%")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: on the shared 2-core machine the references' one-sample "
                         "forwards ran 13x slower on 2 contended threads than on 1)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--ref-tables", default=None,
                    help="JSON file of the references' sensitivity tables (ASVD): read when it exists and was made "
                         "with the same model, text, calibration and probe samples; written after a table is computed")
    ap.add_argument("--ref-tables-only", action="store_true",
                    help="compute the references' sensitivity tables into --ref-tables and stop (splits a long ASVD "
                         "run on smollm2 into two shorter ones)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the uncompressed model's perplexity")
    ap.add_argument("-v", "--verbose", action="store_true", help="log progress (sensitivity tables take minutes)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: rho 0.3, calibration 2 x 64, two 128-token "
                    "windows, one ASVD probe sample (no CPU lock; the numbers mean nothing)")
    args = ap.parse_args(argv)
    if args.quick:
        args.ratios, args.calib_samples, args.calib_seq_len = [0.3], 2, 64
        args.eval_seq_len, args.eval_windows, args.probe_samples = 128, 2, 1
    from gac.machine import hold_cpu_lock

    hold_cpu_lock(enabled=not args.quick)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")

    import torch

    from gac.compression.calibration import Calibration
    from gac.compression.preparation import prepare
    from gac.evaluation import perplexity
    from gac.models import load_model

    if args.ref_tables_only and not args.ref_tables:
        raise SystemExit("--ref-tables-only needs --ref-tables FILE")
    refs = available_refs()
    names = args.compressors
    missing = [n for n in names if n.partition(":")[0] not in refs]
    if missing:
        raise SystemExit(f"no reference implementation for {missing} in {REFS} (have: {', '.join(refs) or 'none'})")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    model, tok = load_model(args.model, dtype=torch.float32)
    model.eval()
    calib = Calibration(args.text, args.calib_samples, args.calib_seq_len, args.seed).token_ids(tok)

    def ppl(m) -> float:
        return perplexity(m, tok, args.text, seq_len=args.eval_seq_len, batch_size=args.eval_batch,
                          max_windows=args.eval_windows)["ppl"]

    table_key = {"model": args.model, "text": args.text, "calib": [args.calib_samples, args.calib_seq_len, args.seed],
                 "probe_samples": args.probe_samples}
    if args.asvd_ref_svd != "lowrank":  # (files written before the option keep their key)
        table_key["asvd_ref_svd"] = args.asvd_ref_svd
    saved = {}
    if args.ref_tables and os.path.exists(args.ref_tables):
        with open(args.ref_tables) as f:
            saved = json.load(f)
        if saved.get("key") != table_key:
            raise SystemExit(f"{args.ref_tables} was made for {saved.get('key')}, not {table_key}: remove it or "
                             f"name another file")
    saved_tables = {label: {n: {float(p): v for p, v in row.items()} for n, row in t.items()}
                    for label, t in saved.get("tables", {}).items()}

    def save_table(label, tab):
        if args.ref_tables and tab is not None:
            saved_tables[label] = tab
            with open(args.ref_tables, "w") as f:
                json.dump({"key": table_key, "tables": saved_tables}, f)

    def ref_kwargs(name: str, flag: str) -> dict:
        """The reference's keyword arguments for a ``NAME[:FLAG]`` label: the flag, and ASVD's probe samples and SVD."""
        kw = {flag: True} if flag else {}
        if name == "asvd" and args.probe_samples is not None:
            kw["probe_samples"] = args.probe_samples
        if name == "asvd" and args.asvd_ref_svd != "lowrank":
            kw["svd"] = args.asvd_ref_svd
        return kw

    if args.ref_tables_only:
        for label in names:
            name, _, flag = label.partition(":")
            reference = load_ref(refs[name])
            if "table" not in inspect.signature(reference).parameters or label in saved_tables:
                continue
            t1 = time.perf_counter()
            ref = reference(model, tok, calib, args.ratios[0], **ref_kwargs(name, flag))
            save_table(label, ref.get("table"))
            print(f"{label}: reference sensitivity table in {time.perf_counter() - t1:.0f}s -> {args.ref_tables}; "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
        return 0

    base = float("nan") if args.no_baseline else ppl(model)
    print(f"{args.model}: baseline perplexity {'not measured' if args.no_baseline else f'{base:.2f}'} ({args.eval_seq_len}-token windows of {args.text} test); "
          f"calibration {args.calib_samples} x {args.calib_seq_len} {args.text} train tokens, seed {args.seed}; "
          f"ASVD probe samples {args.probe_samples or 'all'}, reference SVD {args.asvd_ref_svd}; torch threads "
          f"{torch.get_num_threads()}; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    rows = []
    for label in names:
        name, _, flag = label.partition(":")
        reference = functools.partial(load_ref(refs[name]), **ref_kwargs(name, flag))
        options = {flag: True} if flag else {}
        if args.probe_samples is not None and name == "asvd":
            options["sensitivity_samples"] = args.probe_samples
        takes_table = "table" in inspect.signature(reference).parameters
        t0 = time.perf_counter()
        prep = prepare(model, tok, name, calib_ids=calib, compressor_options=options or None)
        t_prep = time.perf_counter() - t0
        print(f"{label}: gac prepared in {t_prep:.0f}s (proxy {prep.proxy}, allocation {prep.allocation}, "
              f"{len(prep.units)} targets, {prep.dense_params:,} dense weight parameters)", flush=True)
        table = saved_tables.get(label)
        if table is not None:
            print(f"{label}: the reference's sensitivity table read from {args.ref_tables}", flush=True)
        for rho in args.ratios:
            t1 = time.perf_counter()
            ref = reference(model, tok, calib, rho, table=table) if takes_table else reference(model, tok, calib, rho)
            t_ref = time.perf_counter() - t1
            if ref.get("table") is not None and ref.get("table") is not table:
                save_table(label, ref["table"])
            table = ref.get("table", table)
            if int(ref["dense_params"]) != prep.dense_params:
                raise SystemExit(f"{name}: the reference compresses {ref['dense_params']:,} dense parameters, gac "
                                 f"{prep.dense_params:,}; they must cover the same weights to compare")
            ref_ppl = ppl(ref["model"])
            del ref["model"]
            budget = int(ref["kept_params"])
            row = {"compressor": label, "rho": rho, "ref_params": budget, "ref_kept": budget / prep.dense_params,
                   "ref_ppl": ref_ppl, "ref_notes": ref.get("notes", ""), "ref_s": t_ref}
            for strategy in ("unaligned", "gac"):
                cm, plan, report = prep.compress(rho, strategy, budget=budget)
                row[strategy] = {"ppl": ppl(cm), "params": plan.params, "budget": plan.budget,
                                 "aligned_fraction": plan.aligned_fraction, "n_dense": len(plan.dense),
                                 "notes": plan.notes}
                del cm
            row["diff_pct"] = 100 * (row["unaligned"]["ppl"] - ref_ppl) / ref_ppl
            row["aligned_pct"] = 100 * (row["gac"]["ppl"] - row["unaligned"]["ppl"]) / row["unaligned"]["ppl"]
            row["within_target"] = row["diff_pct"] <= args.target
            rows.append(row)
            print(f"  rho {rho}: reference {ref_ppl:.2f} at {budget:,} params ({ref.get('notes', '')}); gac "
                  f"unaligned {row['unaligned']['ppl']:.2f} ({row['diff_pct']:+.2f}%), aligned "
                  f"{row['gac']['ppl']:.2f} ({row['aligned_pct']:+.2f}%)", flush=True)
            assert math.isfinite(row["unaligned"]["ppl"]) and math.isfinite(ref_ppl)
        if takes_table:
            del table
    load1 = os.getloadavg()
    print()
    print("| compressor | rho | params (kept) | reference PPL | gac unaligned PPL | diff % | gac aligned PPL | "
          "aligned % | aligned dims |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        flag = "" if r["within_target"] else " (over target)"
        print(f"| {r['compressor']} | {r['rho']:.2f} | {r['ref_params']:,} ({100 * r['ref_kept']:.1f}%) | "
              f"{r['ref_ppl']:.2f} | {r['unaligned']['ppl']:.2f} | {r['diff_pct']:+.2f}{flag} | {r['gac']['ppl']:.2f} | "
              f"{r['aligned_pct']:+.2f} | {100 * r['gac']['aligned_fraction']:.0f}% (unaligned "
              f"{100 * r['unaligned']['aligned_fraction']:.0f}%) |")
    print(f"\nbaseline {base:.2f}; wall {time.perf_counter() - t_start:.0f}s; load average at start "
          f"{load0[0]:.2f}, at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"baseline_ppl": base, "load_start": load0, "load_end": load1, "rows": rows}, f, indent=2,
                      default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
