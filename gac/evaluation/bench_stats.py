"""The bench's statistics: the seeded visiting order of the rounds and a
bench's per-variant summary (medians, ratios to the baseline and to the unaligned sibling, FLOPs ratio, alignment
efficiency) from the timed samples (:func:`gac.evaluation.bench.run_bench` collects them)."""

from __future__ import annotations

import random
import statistics

from gac.metrics import prefill_point
from gac.stats import paired_ratio_ci


def round_orders(n: int, rounds: int, seed: int = 0) -> list[list[int]]:
    """The visiting order of every round: each a fresh shuffle of ``range(n)`` from one seeded generator."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(range(n))
        rng.shuffle(order)
        orders.append(order)
    return orders


def summarise(variants, p, samples, decode, kernels, wall) -> dict:
    """The bench document's measured part: per variant and point the median of the visit samples, the ratios to the
    baseline and to the unaligned sibling with their paired-bootstrap intervals, FLOPs and alignment efficiency
    (``samples[i][point]``: variant ``i``'s visit samples; ``p``: the resolved protocol)."""
    from gac.evaluation.flops import CONVENTION, prefill_flops

    labels = [v.label for v in variants]
    sk = [v.structure.skeleton() for v in variants]
    flops = [{pt: prefill_flops(m, *pt) for pt in p["points"]} for m in sk]
    B, seed = p["bootstrap"], p["seed"]
    main = p["points"][0]
    rows = []
    for i, v in enumerate(variants):
        sib = labels.index(v.sibling) if v.sibling is not None else None
        pts = {}
        for pt in p["points"]:
            a = samples[i][pt]
            med = statistics.median(a)
            q1, _, q3 = statistics.quantiles(a, n=4) if len(a) >= 2 else (a[0], a[0], a[0])
            r, lo, hi = paired_ratio_ci(a, samples[0][pt], B, seed)
            fr = flops[i][pt]["total"] / flops[0][pt]["total"]
            e = {"batch": pt[0], "seq_len": pt[1], "median_ms": med, "samples_ms": list(a),
                 "wall_samples_ms": None if p["timer"] != "thread_time" else list(wall[i][pt]),
                 "iqr_pct": 100.0 * (q3 - q1) / med if med > 0 else None,
                 "ratio_to_baseline": r, "ratio_ci95": [lo, hi],
                 "flops": flops[i][pt], "flops_ratio": fr, "alignment_efficiency": fr / r,
                 **kernels[i].get(pt, {"top_kernels": None, "sdpa_backend": None})}
            if sib is not None:
                rs, slo, shi = paired_ratio_ci(a, samples[sib][pt], B, seed)
                e.update(ratio_to_unaligned=rs, ratio_to_unaligned_ci95=[slo, shi])
            else:
                e.update(ratio_to_unaligned=None, ratio_to_unaligned_ci95=None)
            pts[prefill_point(*pt)] = e
        dec = None
        if decode[i]:
            r, lo, hi = paired_ratio_ci(decode[i], decode[0], B, seed)
            dec = {"ms_per_token": statistics.median(decode[i]), "samples_ms_per_token": list(decode[i]),
                   "ratio_to_baseline": r, "ratio_ci95": [lo, hi], "new_tokens": p["decode_tokens"],
                   "prompt_len": p["decode_prompt"]}
        m = pts[prefill_point(*main)]
        rows.append({
            "label": v.label, "record_key": v.key, "baseline": i == 0, "sibling": v.sibling, **v.info,
            "compressor": v.structure.compressor or "none",
            "targets": v.structure.targets, "plan_targets": len(v.structure.dims),
            "compressed_params": v.structure.compressed_params(),
            "median_ms": m["median_ms"], "ratio_to_baseline": m["ratio_to_baseline"], "ratio_ci95": m["ratio_ci95"],
            "ratio_to_unaligned": m["ratio_to_unaligned"], "ratio_to_unaligned_ci95": m["ratio_to_unaligned_ci95"],
            "flops": m["flops"]["total"], "flops_ratio": m["flops_ratio"],
            "alignment_efficiency": m["alignment_efficiency"], "top_kernels": m["top_kernels"],
            "sdpa_backend": m["sdpa_backend"], "points": pts, "decode": dec,
        })
    return {"baseline": labels[0], "main_point": prefill_point(*main),
            "points": [{"batch": b, "seq_len": s, "name": prefill_point(b, s)} for b, s in p["points"]],
            "variants": rows, "flops_convention": CONVENTION,
            "bootstrap": {"resamples": B, "seed": seed, "level": 0.95, "method": "paired, rounds resampled with "
                          "replacement, ratio of the medians of the resampled rounds, percentile interval"}}

