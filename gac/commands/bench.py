"""``gac bench``: side-by-side latency of a sweep's records (or plan files), interleaved in one process."""

from __future__ import annotations

NAME = "bench"
HELP = "side-by-side latency of a sweep's variants and the baseline, with ratios, CIs, FLOPs and kernels"
DESCRIPTION = """\
Measure every selected record of RESULTS_DIR and the uncompressed baseline of the same model in one process on
one device, interleaved: R rounds, each visiting every variant once in a shuffled order (warm-up + timed calls,
the visit's sample is their median). Variants are built from their plans' shapes with random weights (no
calibration, no weights read). Reports per variant the median latency, the ratio to the baseline and to its
unaligned sibling with a paired bootstrap 95% CI over rounds, the FLOPs ratio, the alignment efficiency
(FLOPs ratio / latency ratio), the top kernels and the SDPA backend. The result is stored as
RESULTS_DIR/bench/<key>.json (running the same bench again shows the stored one; --force measures again).
Examples:
  gac bench results/ --experiment table5
  gac bench results/ --where compressor=asvd --where ratio=0.15 --rounds 30 --json bench.json
  gac bench results/ --sweep 2025-01-01/12-00-00 --device cuda --point 1,1024 --point 1,4096 --decode-tokens 128
  gac bench --plan unaligned.json --plan gac.json --model tiny --compressor asvd
  gac bench results/ --experiment table5 --predict a100   # + "predicted, A100, from published kernel data"
  gac bench results/ --experiment table5 --engine torch,onnxruntime,llama.cpp   # the engine as an axis (CPU)
  gac bench results/ --experiment table5 --engine llama.cpp,llama.cpp:q4_K      # llama.cpp at f32 and at q4_K
"""


def _point(text: str) -> tuple[int, int]:
    import argparse

    parts = text.replace("x", ",").split(",")
    try:
        if len(parts) == 1:
            return 1, int(parts[0])
        b, s = (int(x) for x in parts)
        return b, s
    except ValueError:
        raise argparse.ArgumentTypeError(f"point {text!r} is not S or BATCH,S (e.g. 1024 or 4,1024)") from None


def add_arguments(p):
    from gac.checks import arg_type, check_seed, check_threads

    p.add_argument("results_dir", metavar="RESULTS_DIR", nargs="?", help="the results store the sweep wrote to")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep records whose job field (model, compressor, proxy, strategy, ratio, unit, gpu, seq_len, "
                        "experiment, sweep), key, or config path (compressor.options.alpha) equals VALUE; repeatable: one key "
                        "given twice keeps either value (OR), different keys must all match (AND)")
    p.add_argument("--sweep", help="keep records of this sweep label")
    p.add_argument("--experiment", help="keep records of this experiment (table5, ratio_sweep, ...)")
    p.add_argument("--plan", action="append", default=[], metavar="FILE",
                   help="bench plan JSON files (gac align -o) instead of records; needs --model and --compressor")
    p.add_argument("--model", help="with --plan: the model spec the plans are for (tiny, a local dir, a hub id)")
    p.add_argument("--compressor", help="with --plan: asvd, svd_llm, llm_pruner or palu")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="with --plan: a compressor option (JSON value), e.g. group_size=4 (repeatable)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: the records' device)")
    p.add_argument("--dtype", help="float32, float16 or bfloat16 (default: the records' dtype)")
    p.add_argument("--point", action="append", type=_point, default=[], metavar="[BATCH,]S",
                   help="a prefill point (repeatable; default: batch 1 at the records' seq_len); the first is the main one")
    p.add_argument("--rounds", type=int, help="rounds (default: 30 on CUDA, 15 on CPU)")
    p.add_argument("--warmup", type=int, help="warm-up calls per visit (default: 10 on CUDA, 2 on CPU)")
    p.add_argument("--iters", type=int, help="timed calls per visit (default: 20 on CUDA, 5 on CPU)")
    p.add_argument("--decode-tokens", type=int, default=0, help="also decode ms/token over N new tokens (default off)")
    p.add_argument("--decode-prompt", type=int, default=128, help="prompt length before decoding (default 128)")
    p.add_argument("--threads", type=arg_type(check_threads), help="CPU torch threads during the bench (default 1)")
    p.add_argument("--seed", type=arg_type(check_seed), default=0,
                   help="seed of the visiting order and the bootstrap (default 0)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--memory", choices=("auto", "resident", "swap"), default="auto",
                   help="keep all variants on the device, or move each there for its visit (default: auto)")
    p.add_argument("--timer", choices=("auto", "wall", "cpu"), default="auto",
                   help="CPU timer: the thread's CPU time (cpu; the default with 1 thread) or wall clock; GPUs use "
                        "CUDA events")
    p.add_argument("--engine", action="append", default=[], metavar="ENGINE",
                   help="what runs the prefill: torch (default), onnxruntime or llama.cpp (on the CPU, pip install "
                        "'gac[engines]'); llama.cpp:TYPE at a GGUF type (f32 default, f16, q8_0, q4_0, q4_K, ...); "
                        "repeated or a comma list: an axis, every engine running every variant in the same shuffled "
                        "rounds")
    p.add_argument("--no-profile", action="store_true", help="skip the kernel trace")
    p.add_argument("--predict", metavar="GPU",
                   help="a100 or h100: add each variant's predicted prefill ms on that GPU (gac.predict, from published "
                        "kernel data; labelled as a prediction) beside what this device measured")
    p.add_argument("--json", metavar="OUT.json", help="also write the bench document here")
    p.add_argument("--force", action="store_true", help="measure again even if stored (beside it); overwrite --json")


def run(args) -> int:
    from gac.errors import GacError
    from gac.jobs.bench.store_bench import bench_store, describe

    options = option_values(args.option)
    if args.plan and (args.where or args.sweep or args.experiment):
        raise GacError("--plan benches plan files; --where/--sweep/--experiment select records — use one or the other")
    from gac.models import check_on_disk

    check_on_disk(args.model)  # its architecture is the one on disk
    doc = bench_store(
        args.results_dir, where=args.where, sweep=args.sweep, experiment=args.experiment, plans=args.plan,
        model=args.model, compressor=args.compressor, options=options, device=args.device, dtype=args.dtype,
        points=args.point or None, rounds=args.rounds, warmup=args.warmup, iters=args.iters,
        decode_tokens=args.decode_tokens, decode_prompt=args.decode_prompt, threads=args.threads, seed=args.seed,
        bootstrap=args.bootstrap, memory=args.memory, timer=args.timer, profile=not args.no_profile, force=args.force,
        json_out=args.json, json_force=args.force, predict=args.predict, engines=args.engine)
    print(describe(doc))
    if args.json:
        print(f"wrote {args.json}")
    return 0


def option_values(items) -> dict:
    """``--option KEY=VALUE`` items as a dict, each value read as JSON where it is JSON (``4``, ``[1, 2]``, ``true``),
    else kept as the string (``svd``); used by ``gac bench`` and ``gac predict``."""
    import json

    from gac.errors import GacError

    options = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise GacError(f"--option {item!r} must be KEY=VALUE, e.g. group_size=4")
        try:
            options[k] = json.loads(v)
        except ValueError:
            options[k] = v
    return options
