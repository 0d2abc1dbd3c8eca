"""Benchmark: do tiny's PiQA-/HellaSwag-format accuracies move as compression deepens?

For the dense ``tiny`` and for each compressor (unaligned) at each ratio, prints test perplexity and the accuracy
(acc, acc_norm) of both shipped task files on all their items, with the drop from the dense model. This is how the
claim "tiny's task columns are below the ceiling and fall with compression" is checked (docs/evaluation.md).

Checkpoints are made with the CLI (``python -m gac.cli compress tiny --compressor C --ratio R --strategy unaligned
--calib tiny --calib-samples 32 --calib-seq-len 256 -o DIR``: calibration on tiny's shipped train text, no hub) into ``--work`` and reused when present; evaluation runs in this process with the same functions as
``python -m gac.cli evaluate DIR --ppl --tasks piqa,hellaswag --limit 500``.

    flock /tmp/gac-heavy.lock python benchmarks/tiny_tasks.py [--work DIR] [--ratios 0.15,0.30,0.50]
        [--compressors asvd,llm_pruner] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gac, not an installed one

from gac.compression.checkpoint import load_checkpoint
from gac.evaluation import evaluate_tasks, perplexity
from gac.fixtures import load_tiny, tiny_paths


def _checkpoint(work: Path, compressor: str, ratio: float) -> Path:
    out = work / f"{compressor}-{ratio:.2f}"
    done = out / ".tiny_tasks_done"
    if not done.is_file():
        cmd = [sys.executable, "-m", "gac.cli", "compress", "tiny", "--compressor", compressor, "--ratio", str(ratio),
               "--strategy", "unaligned", "--calib", "tiny", "--calib-samples", "32", "--calib-seq-len", "256",
               "-o", str(out), "--force"]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        done.write_text("")
    return out


def _scores(model, tok, limit: int | None) -> dict:
    tasks = evaluate_tasks(model, tok, ("piqa", "hellaswag"), limit=limit, local_files=tiny_paths().task_files)
    row = {"ppl": perplexity(model, tok, "tiny")["ppl"]}
    for t in ("piqa", "hellaswag"):
        row[f"{t}_acc"], row[f"{t}_acc_norm"] = tasks[t]["acc"], tasks[t]["acc_norm"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/gac-tiny-tasks", help="where the checkpoints go (reused)")
    ap.add_argument("--ratios", default="0.15,0.30,0.50")
    ap.add_argument("--compressors", default="asvd,llm_pruner")
    ap.add_argument("--limit", type=int, default=None, help="first N items per task (default: all)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ratios = [float(r) for r in args.ratios.split(",")]
    t0 = time.time()
    model, tok = load_tiny()
    rows = [{"model": "tiny (dense)", "ratio": 0.0, **_scores(model, tok, args.limit)}]
    for c in args.compressors.split(","):
        for r in ratios:
            m, _ = load_checkpoint(_checkpoint(work, c, r))
            rows.append({"model": f"{c} unaligned", "ratio": r, **_scores(m, tok, args.limit)})
    base = rows[0]
    n = {t: len(p.read_text(encoding="utf-8").splitlines()) for t, p in tiny_paths().task_files.items()}
    lim = {t: min(n[t], args.limit or n[t]) for t in n}
    print(f"\ntiny task accuracy vs compression (piqa: {lim['piqa']} items, chance 0.5; hellaswag: "
          f"{lim['hellaswag']} items, chance 0.25; ppl: tiny test text, windows of 1024)\n")
    print("| model | ratio | PPL | PiQA acc | PiQA norm | HSwag acc | HSwag norm | PiQA Δ | HSwag Δ |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for x in rows:
        print(f"| {x['model']} | {x['ratio']:.2f} | {x['ppl']:.2f} | {x['piqa_acc']:.3f} | {x['piqa_acc_norm']:.3f} | "
              f"{x['hellaswag_acc']:.3f} | {x['hellaswag_acc_norm']:.3f} | {x['piqa_acc'] - base['piqa_acc']:+.3f} | "
              f"{x['hellaswag_acc'] - base['hellaswag_acc']:+.3f} |")
    print(f"\n({time.time() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
