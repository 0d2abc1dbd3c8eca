"""The engine alignment study: what aligning for a serving engine changes where the model is served.

smollm2 (the real pretrained SmolLM2-135M, `gac fixtures build smollm2`) pruned by LLM-Pruner at Table 5's ratio
(0.15) three ways, at one parameter budget: the compressor's own widths (`unaligned`), gac at unit 8, and gac for
llama.cpp's k-quants (`align.unit=llama.cpp:q4_K`: widths in whole blocks of 256). Each is exported to GGUF f16,
q8_0, q4_0 and q4_K (llama.cpp, through llama-cpp-python) and to ONNX f32 (onnxruntime), through `gac.engines`, and
reported: the file's size, the tensors llama.cpp's quantizer stored in another type (read from the file), the
perplexity computed through the engine against gac's own (PyTorch, f32) on the same windows, and the prefill time in
interleaved shuffled rounds at fixed threads with paired bootstrap intervals against the unaligned model in the same
engine. A non-Llama case: gemma3 (Gemma 3 270M, `gac fixtures build gemma3`), unaligned and gac at unit 8, in ONNX.

    python benchmarks/engine_alignment.py --out DIR            # both models; writes DIR/engine_alignment.{json,md}
                                                               # and the tables of docs/results-engines.md

Settings kept small (each is an option): calibration 4 samples x 128 tokens of enwiki (Table 5 used 32 x 512),
perplexity on 2 windows of 256 tokens of enwiki's test split, prefill of 128 tokens, 5 rounds, 1 thread per engine.
Every timing is printed with the load average beside it. About 15 CPU-minutes, mostly single-threaded (the five ONNX
exports, torch's dynamo exporter, are the largest part); ``--models`` and ``--engines`` run a part.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from gac.align.candidates import resolve_unit  # noqa: E402
from gac.errors import GacError  # noqa: E402
from gac.io import write_marked_block  # noqa: E402

RATIO = 0.15  # Table 5's
#: (label, strategy, unit) per model; gemma3's hidden 640 and MLP 2048 are llama.cpp-less here (ONNX only)
VARIANTS = {
    "smollm2": [("unaligned", "unaligned", 8), ("gac, unit 8", "gac", 8),
                ("gac, llama.cpp:q4_K", "gac", "llama.cpp:q4_K")],
    "gemma3": [("unaligned", "unaligned", 8), ("gac, unit 8", "gac", 8)],
}
ENGINES = {
    "smollm2": [("llama.cpp", "f16"), ("llama.cpp", "q8_0"), ("llama.cpp", "q4_0"), ("llama.cpp", "q4_K"),
                ("onnxruntime", None)],
    "gemma3": [("onnxruntime", None)],
}
PPL_TOLERANCE = 1e-3  # f32 and f16 through the engine: within 0.1% of gac's own perplexity


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def say(*a) -> None:
    print(*a, flush=True)


def nll_sum(logits: torch.Tensor, window: torch.Tensor) -> float:
    """The summed next-token NLL of one window (as gac.evaluation.perplexity scores a window), in float64."""
    lp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    return float(-lp.gather(1, window[0, 1:, None]).sum())


def widths(plan) -> list[int]:
    return [int(d) for _, d in sorted(plan.dims.items(), key=lambda kv: int(kv[0].split(".")[2]))]


def file_bytes(path: Path) -> int:
    """The export's size: the file and the side files beside it that carry its name (an ONNX graph's ``.data``)."""
    return sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file() and f.name.startswith(path.name))


def study_model(name: str, args, out: dict) -> None:
    from gac.compression.calibration import Calibration
    from gac.compression.preparation import prepare
    from gac.engines import open_engine
    from gac.evaluation.bench_stats import round_orders
    from gac.evaluation.perplexity import perplexity_of_ids
    from gac.export.gguf import fallback_tensors, tensor_types
    from gac.models import load_model
    from gac.stats import paired_ratio_ci
    from gac.text import load_text, tokenize_text

    t0 = time.perf_counter()
    model, tok = load_model(name, dtype="float32")
    model.eval()
    cfg = model.config
    say(f"[{name}] loaded ({sum(p.numel() for p in model.parameters()):,} params) in {time.perf_counter() - t0:.1f} s, "
        f"load {load()}")
    t0 = time.perf_counter()
    calib = Calibration(source="enwiki", n_samples=args.calib_samples, seq_len=args.calib_seq_len, seed=0)
    prepared = prepare(model, tok, "llm_pruner", calibration=calib)
    say(f"[{name}] LLM-Pruner prepared ({args.calib_samples} x {args.calib_seq_len} calibration tokens) in "
        f"{time.perf_counter() - t0:.1f} s, load {load()}")
    ids = torch.as_tensor(tokenize_text(tok, load_text("enwiki", "test")), dtype=torch.long).reshape(-1)
    L, W = args.eval_len, args.eval_windows
    windows = ids[: L * W].view(W, L)
    prompt = ids[L * W: L * W + args.seq_len].view(1, -1)
    rec = {"model": name, "config": {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                                     "num_hidden_layers": cfg.num_hidden_layers, "model_type": cfg.model_type},
           "variants": {}, "engines": []}
    models = {}
    for label, strategy, unit in VARIANTS[name]:
        m, plan, _ = prepared.compress(RATIO, strategy, resolve_unit(unit), copy_model=True)
        m.eval()
        own = perplexity_of_ids(m, ids, seq_len=L, max_windows=W)
        ws = widths(plan)
        rec["variants"][label] = {
            "strategy": strategy, "unit": unit, "unit_resolved": resolve_unit(unit), "widths": ws,
            "params": int(plan.params), "budget": int(plan.budget),
            "aligned": {str(b): sum(w % b == 0 for w in ws) / len(ws) for b in (8, 32, 256)},
            "ppl_gac": own["ppl"], "ppl_tokens": own["n_tokens"]}
        models[label] = m
        say(f"[{name}] {label}: widths {sorted(set(ws))}, params {plan.params:,} (budget {plan.budget:,}), "
            f"gac PPL {own['ppl']:.4f} on {own['n_tokens']} tokens")
    del prepared
    labels = list(models)
    for engine, quant in ENGINES[name]:
        if args.engines is not None and (f"{engine}:{quant}" if quant else engine) not in args.engines:
            continue
        work = Path(tempfile.mkdtemp(prefix=f"gac-engine-study-{name}-", dir=args.out))
        engines = {}
        row = {"engine": engine, "quant": quant or "f32", "threads": args.threads, "variants": {}}
        try:
            t0 = time.perf_counter()
            for label in labels:
                e = open_engine(engine, models[label], tok, work / label.replace(" ", "_").replace(",", "")
                                .replace(":", "_"), threads=args.threads, quant=quant)
                engines[label] = e
                v = {"bytes": file_bytes(Path(e.path))}
                if engine == "llama.cpp":
                    v["tensor_types"] = tensor_types(Path(e.path))
                    v["fallback"] = fallback_tensors(Path(e.path), quant) if quant not in ("f32", "f16") else {}
                total = 0.0
                for w in windows:
                    total += nll_sum(e.logits(w[None]), w[None])
                ppl = float(torch.tensor(total / (W * (L - 1))).exp())
                own = rec["variants"][label]["ppl_gac"]
                v.update(ppl_engine=ppl, ppl_rel_diff=ppl / own - 1)
                row["variants"][label] = v
            row["version"] = engines[labels[0]].version
            row["export_and_ppl_s"] = round(time.perf_counter() - t0, 1)
            calls = {label: e.prefill_call(prompt) for label, e in engines.items()}
            for c in calls.values():
                c()  # warm-up
            times = {label: [] for label in labels}
            load_before = load()
            for order in round_orders(len(labels), args.rounds, seed=0):
                for i in order:
                    t = time.perf_counter()
                    calls[labels[i]]()
                    times[labels[i]].append((time.perf_counter() - t) * 1e3)
            row["load_avg"] = [load_before, load()]
            base = times[labels[0]]
            for label in labels:
                v = row["variants"][label]
                v["prefill_ms"] = times[label]
                v["prefill_median_ms"] = float(torch.tensor(times[label]).median())
                if label != labels[0]:
                    r, lo, hi = paired_ratio_ci(times[label], base)
                    v["vs_unaligned"] = [r, lo, hi]
            say(f"[{name}] {engine} {row['quant']} ({args.threads} thread(s), load {load_before} -> {load()}): "
                + "; ".join(f"{lb}: {_fmt_bytes(row['variants'][lb]['bytes'])}, "
                            f"{len(row['variants'][lb].get('fallback', {}))} fallback, "
                            f"PPL {row['variants'][lb]['ppl_engine']:.4f} "
                            f"({row['variants'][lb]['ppl_rel_diff']:+.3%}), "
                            f"prefill {row['variants'][lb]['prefill_median_ms']:.1f} ms" for lb in labels))
        finally:
            for e in engines.values():
                e.close()
            shutil.rmtree(work, ignore_errors=True)
        rec["engines"].append(row)
    out["models"].append(rec)


def _fmt_bytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _fallback_cell(v: dict) -> str:
    fb = v.get("fallback")
    if fb is None:
        return "n/a"
    if not fb:
        return "0"
    kinds: dict = {}
    for f in fb.values():
        kinds[f["type"]] = kinds.get(f["type"], 0) + 1
    return f"{len(fb)} ({', '.join(f'{n} {t}' for t, n in sorted(kinds.items()))})"


def markdown(doc: dict) -> str:
    h = doc["host"]
    lines = [f"**{doc['label']}.** Measured {doc['date']} on {h['cpu']} ({h['cores']} cores), "
             f"{doc['threads']} thread(s) "
             f"per engine; torch {h['torch']}, llama-cpp-python {h.get('llama_cpp', '?')}, onnxruntime "
             f"{h.get('onnxruntime', '?')}. Calibration {doc['settings']['calib_samples']} x "
             f"{doc['settings']['calib_seq_len']} tokens of enwiki; perplexity on {doc['settings']['eval_windows']} "
             f"windows of {doc['settings']['eval_len']} tokens of enwiki's test split; prefill of "
             f"{doc['settings']['seq_len']} tokens, batch 1, {doc['settings']['rounds']} interleaved shuffled rounds "
             f"(median; 95% paired bootstrap interval of the ratio to the unaligned model in the same engine). "
             f"Run time {doc['wall_s']:.0f} s ({', '.join(r['model'] for r in doc['models'])}); the command: "
             f"`{doc['command']}`.", ""]
    for rec in doc["models"]:
        c = rec["config"]
        lines += [f"### {rec['model']} (hidden {c['hidden_size']}, MLP {c['intermediate_size']}, "
                  f"{c['num_hidden_layers']} layers), LLM-Pruner at ratio {RATIO}", "",
                  "| variant | MLP widths | params (budget) | widths aligned to 8 / 32 / 256 | "
                  "gac's PPL (PyTorch f32) |",
                  "|---|---|---|---|---|"]
        for label, v in rec["variants"].items():
            ws = sorted(set(v["widths"]))
            a = v["aligned"]
            lines.append(f"| {label} | {', '.join(map(str, ws[:6]))}{', ...' if len(ws) > 6 else ''} "
                         f"({len(v['widths'])} layers) | {v['params']:,} ({v['budget']:,}) | "
                         f"{a['8']:.0%} / {a['32']:.0%} / {a['256']:.0%} | {v['ppl_gac']:.4f} |")
        lines += ["", "| engine | type | variant | file | fallback tensors | PPL in the engine | vs gac's PPL | "
                      "prefill ms (median) | vs unaligned [95% CI] | load avg (1/5/15 min, before -> after) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for row in rec["engines"]:
            for label, v in row["variants"].items():
                ci = v.get("vs_unaligned")
                vs = f"{ci[0] - 1:+.1%} [{ci[1] - 1:+.1%}, {ci[2] - 1:+.1%}]" if ci else ""
                judged = row["quant"] in ("f32", "f16")
                ok = ((" (within 0.1%)" if abs(v["ppl_rel_diff"]) <= PPL_TOLERANCE else " (OUTSIDE 0.1%)")
                      if judged else "")
                lines.append(f"| {row['engine']} {row['version']} | {row['quant']} | {label} | "
                             f"{_fmt_bytes(v['bytes'])} | "
                             f"{_fallback_cell(v) if row['engine'] == 'llama.cpp' else 'n/a'}"
                             f" | {v['ppl_engine']:.4f} | {v['ppl_rel_diff']:+.3%}{ok} | "
                             f"{v['prefill_median_ms']:.1f} | "
                             f"{vs} | {row['load_avg'][0]} -> {row['load_avg'][1]} |")
        lines.append("")
    return "\n".join(lines)


MARKER = "engine_alignment.py"  # the tables sit between <!-- engine_alignment.py: begin --> and its end marker
BEGIN, END = f"<!-- {MARKER}: begin -->", f"<!-- {MARKER}: end -->"


def write_doc(path: Path, table: str, doc: dict) -> None:
    """Replace the tables between the markers of ``path`` (the results doc) with this run's, and write the run's JSON
    beside it (``results-engines.json`` for ``results-engines.md``)."""
    path.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise GacError(f"{path} has no {BEGIN} ... {END} block for the tables; add one where they go")
    write_marked_block(path, MARKER, table)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for engine_alignment.json and .md (and the exports, "
                                                 "removed as it goes)")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--engines", default="all", help="a comma list of llama.cpp:f16, llama.cpp:q8_0, llama.cpp:q4_0, "
                                                      "llama.cpp:q4_K, onnxruntime (default all: each model's own)")
    ap.add_argument("--threads", type=int, default=1, help="threads of every engine (default 1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=128, help="prefill tokens (default 128)")
    ap.add_argument("--eval-len", type=int, default=256, help="tokens per perplexity window (default 256)")
    ap.add_argument("--eval-windows", type=int, default=2)
    ap.add_argument("--calib-samples", type=int, default=4)
    ap.add_argument("--calib-seq-len", type=int, default=128)
    ap.add_argument("--label", default="run alone", help="how the machine was (printed beside the numbers)")
    ap.add_argument("--render", metavar="JSON", help="measure nothing: write the tables of an earlier run's JSON")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "results-engines.md"),
                    help="the results doc whose tables are replaced, its JSON written beside it ('' for none)")
    args = ap.parse_args(argv)
    if args.render:
        doc = json.loads(Path(args.render).read_text())
        table = markdown(doc)
        if args.doc:
            write_doc(Path(args.doc), table, doc)
        say(table)
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in VARIANTS]
    if unknown:
        raise SystemExit(f"engine_alignment.py: unknown model {unknown[0]!r}; known: {', '.join(VARIANTS)}")
    known = {f"{e}:{q}" if q else e for m in models for e, q in ENGINES[m]}
    args.engines = None if args.engines == "all" else [x.strip() for x in args.engines.split(",") if x.strip()]
    if args.engines is not None and not set(args.engines) <= known:
        raise SystemExit(f"engine_alignment.py: unknown engine {sorted(set(args.engines) - known)[0]!r}; known: "
                         f"{', '.join(sorted(known))}")
    from gac.engines import check_engine

    for m in models:
        for engine, quant in ENGINES[m]:
            check_engine(engine, quant=quant)  # installed, before any work
    if args.doc:
        text = Path(args.doc).read_text(encoding="utf-8") if Path(args.doc).is_file() else ""
        if BEGIN not in text or END not in text:  # before any work, not after it
            raise SystemExit(f"engine_alignment.py: --doc {args.doc} has no {BEGIN} ... {END} block for the tables; "
                             f"add one, or give --doc ''")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    args.out = str(out_dir)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    from gac.evaluation.latency import device_name
    from gac.machine import utc_stamp

    versions = {mod: __import__(mod).__version__ for mod in ("llama_cpp", "onnxruntime")}  # installed: checked above
    doc = {"date": utc_stamp(), "label": args.label, "threads": args.threads,
           "host": {"cpu": device_name("cpu"), "cores": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__, **versions},
           "settings": {k: getattr(args, k) for k in ("seq_len", "rounds", "eval_len", "eval_windows",
                                                     "calib_samples", "calib_seq_len", "engines")},
           "command": shlex.join(["python", *sys.argv]), "models": []}
    t0 = time.perf_counter()
    say(f"engine alignment study: {', '.join(models)}; {args.threads} thread(s); load {load()}")
    for m in models:
        study_model(m, args, doc)
        doc["wall_s"] = time.perf_counter() - t0
        table = markdown(doc)  # written after each model: what was measured survives a later failure
        (out_dir / "engine_alignment.json").write_text(json.dumps(doc, indent=1))
        (out_dir / "engine_alignment.md").write_text(table + "\n")
        if args.doc:
            write_doc(Path(args.doc), table, doc)
    say(table)
    say(f"done in {doc['wall_s']:.0f} s, load {load()}; {out_dir / 'engine_alignment.json'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except GacError as e:
        print(f"engine_alignment.py: error: {e}", file=sys.stderr)
        sys.exit(2)
