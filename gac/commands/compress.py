"""``gac compress MODEL --compressor asvd --ratio 0.15 --strategy gac -o DIR``: compress, align, save a checkpoint."""

from __future__ import annotations

NAME = "compress"
HELP = "compress a model (ASVD, SVD-LLM, LLM-Pruner, PaLU) with aligned dimensions and save a gac checkpoint"


def add_arguments(p):
    from gac import registry
    from gac.checks import arg_type, check_seed

    p.add_argument("model", help="'tiny', 'smollm2', a Hugging Face hub id or a local HF model directory")
    p.add_argument("--compressor", required=True, help=registry.COMPRESSORS.listing())
    p.add_argument("--ratio", type=float, required=True, help="fraction of the compressed weights' parameters removed, in (0, 1)")
    p.add_argument("--strategy", default="gac", help=f"gac (default), {', '.join(s for s in registry.STRATEGIES if s != 'gac')}")
    p.add_argument("--proxy", default=None, help=f"importance proxy (default: the compressor's): {', '.join(registry.PROXIES)}")
    p.add_argument("--allocation", default="default",
                   help="d* rule: default (the compressor's reference: ASVD sensitivity, SVD-LLM and LLM-Pruner uniform, "
                        "PaLU fisher_uniform, stable_rank_svd stable_rank), proportional (gac's Eq. 2 rule), uniform, "
                        "sensitivity, fisher_uniform, stable_rank (the GAC authors' search; stable_rank_svd only); "
                        "ASVD's sensitivity grid is --option sensitivity_grid=0.4,0.5,0.6,0.7,0.8,0.9")
    from gac.align.candidates import DEFAULT_UNIT, DEFAULT_WINDOW
    from gac.registry import DEFAULT_KNAPSACK_SCORE
    from gac.text import CALIBRATION_SAMPLES

    p.add_argument("--unit", default=DEFAULT_UNIT,
                   help=f"alignment unit: a multiple of 8 (default {DEFAULT_UNIT}) or an engine's, e.g. llama.cpp:q4_K (256)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help=f"candidate window in alignment units around d* (default {DEFAULT_WINDOW}: the aligned dims "
                        f"bracketing d*)")
    p.add_argument("--knapsack-score", default=DEFAULT_KNAPSACK_SCORE,
                   help=f"Eq. 4 score: {', '.join(registry.KNAPSACK_SCORES)} (default {DEFAULT_KNAPSACK_SCORE}; proxy is "
                        f"the paper's)")
    p.add_argument("--calib", default=None,
                   help="calibration text: wikitext2, tiny or a local file (default: the named model's own text for "
                        "tiny, smollm2 and checkpoints built from them, else wikitext2)")
    p.add_argument("--calib-samples", type=int, default=CALIBRATION_SAMPLES)
    p.add_argument("--calib-seq-len", type=int, default=None,
                   help="tokens per calibration sample (default: 256 for tiny, 512 for smollm2, else 2048, the "
                        "ASVD/SVD-LLM default)")
    p.add_argument("--seed", type=arg_type(check_seed), default=0, help="calibration sampling seed (default 0)")
    p.add_argument("--layers", default=None, help="layer range, e.g. '3:' (python slice); default: the compressor's")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a compressor option (repeatable), e.g. group_size=2, decomposition=svd, rank_cap=break_even")
    p.add_argument("--sensitivity-limit", default=None, metavar="DURATION",
                   help="ASVD's sensitivity search: refuse when its estimate (printed before it starts) is above this "
                        "(90m, 12h, 3600 seconds, or none; default $GAC_SENSITIVITY_LIMIT, else 2h)")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("-o", "--output", required=True, help="checkpoint directory (must not exist or be empty)")
    p.add_argument("--force", action="store_true",
                   help="replace a gac checkpoint already at -o (never another directory, nor the input model)")


def validate(args) -> None:
    """Every argument checked before the model is loaded: bad input costs a second, not a calibration pass."""
    from pathlib import Path

    from gac import registry
    from gac.align.candidates import check_window, resolve_unit
    from gac.align.targets import check_ratio
    from gac.compression.checkpoint import check_output_dir
    from gac.compression.compressors import get_compressor
    from gac.dtypes import resolve_dtype
    from gac.errors import GacError
    from gac.io import path_kind
    from gac.text import CALIBRATION_SEQ_LEN, CALIBRATION_SOURCE, is_named_source

    check_ratio(args.ratio)
    try:
        args.unit = resolve_unit(args.unit)
        check_window(args.window)
    except GacError as e:
        raise GacError(f"--unit/--window: {e}") from None
    axes_given = _given(args)  # before the defaults below are filled in
    opts = parse_options(args.option)
    if args.layers:
        opts["layers"] = args.layers
    comp = get_compressor(args.compressor, **opts)  # an unknown compressor or option fails before the model loads
    if registry.LATENCY_STRATEGIES.canonical(args.strategy):  # a real strategy, but not one this command runs
        raise GacError(f"--strategy {args.strategy} budgets latency, not parameters: it needs each target's latency at "
                       f"every candidate dimension, which gac compress does not measure; run it in a job (python "
                       f"experiments/run.py align={args.strategy}) or in gac align (an allocation file with "
                       f"latency_budget_ms and latency_ms), or pick a parameter strategy here: "
                       f"{', '.join(registry.STRATEGIES)}")
    args.strategy = registry.STRATEGIES.resolve(args.strategy, "(--strategy)", extra=registry.LATENCY_STRATEGIES)
    if args.proxy is not None:
        args.proxy = registry.PROXIES.resolve(args.proxy, "(--proxy)")
    args.allocation = registry.ALLOCATIONS.resolve(args.allocation, "(--allocation)")
    args.knapsack_score = registry.KNAPSACK_SCORES.resolve(args.knapsack_score, "(--knapsack-score)")
    from gac.fixtures import default_data
    from gac.models import base_model_of

    named = default_data(base_model_of(args.model))  # a named model's own text: no hub round trip offline
    if args.calib is None:
        args.calib = named["calibration_source"] if named else CALIBRATION_SOURCE
    if args.calib_seq_len is None:
        args.calib_seq_len = named["calibration_seq_len"] if named else CALIBRATION_SEQ_LEN
    if args.calib_samples < 1 or args.calib_seq_len < 2:
        raise GacError(f"--calib-samples must be >= 1 and --calib-seq-len >= 2 (got {args.calib_samples}, "
                       f"{args.calib_seq_len})")
    from gac.jobs.config.axes import check_given
    from gac.jobs.config.build import check_compression

    # the one rule of a valid request (the job's own): the allocation available, its grid reaching the ratio, its
    # probe samples within the calibration's
    check_compression(args.compressor, opts, args.allocation, args.ratio, args.calib_samples, where="--allocation")
    from gac.compression.sensitivity import parse_duration, sensitivity_limit

    given = getattr(args, "sensitivity_limit", None)
    args.sensitivity_limit_s = (parse_duration(given, "--sensitivity-limit") if given is not None
                                else sensitivity_limit())  # a bad duration (flag or $GAC_SENSITIVITY_LIMIT) fails now
    kind = None if is_named_source(args.calib) else path_kind(args.calib)
    if kind:
        raise GacError(f"--calib {args.calib!r} is {kind}; pass a .txt/.jsonl/.parquet file, 'wikitext2' or 'tiny'")
    if not is_named_source(args.calib) and not Path(args.calib).expanduser().exists():
        raise GacError(f"--calib {args.calib!r} is neither 'wikitext2', 'tiny' nor an existing .txt/.jsonl/.parquet file")
    resolve_dtype(args.dtype)
    check_output_dir(args.output, overwrite=args.force, inputs=[args.model])
    from gac.jobs.run.loading import model_max_positions
    from gac.jobs.run.preflight import check_layers_here, check_model_here
    from gac.text import check_source

    check_model_here(args.model)  # a missing directory, the hub while offline: before anything is loaded
    from gac.models import check_model_files

    check_model_files(args.model)  # weights that match their config (a tied weight stored twice, ...), as evaluate
    args.job = compress_job(args, opts)  # the request as a job: checked by the same schema and rules as every job
    check_given(args.job.spec, {}, axes_given)  # a flag this compression cannot use, by the jobs' own table
    check_source(args.calib, "train", "--calib")  # a binary file, a fifo, the hub while offline: now, not after loading
    check_layers_here(comp, args.model, "--layers")  # a selection of no layer, or beyond the model: before loading
    limit = model_max_positions(args.model)
    if limit is not None and args.calib_seq_len > limit:
        raise GacError(f"--calib-seq-len {args.calib_seq_len} is above the model's maximum sequence length ({limit}, "
                       f"max_position_embeddings); use at most {limit}")


#: flag -> the job setting it gives (gac.jobs.config.axes: which setting matters under which choice)
_FLAG_KEYS = {"window": "align.window", "knapsack_score": "align.knapsack_score", "proxy": "proxy",
              "calib": "calibration", "calib_samples": "calibration", "calib_seq_len": "calibration",
              "seed": "calibration", "sensitivity_limit": "sensitivity_limit"}


def _given(args) -> dict[str, str]:
    """``{job setting: the flag as given}`` for each flag of :data:`_FLAG_KEYS` away from its default, and each
    ``--option``."""
    from gac.jobs.config.axes import flags_given

    out = flags_given(args, add_arguments, _FLAG_KEYS)
    for item in args.option or ():
        k = str(item).partition("=")[0].strip()
        out.setdefault(f"compressor.options.{k}", f"--option {item}")
    return out


def compress_job(args, opts: dict):
    """The :class:`~gac.jobs.config.spec.Job` of the flags, built as every entry point builds one
    (:func:`gac.jobs.config.build.job_from_config` on the config the flags give)."""
    from gac.jobs.config.build import command_config, job_from_config

    calibration = {"source": args.calib, "n_samples": args.calib_samples, "seq_len": args.calib_seq_len,
                   "seed": args.seed}
    return job_from_config(command_config(
        args.model, device=args.device, dtype=args.dtype, compressor=args.compressor, options=opts, proxy=args.proxy,
        strategy=args.strategy, ratio=args.ratio, unit=args.unit, window=args.window,
        knapsack_score=args.knapsack_score, allocation=args.allocation, calibration=calibration, seed=args.seed))


def run(args) -> int:
    """The job's recipe without evaluate and record (:class:`gac.jobs.run.recipe.Recipe`: load -> prepare -> plan ->
    apply -> save): the model loaded as a job loads it (:meth:`~gac.jobs.run.recipe.Recipe.load`), in its own dtype
    unless ``--dtype`` (the Job's dtype None, as :func:`gac.models.load_model` with ``dtype=None``), then a checkpoint
    at ``-o``."""
    import json
    import logging
    from pathlib import Path

    from gac.compression.checkpoint import check_output_dir
    from gac.jobs.run.memory_fits import check_model_fits, is_out_of_memory, out_of_memory
    from gac.jobs.run.recipe import Recipe, StageContext

    validate(args)
    spec, out = args.job.spec, Path(args.output)
    # weights + calibration + factorisation against the device, before the model is loaded
    fp = check_model_fits(args.model, spec.compressor, spec.dtype, args.device, n_samples=args.calib_samples,
                          seq_len=args.calib_seq_len, proxy=spec.proxy, compressor_options=spec.compressor_options or None)
    recipe = Recipe(spec, StageContext(spec.device), sensitivity_limit_s=args.sensitivity_limit_s)
    stage = "load"
    try:
        model, tok = recipe.load()
        # room for at least the kept parameters (embeddings and norms stay whole): a full disk fails now, not after
        dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        check_output_dir(out, overwrite=args.force, need_bytes=int((1 - args.ratio) * dense_bytes), inputs=[args.model])
        stage = "compress"
        prepared = recipe.prepare(model, tok)
        compressed = recipe.apply(prepared, recipe.plan(prepared, model))
        del prepared
    except Exception as e:
        if is_out_of_memory(e):  # one line with the estimate and the fix, not torch's traceback
            raise out_of_memory(e, stage, args, fp) from None
        raise
    recipe.save(compressed, tok, out, overwrite=args.force,
                replace_hint="pass --force to replace the checkpoint there")
    logging.getLogger(__name__).info("saved %s", out)
    report = compressed.report
    summary = {k: report[k] for k in ("budget", "params", "budget_met", "aligned_fraction", "compression_wall_s")}
    summary["aligned_by_unit"] = report.get("aligned_by_unit")
    print(json.dumps({"output": str(out), **summary}, indent=2))
    return 0


def parse_options(items) -> dict:
    """``["group_size=2", "decomposition=svd"]`` -> ``{"group_size": 2, "decomposition": "svd"}`` (YAML scalars)."""
    import yaml

    from gac.errors import GacError

    out = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise GacError(f"--option {item!r} is not KEY=VALUE; write e.g. --option group_size=2")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out
