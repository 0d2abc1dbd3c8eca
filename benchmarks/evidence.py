"""One evidence run: the kernels cuBLAS and FlashAttention actually run, and their times, for the shapes gac.predict
models; written as one file that ``benchmarks/predict_paper.py --evidence`` scores as a fully held-out set.

    python benchmarks/evidence.py --out evidence.json               # one GPU, at most --budget-s (default 480 s)
    python benchmarks/evidence.py --cpu-smoke --out smoke.json      # the same code at small shapes on a CPU
    python benchmarks/predict_paper.py --evidence evidence.json [--evidence-only]

What it measures (fp16 on a GPU, batch 1, random weights, transformers' Llama with SDPA attention):

1. **prefill latency** (CUDA events around each call after a warm-up; the median) of the Llama-3-8B-shaped model as
   baseline and as the four compressors' ``unaligned`` and ``gac`` plans at S in 128, 256, 384, 385, 512, 1024, 1025,
   2048. The plans are the ones ``benchmarks/predict_paper.py`` rebuilds from shapes alone: ASVD the model-shaped
   synthetic problem of Table 5 (``gac.align.synthetic.lowrank_problem``, as ``gac demo``), SVD-LLM the authors'
   ranks (``floor(m n 0.7 / (m + n))``) and gac's plan over the same ideal ranks, LLM-Pruner and PaLU every unit at
   ratio 0.15 (:func:`predict_paper.uniform_plans`);
2. **every GEMM of those prefills alone** (the predictor's kernel list: ``x[S, K] @ W[N, K]^T``, a strided ``x`` where
   the model slices one) under ``torch.profiler``: each kernel's name, the library, CTA tile and split-K the name
   states (:func:`gac.profiling.kernels.kernel_fields`) and its time per call;
3. **every SDPA call alone** at the head dims the plans produce (causal; k/v repeated to the query heads, as
   transformers does before SDPA), the same way;
4. **one profiled prefill** per variant and S: every kernel's name, count and time.

The phases run in that order, so every latency of phase 1 is timed before any profiler session (a CUDA profiler
session leaves CUPTI attached, slowing later kernels). Every item is checked against the budget first: when the next
one would overrun it, the run stops cleanly and the file holds what was measured (``"complete": false``,
``"stopped"`` says where). The file is rewritten after every phase (written to a temporary name, then renamed).
At the end it prints Table 5's latency column (S=1024) measured here beside the prediction for the GPU this one
stands in for (A100 -> a100; H100, H200 -> h100) with its 90% interval, and the published A100 value.

``--cpu-smoke``: the same code on a CPU (float32, perf_counter clocks, the profiler's CPU ops in place of kernels)
at a small Llama shape (hidden 128, head dim 64, 4 layers, one torch thread) and S / 16 (8, 16, 24, 25, 32, 64, 65, 128), same file format
(``"scale": "cpu-smoke"``): it proves the run end to end in the default test tier; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
SEQS = (128, 256, 384, 385, 512, 1024, 1025, 2048)
TABLE5_S = 1024
SMOKE_DIV = 16  # the smoke run's sequence lengths are SEQS / 16 (rounded so 385 and 1025 stay one past a step)
SMOKE_SEQS = (8, 16, 24, 25, 32, 64, 65, 128)
SMOKE_ARCH = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 448, "num_hidden_layers": 4,
              "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 128, "max_position_embeddings": 256}
COMPRESSORS = ("asvd", "svd_llm", "llm_pruner", "palu")
BUDGET_S = 480  # 8 minutes
RESERVE_S = {"gpu": 60, "cpu-smoke": 0}  # kept for the predictions printed at the end
#: (warm-up calls, timed calls) of a prefill latency; calls per GEMM / SDPA under the profiler
ITERS = {"gpu": (3, 10, 5), "cpu-smoke": (1, 2, 2)}
GROUP = 64  # GEMMs per profiler session


_SIBLINGS: dict = {}


def _sibling(name: str):
    """Another script of benchmarks/ as a module (loaded once)."""
    if name not in _SIBLINGS:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).with_name(f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _SIBLINGS[name] = mod
    return _SIBLINGS[name]


class Budget:
    """Wall-clock budget: :meth:`allows` says whether an item that took ``cost`` s the last time still fits."""

    def __init__(self, seconds: float, reserve: float):
        self.t0 = time.monotonic()
        self.end = self.t0 + seconds - reserve
        self.cost: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def allows(self, phase: str) -> bool:
        return time.monotonic() + self.cost.get(phase, 0.0) <= self.end

    def took(self, phase: str, seconds: float) -> None:
        self.cost[phase] = max(self.cost.get(phase, 0.0), seconds)


class Stop(Exception):
    """The budget ends before the next item."""


# ------------------------------------------------------------------------------------------------- environment
def environment(device) -> dict:
    import torch
    import transformers

    import gac

    dev = {"type": device.type, "name": platform.processor() or platform.machine(), "driver": None}
    sw = {"torch": torch.__version__, "cuda": torch.version.cuda, "cublas": None,
          "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
          "transformers": transformers.__version__, "gac": getattr(gac, "__version__", None),
          "python": platform.python_version()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        dev.update(name=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2**30, 1))
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                                  "--format=csv,noheader", "-i", str(device.index or 0)], capture_output=True,
                                 text=True, timeout=20)
            fields = [x.strip() for x in out.stdout.strip().split(",")]
            if out.returncode == 0 and fields and fields[0]:
                dev.update(driver=fields[0], max_sm_clock=fields[1] if len(fields) > 1 else None,
                           power_limit=fields[2] if len(fields) > 2 else None)
        except (OSError, subprocess.SubprocessError):
            pass
        sw["cublas"] = _cublas_version()
    return {"device": dev, "software": sw}


def _cublas_version() -> str | None:
    """The cuBLAS the process loaded (its own ``cublasGetProperty``), else the pip wheel's version, else None."""
    import ctypes

    for lib in ("libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"):
        try:
            h = ctypes.CDLL(lib)
        except OSError:
            continue
        parts = []
        for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ctypes.c_int()
            if h.cublasGetProperty(prop, ctypes.byref(v)) != 0:
                break
            parts.append(str(v.value))
        if len(parts) == 3:
            return ".".join(parts)
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11"):
        try:
            return f"{version(dist)} ({dist})"
        except PackageNotFoundError:
            continue
    return None


