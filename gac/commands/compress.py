"""``gac compress MODEL --compressor asvd --ratio 0.15 --strategy gac -o DIR``: compress, align, save a checkpoint."""

from __future__ import annotations

NAME = "compress"
HELP = "compress a model (ASVD, SVD-LLM, LLM-Pruner, PaLU) with aligned dimensions and save a gac checkpoint"


def add_arguments(p):
    p.add_argument("model", help="'tiny', a Hugging Face hub id or a local HF model directory")
    p.add_argument("--compressor", required=True, help="asvd, svd_llm, llm_pruner or palu")
    p.add_argument("--ratio", type=float, required=True, help="fraction of the compressed weights' parameters removed, in (0, 1)")
    p.add_argument("--strategy", default="gac", help="gac (default), unaligned, round_nearest, round_up, round_down, rebalance")
    p.add_argument("--proxy", default=None, help="importance proxy: magnitude, activation, gradient, fisher, random")
    p.add_argument("--allocation", default="default",
                   help="d* rule: default (the compressor's reference rule: asvd sensitivity, svd_llm uniform, "
                        "others proportional), proportional (gac's Eq. 2 rule), uniform, sensitivity")
    p.add_argument("--sensitivity-grid", default=None,
                   help="ASVD's kept parameter ratios for the sensitivity table, e.g. 0.4,0.5,0.6,0.7,0.8,0.9 "
                        "(each in (0, 1]; the default is the reference's)")
    p.add_argument("--unit", type=int, default=8, help="alignment unit (default 8)")
    p.add_argument("--window", type=int, default=1,
                   help="candidate window in alignment units around d* (default 1: the aligned dims bracketing d*)")
    p.add_argument("--knapsack-score", default="marginal", help="Eq. 4 score: marginal (default) or proxy (the paper's)")
    p.add_argument("--calib", default="wikitext2", help="calibration text: wikitext2, tiny or a local file")
    p.add_argument("--calib-samples", type=int, default=32)
    p.add_argument("--calib-seq-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", default=None, help="layer range, e.g. '3:' (python slice); default: the compressor's")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("-o", "--output", required=True, help="checkpoint directory (must not exist or be empty)")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty output directory")


def run(args) -> int:
    import json
    import logging
    from pathlib import Path

    from gac.align.targets import budget_for_ratio
    from gac.compression.allocation import check_sensitivity_grid, resolve_allocation
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.compress import Calibration, check_sensitivity_reach, compress_model
    from gac.compression.compressors import get_compressor
    from gac.errors import GacError
    from gac.models import load_model

    budget_for_ratio(1_000_000, args.ratio)  # fail fast on a bad ratio
    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        raise GacError(f"{str(out)!r} exists and is not empty; choose another path or pass --force")
    opts = {"layers": args.layers} if args.layers else {}
    if args.sensitivity_grid is not None:
        grid = check_sensitivity_grid(args.sensitivity_grid)
        if "sensitivity_grid" not in get_compressor(args.compressor).options():
            raise GacError(f"--sensitivity-grid is an option of asvd, not of {args.compressor}; drop it")
        opts["sensitivity_grid"] = grid
    comp = get_compressor(args.compressor, **opts)  # options, allocation and grid checked before the model loads
    check_sensitivity_reach(resolve_allocation(args.allocation, comp), comp, args.ratio)
    model, tok = load_model(args.model, dtype=args.dtype, device=args.device)
    opts = opts or None
    model, plan, report = compress_model(
        model, tok, args.compressor, args.ratio, args.strategy, proxy=args.proxy, unit=args.unit, window=args.window,
        calibration=Calibration(args.calib, args.calib_samples, args.calib_seq_len, args.seed),
        allocation=args.allocation, compressor_options=opts, knapsack_score=args.knapsack_score,
    )
    save_checkpoint(model, tok, out, overwrite=args.force)
    logging.getLogger(__name__).info("saved %s", out)
    summary = {k: report[k] for k in ("budget", "params", "budget_met", "aligned_fraction", "compression_wall_s")}
    print(json.dumps({"output": str(out), **summary}, indent=2))
    return 0
