"""Where the time and memory of a compression job go, per stage, as models grow; extrapolated to Llama-3-8B.

    python benchmarks/scale.py jobs --shapes tiny h512 h1024 --out scale.json
    python benchmarks/scale.py jobs --shapes llama1b --compressors asvd --out scale.json
    python benchmarks/scale.py methods --out scale.json     # factorisation speed and error against the exact SVD
    python benchmarks/scale.py ppl --out scale.json         # end-to-end PPL on tiny per factorisation method
    python benchmarks/scale.py plan --out scale.json        # the plan step at Llama-3-8B shapes (224 targets)
    python benchmarks/scale.py grads --shapes h512 h1024 llama1b --out scale.json   # gradient pass memory
    python benchmarks/scale.py report --out scale.json      # the tables, fitted growth and the 8B extrapolation
    python benchmarks/scale.py jobs --device cuda --shapes l8bx2 --threads 2 --out gpu.json   # on a GPU node
    python benchmarks/scale.py jobs --quick --out q.json    # seconds: tiny, calibration 2 x 64, unpinned (smoke run)

Every part appends its rows to ``--out`` (JSON), so a long measurement can be split into runs that each hold the
serial CPU lock (``gac.machine.hold_cpu_lock``, taken by every part that measures on the CPU, except with ``--quick``)
briefly; ``report`` reads them all. ``jobs`` runs each (shape, compressor) as its own process (a clean
peak RSS), through the real job (:func:`gac.jobs.run.recipe.run_job`: random Llama-shaped fp32 weights built from a
config, ``calibration.source=random`` 8 x 256 tokens, ratio 0.15, ``eval=none``), pinned to one core with one thread
(``taskset -c 1``, the issue's baseline) unless ``--threads 2``; the row is the record's per-stage ``timings`` and
``memory`` plus the memory estimate (:mod:`gac.compression.footprint`) made before loading. With ``--device cuda``
the model and the work live on the GPU: the rows' peak is the GPU's (``torch.cuda.max_memory_allocated`` per stage,
the record's ``gpu_peak_mb``) beside the estimate's device bytes, and the host RSS is reported as host RSS.

Shapes: ``tiny`` (the embedded model's architecture), ``hN`` (hidden N, intermediate 4N, N/64 heads, N/256 KV
heads, 4 layers, Llama-3 vocabulary, tied embeddings: the growth family), ``llama1b`` (Llama-3.2-1B), ``l8bxK``
(K decoder layers of Llama-3-8B's shapes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
L3_VOCAB = 128256
L8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)
COMPRESSORS = ("asvd", "svd_llm", "llm_pruner", "palu")


def shape_arch(name: str) -> dict:
    base = dict(model_type="llama", vocab_size=L3_VOCAB, max_position_embeddings=8192, rope_theta=500000.0)
    if name == "tiny":
        return dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4096,
                    max_position_embeddings=1024, tie_word_embeddings=True)
    if name == "llama1b":
        return {**base, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True}
    if name.startswith("l8bx"):
        return {**base, **L8B, "num_hidden_layers": int(name[4:]), "tie_word_embeddings": False}
    if name.startswith("h"):
        h = int(name[1:])
        return {**base, "hidden_size": h, "intermediate_size": 4 * h, "num_hidden_layers": 4,
                "num_attention_heads": max(1, h // 64), "num_key_value_heads": max(1, h // 256),
                "tie_word_embeddings": True}
    raise SystemExit(f"unknown shape {name!r}: tiny, hN (e.g. h1024), llama1b, l8bxK (e.g. l8bx2)")


def _append(out: str, rows: list[dict]) -> None:
    p = Path(out)
    old = json.loads(p.read_text()) if p.exists() else []
    p.write_text(json.dumps(old + rows, indent=1))


def _load(out: str) -> list[dict]:
    p = Path(out)
    return json.loads(p.read_text()) if p.exists() else []


def _env() -> dict:
    load = os.getloadavg()
    return {"loadavg": [round(x, 2) for x in load], "date": time.strftime("%Y-%m-%d %H:%M:%S")}


# ------------------------------------------------------------------------------------------------------- one job
def one_job(args) -> int:
    """Run one (shape, compressor) job in this process and print its row as JSON on the last line."""
    import torch

    torch.set_num_threads(args.threads)
    from gac.jobs.config.build import job_from_config
    from gac.jobs.run.memory_fits import check_job_fits
    from gac.jobs.run.recipe import run_job
    from gac.results import ResultsStore

    arch = shape_arch(args.shape)
    cfg = {"compressor": {"name": args.compressor, "options": ({"svd": args.svd} if args.svd else {})},
           "align": {"strategy": "gac", "unit": 8, "window": 1, "use_profile": False}, "ratio": 0.15, "seq_len": 256,
           "allocation": args.allocation,  # the sensitivity search is measured on its own (docs/scale.md)
           "gpu": {"device": args.device, "profile": "none"}, "seed": 0,
           "model": {"name": args.shape, "spec": args.shape, "random_weights": True, "arch": arch},
           "calibration": {"source": "random", "n_samples": args.samples, "seq_len": args.calib_len},
           "eval": {"ppl": False, "tasks": [], "latency": False}}
    if args.compressor == "palu" and args.svd:
        cfg["compressor"]["options"] = {}
    job = job_from_config(cfg)
    fp = check_job_fits(job.spec)
    with tempfile.TemporaryDirectory() as d:
        rec = run_job(job, ResultsStore(d))
    row = {"kind": "job", "shape": args.shape, "compressor": args.compressor, "threads": args.threads,
           "allocation": args.allocation,
           "svd": args.svd, "samples": args.samples, "calib_len": args.calib_len, "arch": arch,
           "device": args.device,
           "params": None if fp is None else fp.params, "timings": rec["timings"], "memory": rec["memory"],
           "estimate": None if fp is None else fp.to_json(), "n_targets": rec["compression"]["n_targets"], **_env()}
    print(json.dumps(row))
    return 0


def jobs(args) -> int:
    rows, failed = [], 0
    for shape in args.shapes:
        for comp in args.compressors:
            cmd = [sys.executable, __file__, "one", "--shape", shape, "--compressor", comp, "--threads",
                   str(args.threads), "--samples", str(args.samples), "--calib-len", str(args.calib_len),
                   "--device", args.device]
            if args.svd:
                cmd += ["--svd", args.svd]
            cmd += ["--allocation", args.allocation]
            if args.threads == 1 and args.pin is not None:
                cmd = ["taskset", "-c", str(args.pin)] + cmd
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                print(f"{shape} {comp}: failed (exit {r.returncode})\n{r.stderr[-2000:]}", file=sys.stderr)
                failed += 1
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row["process_wall_s"] = time.perf_counter() - t0
            rows.append(row)
            _print_job(row)
            _append(args.out, [row])
    return 1 if failed else 0


def _on_gpu(r: dict) -> bool:
    return str(r.get("device") or r.get("memory", {}).get("device") or "cpu").startswith("cuda")


def _peak_key(r: dict) -> str:
    """The per-stage peak a row reports: GPU memory on a GPU run (the host RSS there is not the job's peak)."""
    return "gpu_peak_mb" if _on_gpu(r) else "peak_rss_mb"


def _print_job(r: dict) -> None:
    t, m = r["timings"], r["memory"]["stages"]
    key = {"dp": "plan", "compress_apply": "apply"}
    pk = _peak_key(r)
    st = " ".join(f"{k[:-2]} {v:.1f}s/{m.get(key.get(k[:-2], k[:-2]), {}).get(pk, float('nan')) / 1024:.2f}G"
                  for k, v in t.items() if k.endswith("_s") and k[:-2] in STAGES)
    peak = r["memory"].get(pk, float("nan"))
    print(f"{r['shape']:<8} {r['compressor']:<10} threads {r['threads']} prepare {t.get('compress_prepare_s', 0):.1f}s "
          f"{'GPU ' if _on_gpu(r) else ''}peak {peak / 1024:.2f}G | {st} | load {r['loadavg'][0]}", flush=True)


STAGES = ("load", "calibration", "gradients", "score", "factorize", "dp", "apply", "compress_apply")


# ------------------------------------------------------------------------------------------------- gradients
def one_grad(args) -> int:
    """The gradient pass alone, as LLM-Pruner's default job runs it (its MLP projections, its ``taylor`` proxy's
    element-wise running sum beside the row/column statistics) on one random shape, with or without activation
    checkpointing; prints its row as JSON."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gac.compression.compressors import get_compressor
    from gac.compression.discovery import discover
    from gac.compression.footprint import estimate_footprint
    from gac.compression.gradients import collect_gradient_stats
    from gac.compression.proxies import get_proxy
    from gac.compression.resources import ResourceMeter

    torch.set_num_threads(args.threads)
    arch = shape_arch(args.shape)
    a = dict(arch)
    config = AutoConfig.for_model(a.pop("model_type"), **a)
    meter = ResourceMeter(args.device)
    with meter.stage("load"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval().to(args.device)
    lay = discover(model)
    comp = get_compressor("llm_pruner")
    names = comp.stat_modules(comp.units(model, lay))
    elementwise = get_proxy(comp.default_proxy).elementwise
    ids = torch.randint(0, config.vocab_size, (args.samples, args.calib_len), generator=torch.Generator().manual_seed(0))
    ck = args.checkpoint == "on"
    with meter.stage("gradients"):
        collect_gradient_stats(model, ids, names, elementwise=elementwise, checkpoint=ck, layout=lay)
    m = meter.memory()["gradients"]
    fp = estimate_footprint(config, "llm_pruner", n_samples=args.samples, seq_len=args.calib_len, grad_checkpoint=ck,
                            device=args.device)
    if args.device.startswith("cuda"):  # the GPU's peak (weights included) over the weights: what the pass adds
        start, peak = meter.memory()["load"]["gpu_peak_mb"], m["gpu_peak_mb"]
    else:
        start, peak = m["start_rss_mb"], m["peak_rss_mb"]
    row = {"kind": "grad", "shape": args.shape, "arch": arch, "checkpoint": ck, "threads": args.threads,
           "device": args.device, "samples": args.samples, "calib_len": args.calib_len,
           "seconds": meter.timings()["gradients_s"], "start_mb": start, "peak_mb": peak, "growth_mb": peak - start,
           "estimate_mb": fp.gradients / 2**20, "params": fp.params, **_env()}
    print(json.dumps(row))
    return 0


def grads(args) -> int:
    for shape in args.shapes:
        for ck in ("off", "on"):
            cmd = [sys.executable, __file__, "one-grad", "--shape", shape, "--checkpoint", ck, "--threads",
                   str(args.threads), "--samples", str(args.samples), "--calib-len", str(args.calib_len),
                   "--device", args.device]
            if args.threads == 1 and args.pin is not None:
                cmd = ["taskset", "-c", str(args.pin)] + cmd
            r = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)},
                               capture_output=True, text=True)
            if r.returncode:
                print(f"{shape} checkpoint {ck}: failed\n{r.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{shape:<8} checkpoint {ck:<3} {row['seconds']:7.1f}s  {'GPU ' if _on_gpu(row) else ''}"
                  f"peak-over-start {row['growth_mb'] / 1024:6.2f} GiB"
                  f"  estimate {row['estimate_mb'] / 1024:6.2f} GiB | load {row['loadavg'][0]}", flush=True)
            _append(args.out, [row])
    return 0


# ------------------------------------------------------------------------------------------------ factorisations
def methods(args) -> int:
    """Speed and output error of every factorisation method against the exact float64 SVD, on planted spectra."""
    import torch

    from gac.compression.compressors.lowrank_math import SVD_METHODS, asvd_factors, svdllm_factors

    torch.set_num_threads(args.threads)
    rows = []
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.mshapes]
    print(f"{'weight':<12} {'k':>5} {'compressor':<8} " + " ".join(f"{m:>22}" for m in SVD_METHODS))
    for m, n in shapes:
        g = torch.Generator().manual_seed(m * 7 + n)
        lo = min(m, n)
        U, _ = torch.linalg.qr(torch.randn(m, lo, generator=g, dtype=torch.float64))
        V, _ = torch.linalg.qr(torch.randn(n, lo, generator=g, dtype=torch.float64))
        s = torch.logspace(0, -3, lo, dtype=torch.float64)  # three decades, like trained projections
        W = ((U * s) @ V.T).float()
        del U, V
        T = max(2 * n, 512)
        X = torch.randn(T, n, generator=g) * torch.logspace(0, -1.5, n)[torch.randperm(n, generator=g)]
        act = X.abs().mean(0)
        C = X.double().T @ X.double()
        Y = X.double() @ W.double().T
        yty = Y.T @ Y
        del Y
        k = m * n // (m + n)
        for comp in ("asvd", "svd_llm"):
            res = {}
            for meth in SVD_METHODS if not args.skip_exact or (m * n) < 2**24 else SVD_METHODS[1:]:
                t0 = time.perf_counter()
                if comp == "asvd":
                    A, B = asvd_factors(W, act, max_rank=k, method=meth)
                    err = float(torch.linalg.norm((W.double() - A.double() @ B.double()) * act.double().sqrt()))
                else:
                    A, B, _ = svdllm_factors(W, C if (meth in ("exact", "randomized") or m > n) else None, max_rank=k,
                                             method=meth, yty=yty if meth.startswith("gram") else None,
                                             trace=float(C.diagonal().sum()))
                    err = float(torch.linalg.norm(X.double() @ (W.double() - A.double() @ B.double()).T))
                res[meth] = {"s": time.perf_counter() - t0, "err": err}
            ref = res.get("exact", res["gram64"])["err"]
            for v in res.values():
                v["rel_err"] = v["err"] / ref - 1.0
            row = {"kind": "method", "m": m, "n": n, "k": k, "compressor": comp, "threads": args.threads,
                   "results": res, **_env()}
            rows.append(row)
            print(f"{m}x{n:<7} {k:>5} {comp:<8} " + " ".join(
                f"{res[x]['s']:>9.2f}s {res[x]['rel_err']:>+10.1e}" if x in res else f"{'-':>22}" for x in SVD_METHODS),
                flush=True)
    _append(args.out, rows)
    return 0


def ppl(args) -> int:
    """End-to-end perplexity on tiny for every factorisation method (asvd and svd_llm at two ratios)."""
    import torch

    from gac.compression.calibration import Calibration
    from gac.compression.compressors.lowrank_math import SVD_METHODS
    from gac.compression.preparation import prepare
    from gac.evaluation import perplexity
    from gac.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model("tiny", dtype=torch.float32)
    calib = Calibration("tiny", 32, 256).token_ids(tok)
    rows = []
    base = perplexity(model, tok, "tiny", seq_len=256)["ppl"]
    print(f"tiny baseline PPL {base:.4f} (test split, 256-token windows)")
    for comp in args.compressors:
        ref = {}
        for meth in SVD_METHODS:
            t0 = time.perf_counter()
            prep = prepare(model, tok, comp, calib_ids=calib, compressor_options={"svd": meth})
            t_prep = time.perf_counter() - t0
            for ratio in (0.15, 0.30):
                cm, plan, _ = prep.compress(ratio, "gac")
                p = perplexity(cm, tok, "tiny", seq_len=256)["ppl"]
                del cm
                if meth == "exact":
                    ref[ratio] = p
                rel = p / ref[ratio] - 1.0
                rows.append({"kind": "ppl", "compressor": comp, "svd": meth, "ratio": ratio, "ppl": p, "rel": rel,
                             "factorize_s": prep.timings["factorize_s"], "prepare_s": t_prep, **_env()})
                print(f"{comp:<8} {meth:<10} ratio {ratio:.2f}  PPL {p:9.4f}  vs exact {100 * rel:+.3f}%  "
                      f"factorize {prep.timings['factorize_s']:.2f}s", flush=True)
    _append(args.out, rows)
    return 0


def plan(args) -> int:
    """The plan step (allocation, marginal scores, candidate sets, exact knapsack) at Llama-3-8B shapes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gac.compression.compressors import get_compressor
    from gac.compression.discovery import discover
    from gac.compression.prepared import Prepared

    torch.set_num_threads(1)
    rows = []
    for layers, with_factors in ((32, False), (4, True)):
        cfg = AutoConfig.for_model("llama", **L8B, num_hidden_layers=layers, vocab_size=L3_VOCAB)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        comp = get_compressor("asvd")
        layout = discover(model)
        units = comp.units(model, layout)
        g = torch.Generator().manual_seed(0)
        factors = {}
        for i, u in enumerate(units):
            S = torch.linspace(1.0, 0.01, u.d_cap, dtype=torch.float64) * (1 + i % 7)
            if with_factors:  # full-size A only (the curve fallback reads A when S is absent, as old caches)
                mod = model.get_submodule(u.name)
                A = torch.randn(mod.out_features, u.d_cap, generator=g) * S.sqrt().float()[None, :]
                factors[u.name] = {"A": A / A.norm(dim=0, keepdim=True) * S.sqrt().float()[None, :]}
            else:
                factors[u.name] = {"S": S}
        scores = {u.name: float(1 + (i * 37) % 11) for i, u in enumerate(units)}
        prep = Prepared(model, comp, "activation", {}, "proportional", 0.5, layout, units, scores, factors,
                        {"prepare_s": 0.0})
        for strategy in ("gac", "unaligned"):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                prep.plan(0.15, strategy)
                times.append(time.perf_counter() - t0)
            times.sort()
            row = {"kind": "plan", "targets": len(units), "curve_from": "A" if with_factors else "S",
                   "strategy": strategy, "median_ms": 1000 * times[2], "max_ms": 1000 * times[-1], **_env()}
            rows.append(row)
            print(f"plan {len(units)} targets (error curve from {row['curve_from']}) {strategy:<9} median "
                  f"{row['median_ms']:.1f} ms, max {row['max_ms']:.1f} ms | load {row['loadavg'][0]}", flush=True)
        del factors, prep, model
    _append(args.out, rows)
    return 0


# ------------------------------------------------------------------------------------------------------- report
def _fit(xs, ys):
    """Least-squares slope and intercept of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    n = len(lx)
    mx, my = sum(lx) / n, sum(ly) / n
    sxx = sum((a - mx) ** 2 for a in lx)
    b = sum((a - mx) * (c - my) for a, c in zip(lx, ly)) / sxx if sxx else 0.0
    return b, my - b * mx


def _flops_8b(comp: str, tokens: int, svd: str = "gram32") -> dict:
    """FLOPs per stage of one Llama-3-8B job (32 layers): the statistics GEMMs, the factorisations, the forward."""
    h, inter, L, kv = 4096, 14336, 32, 1024
    lin = {"q": (h, h), "k": (kv, h), "v": (kv, h), "o": (h, h), "gate": (inter, h), "up": (inter, h),
           "down": (h, inter)}
    fwd = 2 * tokens * sum(o * i for o, i in lin.values()) * L
    out = {"calibration_forward": fwd}
    if comp == "svd_llm":
        out["statistics"] = 2 * tokens * L * (4 * h * h + 2 * kv * kv + h * h)  # Y^T Y (q,k,v,o,down), X^T X (mlp)
    fac = 0
    for o, i in lin.values():
        lo, k = min(o, i), o * i // (o + i)
        if svd == "exact":
            fac += 4 * o * i * lo + 22 * lo ** 3
        else:
            fac += 2 * o * i * lo + 10 * lo ** 3 + 2 * o * i * k  # Gram, eigh (~10 n^3 with vectors), the other factor
    if comp in ("asvd", "svd_llm"):
        out["factorize"] = fac * L
    if comp in ("llm_pruner", "palu"):
        out["gradients"] = 3 * fwd + 2 * tokens * h * L3_VOCAB * 3
    return out


def report(args) -> int:
    rows = _load(args.out)
    job = [r for r in rows if r.get("kind") == "job"]
    print("## Per-stage wall time (s) and peak memory (GiB): host RSS on CPU rows, GPU memory on cuda rows\n")
    cols = ("load", "gradients", "calibration", "score", "factorize", "dp", "compress_apply")
    print("| shape | params | compressor | allocation | threads | prepare s | prepare CPU s | " + " | ".join(cols)
          + " | sensitivity s | peak GiB | fp32 model GiB | estimate GiB | load avg |")
    print("|---|---:|---|---|---:|---:|---:|" + "---:|" * len(cols) + "---:|---:|---:|---:|---|")
    for r in job:
        t, m = r["timings"], r["memory"]["stages"]
        mem_key = {"dp": "plan", "compress_apply": "apply"}
        cells = []
        for c in cols:
            if f"{c}_s" not in t:
                cells.append("")
                continue
            pk = m.get(mem_key.get(c, c), {}).get(_peak_key(r))
            cells.append(f"{t[f'{c}_s']:.1f} / {pk / 1024:.2f}" if pk else f"{t[f'{c}_s']:.1f}")
        est = r.get("estimate") or {}
        p = r.get("params") or 0
        cpu = m.get("prepare", {}).get("cpu_s")
        sens = t.get("sensitivity_s")
        print(f"| {r['shape']} | {p / 1e9:.3f}B | {r['compressor']} | {r.get('allocation', 'proportional')} | "
              f"{r['threads']} | {t.get('compress_prepare_s', 0):.1f} | {'' if cpu is None else f'{cpu:.1f}'} | "
              + " | ".join(cells) + f" | {'' if sens is None else f'{sens:.1f}'} | "
              f"{_row_peak(r) / 1024:.2f}{' (GPU)' if _on_gpu(r) else ''} | {p * 4 / 2**30:.2f} | "
              f"{est.get('device_bytes' if _on_gpu(r) else 'host_bytes', 0) / 2**30:.2f} | {r['loadavg'][0]} |")
    fam = [r for r in job if r["shape"].startswith("h") and r["threads"] == 1 and not _on_gpu(r)]
    if fam:
        print("\n## Fitted growth (one thread): log-log slope of each stage's time and peak-RSS increase against the "
              "hidden size h (4 layers, I = 4h)\n")
        print("| compressor | stage | slope (time) | slope (memory over start) | points |")
        print("|---|---|---:|---:|---:|")
        for comp in COMPRESSORS:
            rs = sorted((r for r in fam if r["compressor"] == comp), key=lambda r: r["arch"]["hidden_size"])
            if len(rs) < 2:
                continue
            for st in ("calibration", "gradients", "factorize", "compress_prepare"):
                pts = [(r["arch"]["hidden_size"], r["timings"].get(f"{st}_s"),
                        r["memory"]["stages"].get(st if st != "compress_prepare" else "prepare", {})) for r in rs]
                pts = [p for p in pts if p[1]]
                if len(pts) < 2:
                    continue
                bt, _ = _fit([p[0] for p in pts], [p[1] for p in pts])
                grow = [(p[0], p[2].get("peak_rss_mb", 0) - p[2].get("start_rss_mb", 0)) for p in pts]
                grow = [g for g in grow if g[1] > 1]
                bm = f"{_fit([g[0] for g in grow], [g[1] for g in grow])[0]:.2f}" if len(grow) >= 2 else "-"
                print(f"| {comp} | {st} | {bt:.2f} | {bm} | {len(pts)} |")
    _report_grads(rows)
    _report_methods(rows)
    _report_ppl(rows)
    _report_plan(rows)
    _extrapolate(job)
    return 0


def _row_peak(r: dict) -> float:
    """A job row's peak in MiB: the GPU's on a cuda row (the record's gpu_peak_mb), else the host RSS."""
    return float(r["memory"].get("gpu_peak_mb") or 0.0) if _on_gpu(r) else float(r["memory"]["peak_rss_mb"])


def _report_grads(rows):
    gs = [r for r in rows if r.get("kind") == "grad"]
    if not gs:
        return
    print("\n## The gradient pass (Taylor + Fisher statistics of all projections): memory growth over its start\n")
    print("| shape | params | layers | hidden | checkpointing | s | peak over start GiB | estimate GiB | load avg |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---|")
    for r in gs:
        a = r["arch"]
        print(f"| {r['shape']} | {r['params'] / 1e9:.3f}B | {a['num_hidden_layers']} | {a['hidden_size']} | "
              f"{'on' if r['checkpoint'] else 'off'} | {r['seconds']:.1f} | {r['growth_mb'] / 1024:.2f} | "
              f"{r['estimate_mb'] / 1024:.2f} | {r['loadavg'][0]} |")


def _report_methods(rows):
    ms = [r for r in rows if r.get("kind") == "method"]
    if not ms:
        return
    print("\n## Factorisation methods against the exact float64 SVD (planted spectra, k = break-even rank)\n")
    print("| weight | k | compressor | threads | " + " | ".join(
        f"{m} s | {m} err" for m in ("exact", "gram64", "gram32", "randomized")) + " |")
    print("|---|---:|---|---:|" + "---:|---:|" * 4)
    for r in ms:
        res = r["results"]
        cells = [f"{res[m]['s']:.2f} | {res[m]['rel_err']:+.1e}" if m in res else "- | -"
                 for m in ("exact", "gram64", "gram32", "randomized")]
        print(f"| {r['m']}x{r['n']} | {r['k']} | {r['compressor']} | {r['threads']} | " + " | ".join(cells) + " |")
    print("\n(err: relative increase of the compressor's own output error over the exact SVD's, at the same rank)")


def _report_ppl(rows):
    ps = [r for r in rows if r.get("kind") == "ppl"]
    if not ps:
        return
    print("\n## End-to-end perplexity on tiny per factorisation method (gac, 32 x 256 tiny calibration)\n")
    print("| compressor | method | ratio | PPL | vs exact | factorize s |")
    print("|---|---|---:|---:|---:|---:|")
    for r in ps:
        print(f"| {r['compressor']} | {r['svd']} | {r['ratio']:.2f} | {r['ppl']:.4f} | {100 * r['rel']:+.3f}% | "
              f"{r['factorize_s']:.2f} |")


def _report_plan(rows):
    ps = [r for r in rows if r.get("kind") == "plan"]
    if not ps:
        return
    print("\n## The plan step at Llama-3-8B shapes (one thread)\n")
    print("| targets | error curve from | strategy | median ms | max ms | load avg |")
    print("|---:|---|---|---:|---:|---|")
    for r in ps:
        print(f"| {r['targets']} | {r['curve_from']} | {r['strategy']} | {r['median_ms']:.1f} | {r['max_ms']:.1f} | "
              f"{r['loadavg'][0]} |")


def _extrapolate(job):
    per = [r for r in job if r["shape"].startswith("l8bx") and r["threads"] == 1]
    if not per:
        return
    print("\n## Extrapolation to Llama-3-8B (32 layers, 224 weights)\n")
    print("CPU, one core: each stage measured on K decoder layers of Llama-3-8B's exact shapes scales with the "
          "number of layers (statistics and factorisations are per layer; streaming holds one layer), so 32 layers "
          "take 32/K times the per-layer stages; at the issue's calibration (8 x 256 tokens). Memory: weights "
          "(8.03B x dtype) + the factors (up to the break-even ranks, float32 on the host) + one layer's working set, "
          "as the estimate (gac.compression.footprint) that tracked the measured peaks above.\n")
    from transformers import AutoConfig

    from gac.compression.footprint import estimate_footprint

    c8 = AutoConfig.for_model("llama", **L8B, num_hidden_layers=32, vocab_size=L3_VOCAB)
    print("| compressor | K | measured prepare s (K layers) | per layer s | 8B prepare, 1 core | 8B GPU FLOPs "
          "(32 x 2048 tokens) | 8B GPU estimate | 8B GPU memory (bf16) | 8B host memory |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in per:
        K = r["arch"]["num_hidden_layers"]
        t = r["timings"]
        prep = t.get("compress_prepare_s", 0.0)
        per_layer = prep / K
        cpu = per_layer * 32
        fl = _flops_8b(r["compressor"], 32 * 2048)
        total = sum(fl.values())
        # an H100: ~50 TFLOP/s dense fp32/fp64-tensor GEMMs at half efficiency; eigh of a 4096 matrix ~0.3 s (cuSOLVER)
        gpu_s = total / 25e12 + (0.3 * 7 * 32 if r["compressor"] in ("asvd", "svd_llm") else 0)
        fp = estimate_footprint(c8, r["compressor"], dtype="bfloat16", device="cuda", n_samples=32, seq_len=2048)
        print(f"| {r['compressor']} | {K} | {prep:.0f} | {per_layer:.0f} | {cpu / 3600:.1f} h | {total / 1e15:.2f} PFLOP "
              f"| {gpu_s / 60:.1f} min | {fp.device_bytes / 2**30:.1f} GiB | {fp.host_bytes / 2**30:.1f} GiB |")
    print("\nGPU column: not measured (no GPU in this session). FLOPs from the stage formulas in benchmarks/scale.py "
          "(_flops_8b: forward 2 x tokens x weights; X^T X / Y^T Y 2 x tokens x n^2; Gram 2mn min(m,n), eigh ~10 n^3, "
          "the other factor 2mnk; gradients 3 x forward + the LM head) at an assumed 25 TFLOP/s sustained on an H100 "
          "plus 0.3 s per 4096-wide eigendecomposition (7 per layer): an estimate to be replaced by a measurement.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("one")
    o.add_argument("--shape", required=True)
    o.add_argument("--compressor", required=True)
    og = sub.add_parser("one-grad")
    og.add_argument("--shape", required=True)
    og.add_argument("--checkpoint", choices=("on", "off"), default="off")
    for p in (o, og, sub.add_parser("jobs"), sub.add_parser("grads"), sub.add_parser("methods"), sub.add_parser("ppl"), sub.add_parser("plan"),
              sub.add_parser("report")):
        p.add_argument("--out", default="scale.json")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--samples", type=int, default=8)
        p.add_argument("--calib-len", type=int, default=256)
        p.add_argument("--svd", default=None, help="factorisation method (default: the compressors' default)")
        p.add_argument("--device", default="cpu")
        p.add_argument("--pin", type=int, default=1, help="core for one-thread runs (taskset -c); -1: no pinning")
        p.add_argument("--shapes", nargs="+", default=["tiny", "h512", "h1024"])
        p.add_argument("--compressors", nargs="+", default=list(COMPRESSORS))
        p.add_argument("--allocation", default="proportional", help="jobs: 'sensitivity' times ASVD's search")
        p.add_argument("--mshapes", nargs="+", default=["2048x2048", "512x2048", "8192x2048", "2048x8192"])
        p.add_argument("--skip-exact", action="store_true", help="methods: skip the exact SVD above 16M entries")
        p.add_argument("--quick", action="store_true", help="a smoke run: shape tiny, calibration 2 x 64, no pinning, "
                       "methods on one 256x128 weight (no CPU lock; the numbers mean nothing)")
    args = ap.parse_args(argv)
    if args.quick:
        args.shapes, args.samples, args.calib_len, args.pin, args.mshapes = ["tiny"], 2, 64, -1, ["256x128"]
    if getattr(args, "pin", None) == -1:
        args.pin = None
    # the parent process of a measurement holds the lock (its "one" children run under it); report measures nothing
    from gac.machine import hold_cpu_lock

    hold_cpu_lock(enabled=not args.quick and args.device == "cpu" and args.cmd not in ("one", "one-grad", "report"))
    return {"one": one_job, "one-grad": one_grad, "grads": grads, "jobs": jobs, "methods": methods, "ppl": ppl, "plan": plan, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