# ------------------------------------------------------------------------------------------------------ plans
def variants(config, name: str, pp) -> list[tuple[str, str, dict]]:
    """``(compressor, variant, dims)`` of the baseline and of each compressor's unaligned and gac plans."""
    from gac.align.synthetic import SHAPES

    out = [("none", "baseline", {})]
    for comp in COMPRESSORS:
        if comp == "asvd" and name in SHAPES:
            plans = pp.asvd_plans(config)
        elif comp == "svd_llm":
            plans = pp.svd_llm_plans(config, pp.svd_llm_ranks(config))
        else:
            plans = pp.uniform_plans(config, comp)
        out += [(comp, s, {k: int(v) for k, v in plans[s].items()}) for s in ("unaligned", "gac")]
    return out


def kernel_shapes(structures, seqs, cal) -> tuple[list[dict], list[dict]]:
    """The distinct GEMMs and SDPA calls of every structure's prefill at every S (the predictor's kernel list)."""
    from gac.predict.predictor import model_kernels

    gemms, sdpas = {}, {}
    for st in structures:
        for s in seqs:
            for k in model_kernels(st, cal, 1, s):
                if k.op[0] == "gemm":
                    M, N, K, *lead = k.op[1:]
                    lead = lead[0] if lead else None
                    gemms[(M, N, K, lead)] = {"M": M, "N": N, "K": K, "lead_k": lead}
                elif k.op[0] == "sdpa":
                    b, h, S, d, _, hkv = k.op[1:]
                    sdpas[(b, h, S, d, hkv)] = {"batch": b, "heads": h, "seq_len": S, "head_dim": d, "kv_heads": hkv}
    return [gemms[k] for k in sorted(gemms, key=str)], [sdpas[k] for k in sorted(sdpas)]


