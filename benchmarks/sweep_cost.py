"""Benchmark: what a 5-ratio x 2-strategy sweep costs against one job, with scores and factorizations cached.

Runs the real job function (``gac.jobs.experiment.run_config``) on ``tiny`` with evaluation off, first as one job in a
fresh store, then as the 10-point sweep in another fresh store, and prints the scoring time (calibration,
importance scores, factorization; ``compress_prepare_s``) and the whole-job time.

    python benchmarks/sweep_cost.py [--compressor asvd] [--n-samples 32] [--calib-seq-len 256]
"""

from __future__ import annotations

import argparse
import tempfile

from omegaconf import OmegaConf

from gac.jobs.experiment import compose_config, run_config

RATIOS = (0.1, 0.15, 0.2, 0.3, 0.4)
STRATEGIES = ("unaligned", "gac")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compressor", default="asvd")
    ap.add_argument("--n-samples", type=int, default=32)
    ap.add_argument("--calib-seq-len", type=int, default=256)
    args = ap.parse_args()
    base = ["model=tiny", "gpu=cpu", "eval=none", f"compressor={args.compressor}",
            f"calibration.n_samples={args.n_samples}", f"calibration.seq_len={args.calib_seq_len}"]

    def job(results, *extra):
        cfg = OmegaConf.to_container(compose_config([*base, f"results_dir={results}", *extra]), resolve=True)
        return run_config(cfg)

    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        one = job(d1, "ratio=0.15", "align=gac")
        sweep = [job(d2, f"ratio={r}", f"align={s}") for r in RATIOS for s in STRATEGIES]
    one_score = one["timings"]["compress_prepare_s"]
    sweep_score = sum(r["timings"]["compress_prepare_s"] for r in sweep)
    one_total = one["timings"]["total_s"]
    sweep_total = sum(r["timings"]["total_s"] for r in sweep)
    cached = sum(bool(r["stages"]["prepare_cached"]) for r in sweep)
    print(f"tiny, {args.compressor}, calibration {args.n_samples} x {args.calib_seq_len}, evaluation off\n")
    print("| run | jobs | scoring s (compress_prepare) | whole jobs s | scoring vs one job |")
    print("|---|---|---|---|---|")
    print(f"| one job | 1 | {one_score:.2f} | {one_total:.2f} | 1.00x |")
    print(f"| 5 ratios x 2 strategies | {len(sweep)} ({cached} from cache) | {sweep_score:.2f} | {sweep_total:.2f} "
          f"| {sweep_score / one_score:.2f}x |")
    print("\nper point: " + ", ".join(f"r{r['job']['ratio']}/{r['job']['strategy']} "
                                      f"{r['timings']['compress_prepare_s']:.2f}s" for r in sweep))


if __name__ == "__main__":
    main()
