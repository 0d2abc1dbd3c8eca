"""gac's estimates against what this machine measures, for each compressor on the largest models it holds.

    python benchmarks/estimates.py --out docs/estimates-vs-measured.md        # smollm2 and gemma3, every compressor
    python benchmarks/estimates.py --models smollm2 --compressors asvd --out /tmp/e.md

Each (model, compressor) is one job (``experiments/run.py``, on the CPU, no evaluation: the compression alone, with a
short calibration and ASVD's sensitivity search cut to two kept ratios on one probe sample over the first two
decoder layers' weights), run in its own process
so that its peak is its own. From its record (``memory``, ``timings``; :mod:`gac.jobs.doctor.report`):

* memory: the memory check's estimate before loading (``memory.estimate.device_mb``) against the job's peak RSS
  above what the process held before it loaded the model (the Python process itself, torch and transformers,
  ~400 MB, is in no estimate), and the raw peak;
* time: the sensitivity search's estimate before it ran against its real time (ASVD; gac estimates no other stage's
  time), and each job's compression time.

Writes ``--out`` (the markdown table with the command, the machine, the versions and the load average beside each
row; a run at a load above :data:`CALM_LOAD` is marked "under load (provisional)") and ``--out`` with ``.json`` (the
rows as data). Needs ``gac fixtures build smollm2`` and ``gac fixtures build gemma3`` done first (no hub).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("smollm2", "gemma3")
COMPRESSORS = ("asvd", "svd_llm", "stable_rank_svd", "palu", "llm_pruner")
#: the cheapest settings every compressor runs with: no evaluation, and 4 calibration samples of 128 tokens for the
#: compressors that read calibration data (CALIBRATION; stable_rank_svd is data-free and refuses them)
SETTINGS = ["gpu=cpu", "eval=none", "seq_len=128", "ratio=0.15", "align=gac", "gpu.profile=none", "quiet=true"]
CALIBRATION = ["calibration.n_samples=4", "calibration.seq_len=128"]
DATA_FREE = {"stable_rank_svd"}
#: ASVD's sensitivity search cut small (two kept ratios, one probe sample, the first two decoder layers' weights):
#: its estimate is still made for what it probes; the memory estimate still counts every layer's factors
ASVD = ["compressor.options.sensitivity_grid=[0.5,0.9]", "++compressor.options.sensitivity_samples=1",
        "+compressor.options.layers='0:2'"]
CALM_LOAD = 1.5  # a 1-minute load average above this on the machine makes the run provisional


def run_job(model: str, compressor: str, results: Path) -> dict:
    """One job in its own process; its record, with the load average before and after and its wall time."""
    args = [sys.executable, str(ROOT / "experiments" / "run.py"), f"model={model}", f"compressor={compressor}",
            *SETTINGS, *([] if compressor in DATA_FREE else CALIBRATION), *(ASVD if compressor == "asvd" else []),
            f"results_dir={results}",
            f"hydra.run.dir={results}/run-{model}-{compressor}"]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=900)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        line = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": model, "compressor": compressor, "error": line, "load": [load0, os.getloadavg()[0]]}
    recs = sorted((results / "records").glob("*.json"), key=lambda p: p.stat().st_mtime)
    rec = json.loads(recs[-1].read_text())
    assert rec["job"]["model"] == model and rec["job"]["compressor"] == compressor, rec["job"]
    return {"model": model, "compressor": compressor, "record": rec, "wall_s": wall,
            "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}


def row_of(job: dict) -> dict:
    if "error" in job:
        return {k: job[k] for k in ("model", "compressor", "error", "load")}
    rec = job["record"]
    mem, t = rec["memory"], rec["timings"]
    est = (mem.get("estimate") or {}).get("device_mb")
    before = mem["stages"]["load"]["start_rss_mb"]
    above = round(mem["peak_rss_mb"] - before, 1)
    # the innermost stage that reached the job's peak (prepare's sub-stages come after it in the record)
    stages = mem.get("stages") or {}
    top = max((v.get("peak_rss_mb") or 0 for v in stages.values()), default=0)
    peak_stage = [k for k, v in stages.items() if (v.get("peak_rss_mb") or 0) == top][-1:] or [None]
    row = {"model": job["model"], "compressor": job["compressor"], "params": (mem.get("estimate") or {}).get("params"),
           "memory_estimate_mb": est, "peak_rss_mb": mem["peak_rss_mb"], "rss_before_load_mb": before,
           "peak_stage": peak_stage[0],
           "peak_above_load_mb": above, "memory_ratio": round(above / est, 3) if est else None,
           "sensitivity_estimate_s": t.get("sensitivity_estimate_s"), "sensitivity_s": t.get("sensitivity_s"),
           "prepare_s": t.get("compress_prepare_s"), "total_s": t.get("total_s"), "wall_s": round(job["wall_s"], 1),
           "load": job["load"]}
    if row["sensitivity_estimate_s"] and row["sensitivity_s"]:
        row["sensitivity_ratio"] = round(row["sensitivity_s"] / row["sensitivity_estimate_s"], 3)
    return row


def _f(v, fmt="{:.0f}") -> str:
    return "" if v is None else fmt.format(v)


def markdown(rows: list[dict], meta: dict) -> str:
    provisional = meta["max_load"] > CALM_LOAD
    lines = ["# Estimates against measured: this machine", "",
             ("**Under load (provisional)**: the machine's 1-minute load average reached "
              f"{meta['max_load']:.1f} during the run; rerun alone for the published figures." if provisional else
              f"Measured alone (1-minute load average at most {meta['max_load']:.1f})."), "",
             "What gac estimates before a job runs, against what the job then measured, for each compressor on the "
             "largest models this machine holds (CPU, float32). Memory: the memory check's estimate "
             "(`memory.estimate.device_mb` in the record) against the job's peak RSS above what the process held "
             "before loading the model (the Python process itself is in no estimate); ratio = measured / estimate "
             "(below 1: the estimate is safe; above 1: a job could pass the check and still run out). Time: the "
             "ASVD sensitivity search's estimate before it ran against its real time (gac estimates no other "
             "stage's time). Settings: " + " ".join(f"`{s}`" for s in SETTINGS) + "; all but "
             + ", ".join(sorted(DATA_FREE)) + " (data-free) " + " ".join(f"`{s}`" for s in CALIBRATION)
             + "; ASVD also " + " ".join(f"`{s}`" for s in ASVD) + ".", "",
             f"Command: `{meta['command']}` ({meta['date']}, {meta['host']}, {meta['cpus']} CPUs; gac "
             f"{meta['git']}, torch {meta['torch']}, transformers {meta['transformers']}; {meta['seconds']:.0f} s in "
             f"all).", "",
             "| model | compressor | memory estimate MiB | peak above load MiB | ratio | peak RSS MiB | peak in stage | "
             "sensitivity estimate s | sensitivity s | ratio | compression s | load avg (before, after) |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['compressor']} | failed: {r['error']} ||||||||| "
                         f"{r['load'][0]:.1f}, {r['load'][1]:.1f} |")
            continue
        lines.append(f"| {r['model']} | {r['compressor']} | {_f(r['memory_estimate_mb'])} | "
                     f"{_f(r['peak_above_load_mb'])} | {_f(r['memory_ratio'], '{:.2f}')} | {_f(r['peak_rss_mb'])} | "
                     f"{r.get('peak_stage') or ''} | "
                     f"{_f(r['sensitivity_estimate_s'], '{:.1f}')} | {_f(r['sensitivity_s'], '{:.1f}')} | "
                     f"{_f(r.get('sensitivity_ratio'), '{:.2f}')} | {_f(r['prepare_s'], '{:.1f}')} | "
                     f"{r['load'][0]:.1f}, {r['load'][1]:.1f} |")
    ratios = [r for r in rows if r.get("memory_ratio") is not None]
    if ratios:
        hi, lo = max(ratios, key=lambda r: r["memory_ratio"]), min(ratios, key=lambda r: r["memory_ratio"])
        over = [f"{r['model']} {r['compressor']}" for r in ratios if r["memory_ratio"] > 1]
        lines += ["", (f"**Above its estimate: {', '.join(over)}.** " if over else
                       "Every peak is at or below its estimate. ")
                  + f"Closest: {hi['model']} {hi['compressor']} at {hi['memory_ratio']:.2f}; furthest: "
                  f"{lo['model']} {lo['compressor']} at {lo['memory_ratio']:.2f}."]
    lines += ["", "What the estimate counts on a CPU job (`gac.compression.footprint`): the weights, the compressor's "
              "working set (calibration, statistics, factorisation or gradient pass, and its scores: "
              "`stable_rank_svd`'s stable rank of every Linear, the LM head's the largest), the factors at the rank "
              "the compressor keeps them (`stable_rank_svd`: full rank), the process and its tokenizer (1,300 bytes "
              "per vocabulary entry: gemma3's is 322 MiB), and a margin of 0.5 of the working set for the memory "
              "the C allocator keeps after freeing it (not predictable from shapes; measured 210-430 MiB after "
              "LLM-Pruner's gradient pass on gemma3). The peak stage is the record's innermost stage that reached "
              "the job's peak (`sweep`: the plan's targets, where `stable_rank_svd` ranks every Linear)."]
    lines += ["", "The same rows as data: the `.json` beside this file. On a GPU node the gpu tier and the canary "
              "write the same comparison per device (`gpu-node-report-*.json`, `<sweep dir>/node-report.json`: "
              "[first run on your cluster](first-run-on-your-cluster.md)); send one to the project to turn the "
              "estimates for 8B models into measured ratios.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the markdown results file (the rows as JSON beside it, .json)")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--compressors", nargs="+", default=list(COMPRESSORS))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from gac.io import write_text_atomic
    from gac.provenance import provenance

    prov = provenance()
    t0 = time.perf_counter()
    rows, max_load = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gac-estimates-") as tmp:
        for model in args.models:
            for comp in args.compressors:
                job = run_job(model, comp, Path(tmp) / f"{model}-{comp}")
                row = row_of(job)
                max_load = max(max_load, *job["load"])
                print(json.dumps({k: v for k, v in row.items() if k != "record"}), flush=True)
                rows.append(row)
    meta = {"command": "python benchmarks/estimates.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": prov["date"], "host": prov["hostname"], "cpus": os.cpu_count(),
            "git": f"{(prov['git_commit'] or '?')[:7]}{'+dirty' if prov['git_dirty'] else ''}",
            "torch": prov["packages"]["torch"], "transformers": prov["packages"]["transformers"],
            "seconds": time.perf_counter() - t0, "max_load": max_load}
    out = Path(args.out)
    write_text_atomic(out, markdown(rows, meta), overwrite=True)
    write_text_atomic(out.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n",
                      overwrite=True)
    print(f"wrote {out} and {out.with_suffix('.json')} ({meta['seconds']:.0f} s, load at most {max_load:.1f})")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
