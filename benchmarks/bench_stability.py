"""Benchmark: is the side-by-side bench stable on a loaded 2-core machine, and what does it cost?

Runs the tiny Table 5 bench (baseline, ASVD and LLM-Pruner, unaligned and gac, ratio 0.15, S=1024) ``--runs``
times while a background process burns one core, and prints per variant:

* the bench's ratio to the baseline in every run and its largest deviation from the runs' mean (the target:
  within +-3%); the bench times with the thread's CPU time (one thread) and records each call's wall clock
  beside it, so the ratio of the wall-clock medians of the same visits is printed too;
* beside it, the per-job numbers of the same runs: each variant measured alone, one after another, with the
  per-job protocol the pipeline uses today (``prefill_latency`` defaults, torch's default threads), as ratios
  to the baseline measured the same way;
* the overhead: the bench's time (build, interleaved rounds, kernel trace) against measuring the same variants
  one after another with the same iteration counts (``rounds`` trials of ``warmup`` + ``iters`` calls), both as
  wall time and as this process's CPU time (what the machine's other load does not change).

The Table 5 records come from ``--results`` (a store with the table5 sweep) or are made first (the table5 sweep with
evaluation off, ~40 s).

    flock /tmp/gac-heavy.lock python benchmarks/bench_stability.py [--results DIR] [--runs 3] [--no-load]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from gac.evaluation.bench import DEFAULTS
from gac.evaluation.latency import prefill_latency
from gac.jobs.bench import bench_store, build_variants, select_records
from gac.jobs.experiment import compose_config, run_config
from gac.results import ResultsStore

POINTS = (("none", "gac"), ("asvd", "unaligned"), ("asvd", "gac"), ("llm_pruner", "unaligned"), ("llm_pruner", "gac"))


def make_store(root: Path) -> None:
    for comp, align in POINTS:
        cfg = compose_config(["experiment=table5", f"compressor={comp}", f"align={align}", "eval=none",
                              f"results_dir={root}"])
        run_config(OmegaConf.to_container(cfg, resolve=True))


def dev(values: list[float]) -> float:
    """Largest deviation from the mean, in % of the mean."""
    m = statistics.fmean(values)
    return 100.0 * max(abs(v - m) for v in values) / m


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="a results store holding the table5 sweep (default: make one in a temp dir)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-load", action="store_true", help="no background process")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--iters", type=int)
    args = ap.parse_args()
    tmp = None
    if args.results:
        results = Path(args.results)
    else:
        tmp = tempfile.TemporaryDirectory()
        results = Path(tmp.name) / "results"
    store = ResultsStore(results)
    if not any((r.get("job") or {}).get("experiment") == "table5" for r in store.iter_records()):
        t0 = time.perf_counter()
        make_store(results)
        print(f"made the table5 store in {results} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    sel = select_records(list(store.iter_records()), experiment="table5")
    variants, _, _ = build_variants(sel, list(store.iter_records()))
    labels = [v.label for v in variants]
    seq = int(sel[0]["job"]["seq_len"])
    d = DEFAULTS["cpu"]
    rounds, warmup, iters = args.rounds or d["rounds"], args.warmup or d["warmup"], args.iters or d["iters"]

    burner = None if args.no_load else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    bench_ratios = {lab: [] for lab in labels[1:]}
    wall_ratios = {lab: [] for lab in labels[1:]}
    job_ratios = {lab: [] for lab in labels[1:]}
    cis, walls, loads = {lab: [] for lab in labels[1:]}, [], []
    default_threads = torch.get_num_threads()
    try:
        for run in range(args.runs):
            loads.append(loadavg())
            t0, c0 = time.perf_counter(), time.process_time()
            doc = bench_store(results, experiment="table5", force=True, rounds=rounds, warmup=warmup, iters=iters)
            bench_wall, bench_cpu = time.perf_counter() - t0, time.process_time() - c0
            name = doc["main_point"]
            base_wall = doc["variants"][0]["points"][name]["wall_samples_ms"]
            for v in doc["variants"][1:]:
                bench_ratios[v["label"]].append(v["ratio_to_baseline"])
                cis[v["label"]].append(v["ratio_ci95"])
                w = v["points"][name]["wall_samples_ms"]
                wall_ratios[v["label"]].append(statistics.median(w) / statistics.median(base_wall) if w else float("nan"))
            # per-job, as the pipeline does today: one variant after another, each alone, default protocol/threads
            torch.set_num_threads(default_threads)
            alone = []
            for v in variants:
                model = v.structure.build("cpu")
                alone.append(prefill_latency(model, 1, seq, detect_backend=False)["median_ms"])
                del model
            for lab, ms in zip(labels[1:], alone[1:]):
                job_ratios[lab].append(ms / alone[0])
            # the same variants one after another with the bench's iteration counts and threads
            torch.set_num_threads(doc["protocol"]["threads"] or default_threads)
            t0, c0 = time.perf_counter(), time.process_time()
            for v in variants:
                model = v.structure.build("cpu")
                prefill_latency(model, 1, seq, warmup=warmup, iters=iters, trials=rounds, detect_backend=False)
                del model
            seq_wall, seq_cpu = time.perf_counter() - t0, time.process_time() - c0
            torch.set_num_threads(default_threads)
            walls.append((bench_wall, seq_wall, bench_cpu, seq_cpu))
            print(f"run {run + 1}: bench {bench_wall:.0f} s, one after another {seq_wall:.0f} s, load {loads[-1]}",
                  file=sys.stderr)
    finally:
        if burner is not None:
            burner.kill()
    dv = doc["device"]
    print(f"tiny Table 5 (ratio 0.15, S={seq}, batch 1) on {dv['name']}, {args.runs} runs"
          f"{'' if args.no_load else ' with a background process burning one core'}; load averages at the runs' "
          f"starts: {'; '.join(loads)}")
    print(f"bench protocol: {rounds} rounds x ({warmup} warm-up + {iters} timed calls) per variant, "
          f"{doc['protocol']['threads']} thread(s), timer {doc['protocol']['timer']}; per-job: prefill_latency "
          f"defaults (3 warm-up, 10 timed, 3 trials, wall clock), {default_threads} threads (torch's default)\n")
    runs = " | ".join(f"run {i + 1}" for i in range(args.runs))
    print(f"| variant | bench ratio: {runs} | max dev | CI95 (run 1) | same visits, wall clock: {runs} | max dev "
          f"| per-job ratio: {runs} | max dev |")
    print("|---|" + ("---|" * args.runs + "---|") + "---|" + ("---|" * args.runs + "---|") * 2)
    for lab in labels[1:]:
        b, w, j = bench_ratios[lab], wall_ratios[lab], job_ratios[lab]
        lo, hi = cis[lab][0]
        cells = [" | ".join(f"{x:.3f}" for x in b), f"{dev(b):.1f}%", f"[{lo:.3f}, {hi:.3f}]",
                 " | ".join(f"{x:.3f}" for x in w), f"{dev(w):.1f}%", " | ".join(f"{x:.3f}" for x in j), f"{dev(j):.1f}%"]
        print(f"| {lab} | " + " | ".join(cells) + " |")
    print("\n| run | bench wall s | one after another wall s | wall ratio | bench CPU s | one after another CPU s | "
          "CPU ratio |")
    print("|---|---|---|---|---|---|---|")
    for i, (bw, sw, bc, sc) in enumerate(walls):
        print(f"| {i + 1} | {bw:.1f} | {sw:.1f} | {bw / sw:.2f}x | {bc:.1f} | {sc:.1f} | {bc / sc:.2f}x |")
    worst = max(dev(v) for v in bench_ratios.values())
    print(f"\nbench: largest deviation of a ratio across runs {worst:.1f}% (target <= 3%); overhead at most "
          f"{max(x[0] / x[1] for x in walls):.2f}x wall, {max(x[2] / x[3] for x in walls):.2f}x CPU (target < 2x)")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