# ------------------------------------------------------------------------------------------------ measuring
def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _marker(device):
    """A call that leaves a mark in the trace between two items: a spin kernel on a GPU, an empty range on a CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda._sleep(1)
    else:
        with torch.profiler.record_function("gac_evidence_marker"):
            pass


def _timeline(prof, device) -> list[tuple[str, float]]:
    """(name, us) of what ran, in order: GPU kernels on a GPU; on a CPU the ATen ops by self time, less the
    bookkeeping ones (views, allocations: :func:`gac.profiling.kernels.capture_kernels`' filter)."""
    from gac.profiling.kernels import _CPU_NOISE_OPS

    evs = []
    for e in prof.events():
        if device.type == "cuda":
            if "CUDA" not in str(getattr(e, "device_type", "")) or e.name.startswith(("Memcpy", "Memset")):
                continue
            us = float(e.time_range.elapsed_us())
        elif _CPU_NOISE_OPS.match(e.name) or "CUDA" in str(getattr(e, "device_type", "")):
            continue
        else:
            us = float(e.self_cpu_time_total)
        evs.append((e.time_range.start, e.name, us))
    return [(n, us) for _, n, us in sorted(evs)]


def profiled(items, run_one, reps: int, device) -> list[list[tuple[str, float]]]:
    """Run each item ``reps`` times under one profiler session, a marker before each; the kernels of each item."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for it in items:
            _marker(device)
            for _ in range(reps):
                run_one(it)
        _marker(device)
        _sync(device)
    line = _timeline(prof, device)
    # on a GPU the first kernel that ran is a marker (its name differs between torch builds)
    mark = "gac_evidence_marker" if device.type != "cuda" else line[0][0] if line else None
    groups: list[list[tuple[str, float]]] = []
    for name, us in line:
        if name == mark:
            groups.append([])
        elif groups:
            groups[-1].append((name, us))
    return (groups + [[]] * len(items))[:len(items)]


def kernel_table(kernels: list[tuple[str, float]], calls: int) -> list[dict]:
    """Kernels aggregated by name: count and microseconds per call, with what each name states."""
    from gac.profiling.kernels import kernel_fields

    agg: dict[str, list[float]] = {}
    for name, us in kernels:
        a = agg.setdefault(name, [0, 0.0])
        a[0] += 1
        a[1] += us
    rows = [{"name": n, "count": c / calls, "us": us / calls, **kernel_fields(n)} for n, (c, us) in agg.items()]
    return sorted(rows, key=lambda r: -r["us"])


def time_prefill(model, seq_len: int, device, warmup: int, iters: int) -> dict:
    import torch

    from gac.evaluation.latency import measure

    ids = torch.randint(0, int(model.config.vocab_size), (1, seq_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    with torch.inference_mode():
        res = measure(lambda: (lambda: model(input_ids=ids, use_cache=False)), device, warmup, iters, 1)
    return {"ms": res["median_ms"], "p25_ms": res["p25_ms"], "p75_ms": res["p75_ms"], "calls": iters,
            "timer": res["timer"]}


def gemm_inputs(g: dict, device, dtype):
    """``x`` (a strided slice where the model slices one) and ``W`` of one GEMM, random."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(g["M"], g["lead_k"] or g["K"], generator=gen, device=device, dtype=dtype)[:, :g["K"]]
    return x, torch.randn(g["N"], g["K"], generator=gen, device=device, dtype=dtype) * 0.02


def gemm_call(inputs):
    import torch.nn.functional as F

    x, w = inputs
    return F.linear(x, w)


def sdpa_inputs(a: dict, device, dtype):
    """q (k and v are q: repeated to the query heads, as transformers does before SDPA)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    return torch.randn(a["batch"], a["heads"], a["seq_len"], a["head_dim"], generator=gen, device=device, dtype=dtype)


def sdpa_call(q):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, q, q, is_causal=True)


# --------------------------------------------------------------------------------------------------- the run
def run_evidence(out: Path, smoke: bool, budget_s: float, device_name: str | None, layers: int | None,
                 command: str) -> dict:
    import torch

    from gac.compression.structure import Structure, architecture
    from gac.predict.report import resolve_model

    scale = "cpu-smoke" if smoke else "gpu"
    device = torch.device(device_name or ("cpu" if smoke else "cuda"))
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    warmup, iters, reps = ITERS[scale]
    budget = Budget(budget_s, RESERVE_S[scale])
    pp = _sibling("predict_paper")
    if smoke:
        name, arch, seqs = "llama_smoke", dict(SMOKE_ARCH), SMOKE_SEQS
    else:
        name, seqs = "llama3_8b", SEQS
        arch = dict(yaml_arch("llama3_8b"))
    if layers is not None:
        arch["num_hidden_layers"] = int(layers)
    config = architecture(name, random_weights=True, arch=arch)
    plans = variants(config, name if layers is None else "", pp)
    structures = {(c, v): Structure(config, "float16", None if c == "none" else c, {}, d) for c, v, d in plans}
    gemms, sdpas = kernel_shapes(structures.values(), seqs, pp.predictors()["h100"].cal)
    doc = {"kind": pp.EVIDENCE_KIND, "format": pp.EVIDENCE_FORMAT, "scale": scale, "command": command,
           "model": name, "arch": arch, "dtype": str(dtype).removeprefix("torch."), "batch": 1, "seq_lens": list(seqs),
           "layers_note": ("all layers of the model" if layers is None else f"{layers} layers built (of the model's "
                           f"{resolve_model(name)[1].num_hidden_layers if not smoke else arch['num_hidden_layers']})"),
           "table5_seq_len": seqs[SEQS.index(TABLE5_S)], "budget_s": budget_s,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **environment(device),
           "variants": [{"compressor": c, "variant": v, "dims": d} for c, v, d in plans],
           "timing": {"prefill": f"{warmup} warm-up calls, then the median of {iters} timed calls "
                                 f"({'CUDA events' if device.type == 'cuda' else 'the CPU clock of gac.evaluation'})",
                      "kernels": f"torch.profiler, {reps} calls per GEMM / SDPA after one warm-up call; per call"},
           "prefill": [], "gemm": [], "sdpa": [], "traces": [], "complete": False, "stopped": None}
    write(out, doc, budget)
    torch.manual_seed(0)
    try:
        base = Structure(config, dtype).build(device)
        # 1. prefill latencies, no profiler yet
        for (c, v, d), model in _models(plans, config, dtype, device, base):
            for s in seqs:
                _check(budget, "prefill", f"prefill {c} {v} S={s}")
                t = time.monotonic()
                res = time_prefill(model, s, device, warmup, iters)
                doc["prefill"].append({"compressor": c, "variant": v, "dims": d, "batch": 1, "seq_len": s, **res,
                                       "attn_implementation": getattr(model.config, "_attn_implementation", None)})
                budget.took("prefill", time.monotonic() - t)
        write(out, doc, budget)
        # 2. the GEMMs alone, 3. SDPA alone
        for what, shapes, make, call in (("gemm", gemms, gemm_inputs, gemm_call),
                                         ("sdpa", sdpas, sdpa_inputs, sdpa_call)):
            for i in range(0, len(shapes), GROUP):
                chunk = shapes[i:i + GROUP]
                _check(budget, what, f"{what} {i}/{len(shapes)}")
                t = time.monotonic()
                with torch.inference_mode():
                    inputs = [make(it, device, dtype) for it in chunk]
                    for x in inputs:
                        call(x)
                    _sync(device)
                    found = profiled(inputs, call, reps, device)
                del inputs
                for it, ks in zip(chunk, found):
                    table = kernel_table(ks, reps)
                    doc[what].append({**it, "us": sum(k["us"] for k in table), "kernels": table})
                budget.took(what, time.monotonic() - t)
            write(out, doc, budget)
        # 4. one profiled prefill per variant and S (one profiler session per variant, a marker between prefills)
        for (c, v, _), model in _models(plans, config, dtype, device, base):
            _check(budget, "trace", f"the traces of {c} {v}")
            t = time.monotonic()
            ids = {s: torch.randint(0, int(config.vocab_size), (1, s), generator=torch.Generator().manual_seed(0))
                   .to(device) for s in seqs}
            with torch.inference_mode():
                for s in seqs:
                    model(input_ids=ids[s], use_cache=False)
                _sync(device)
                found = profiled(list(seqs), lambda s, m=model, x=ids: m(input_ids=x[s], use_cache=False), 1, device)
            for s, ks in zip(seqs, found):
                table = kernel_table(ks, 1)
                doc["traces"].append({"compressor": c, "variant": v, "seq_len": s, "kernels": len(ks),
                                      "us": sum(k["us"] for k in table), "by_name": table})
            budget.took("trace", time.monotonic() - t)
        doc["complete"] = True
    except Stop as e:
        doc["stopped"] = f"the budget ({budget_s:.0f} s) ends before {e}"
    write(out, doc, budget)
    return doc


def yaml_arch(name: str) -> dict:
    import yaml

    from gac.io import conf_dir

    return yaml.safe_load((conf_dir() / "model" / f"{name}.yaml").read_text())["arch"]


def _models(plans, config, dtype, device, base):
    """Each variant's model in turn (sharing the baseline's unchanged weights), freed before the next."""
    import gc

    import torch

    from gac.compression.structure import Structure

    for c, v, d in plans:
        model = base if c == "none" else Structure(config, dtype, c, {}, d).build(device, share_from=base)
        yield (c, v, d), model
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _check(budget: Budget, phase: str, what: str) -> None:
    if not budget.allows(phase):
        raise Stop(what)


def write(out: Path, doc: dict, budget: Budget) -> None:
    doc["elapsed_s"] = round(budget.elapsed(), 1)
    print(f"  {doc['elapsed_s']:6.1f} s: {len(doc['prefill'])} prefill latencies, {len(doc['gemm'])} GEMMs, "
          f"{len(doc['sdpa'])} SDPA calls, {len(doc['traces'])} traces", flush=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out)


# -------------------------------------------------------------------------------------------------- the print
def print_table5(out: Path, gpu: str | None, boot: int) -> None:
    """Table 5's latency column: measured here at S=1024 (the smoke's S=64) beside the prediction and its interval."""
    pp = _sibling("predict_paper")
    doc = pp.read_evidence(out)
    try:
        gpu = gpu or pp.stands_in_for(doc)
    except ValueError as e:  # a GPU without published kernel data: the file is written, the table cannot be
        print(f"no predicted column: {e} (python benchmarks/evidence.py --predict-as, or predict_paper.py "
              f"--evidence-as)")
        return
    _, rows, _, model_err = pp.score_evidence(doc, gpu, boot)
    s5 = doc["table5_seq_len"]
    print(f"\nTable 5's latency column (batch 1, S={s5}): measured on {doc['device']['name']} against "
          f"gac.predict's {gpu.upper()} model (90% intervals: {boot} bootstrap replicates, the wave bounds, the "
          f"model-form width {100 * model_err:.1f}% fitted on the design points)"
          + ("" if doc["scale"] == "gpu" else "; a CPU smoke run: the comparison means nothing"))
    hdr = f"{'variant':<24} {'measured ms':>11} {'predicted ms':>12} {'90% interval':>18} {'in':>3}  {'Table 5 (A100)':>14}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["seq_len"] != s5:
            continue
        name = "baseline" if r["compressor"] == "none" else f"{r['compressor']} {r['variant']}"
        pub = pp.TABLE5.get((r["compressor"], r["variant"]))
        lo, hi = r["interval_ms"]
        print(f"{name:<24} {r['measured_ms']:>11.2f} {r['predicted_ms']:>12.2f} {f'[{lo:.2f}, {hi:.2f}]':>18} "
              f"{'yes' if r['covered'] else 'NO':>3}  {'' if pub is None else f'{pub:.1f}':>14}")
    err = [abs(r["error"]) for r in rows]
    print(f"all {len(rows)} prefill points: median |error| {100 * statistics.median(err):.1f}%, covered "
          f"{sum(bool(r['covered']) for r in rows)}/{len(rows)}; the whole comparison: "
          f"python benchmarks/predict_paper.py --evidence {shlex.quote(str(out))}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="EVIDENCE.json", help="the evidence file to write")
    ap.add_argument("--force", action="store_true", help="overwrite --out")
    ap.add_argument("--cpu-smoke", action="store_true", help="small shapes on the CPU (the default test tier's run)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"wall-clock budget of the whole run in seconds (default {BUDGET_S}; the smoke: none)")
    ap.add_argument("--device", help="the device (default: cuda, or cpu with --cpu-smoke)")
    ap.add_argument("--layers", type=int, help="build this many decoder layers instead of all (say so in the file)")
    ap.add_argument("--predict-as", choices=("a100", "h100"),
                    help="the predictor GPU for the printed table (default: from the GPU's name; the smoke: h100)")
    ap.add_argument("--boot", type=int, default=None, help="bootstrap replicates of the printed intervals "
                                                           "(default 10; the smoke: 2)")
    args = ap.parse_args(argv)
    out = Path(args.out)

    def bad(msg: str) -> int:
        print(f"evidence.py: error: {msg}", file=sys.stderr)
        return 2

    if out.exists() and not args.force:
        return bad(f"--out {str(out)!r} exists; pass --force to overwrite it or name another file")
    if not out.parent.is_dir():
        return bad(f"--out {str(out)!r}: its folder does not exist; create it first")
    budget = args.budget_s if args.budget_s is not None else (BUDGET_S if not args.cpu_smoke else 3600.0)
    if budget <= 0:
        return bad(f"--budget-s must be positive, got {args.budget_s}")
    if args.layers is not None and args.layers < 1:
        return bad(f"--layers must be at least 1, got {args.layers}")
    boot = args.boot if args.boot is not None else (2 if args.cpu_smoke else 10)
    if boot < 2:
        return bad(f"--boot must be at least 2 (the interval needs a spread), got {boot}")
    import torch

    dev = args.device or ("cpu" if args.cpu_smoke else "cuda")
    if not args.cpu_smoke and (not dev.startswith("cuda") or not torch.cuda.is_available()):
        return bad("the evidence run measures a CUDA GPU and none is visible here; run it on a GPU node, or pass "
                   "--cpu-smoke to prove it end to end on this CPU")
    command = shlex.join([Path(sys.executable).name, "benchmarks/evidence.py",
                          *(argv if argv is not None else sys.argv[1:])])
    print(f"evidence run ({'cpu-smoke' if args.cpu_smoke else 'gpu'}): budget {budget:.0f} s; writing {out}",
          flush=True)
    threads = torch.get_num_threads()
    if args.cpu_smoke:
        torch.set_num_threads(1)  # a shared CPU: one thread, as gac times CPUs
    try:
        doc = run_evidence(out, args.cpu_smoke, budget, dev, args.layers, command)
    finally:
        torch.set_num_threads(threads)
    print(f"wrote {out}: {len(doc['prefill'])} prefill latencies, {len(doc['gemm'])} GEMMs, {len(doc['sdpa'])} SDPA "
          f"calls, {len(doc['traces'])} prefill traces in {doc['elapsed_s']:.0f} s; "
          + ("complete" if doc["complete"] else f"INCOMPLETE: {doc['stopped']}"), flush=True)
    if doc["prefill"]:
        print_table5(out, args.predict_as or ("h100" if args.cpu_smoke else None), boot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
