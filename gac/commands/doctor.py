"""``gac doctor``: check a node for gac in about a minute (versions, device, SDPA and GEMM behaviour, a tiny smoke)."""

from __future__ import annotations

NAME = "doctor"
HELP = "check this node for gac: versions, GPU, SDPA backends per head_dim, GEMM kernel tiers, an end-to-end smoke"
DESCRIPTION = """\
Run it first on a new cluster, on the kind of node the jobs will get:
  srun --gres=gpu:1 gac doctor            (or: gac doctor --device cuda:1 --json doctor.json)
One line per check, PASS / FAIL with the reason, INFO for facts (CUDA absent on a CPU node is INFO, not a
failure). Exit code 1 when a check failed, 0 otherwise. On a GPU: for head_dim 64, 96, 107, 112, 128 in fp16 and
bf16, the SDPA backend PyTorch picks and the kernel that ran, the backends that accept the shape and their
latency; a GEMM at K=4096 vs 4097 with its kernel and tier; the embedded tiny model compressed, reloaded,
evaluated and benched on the device. --json writes every number."""


def add_arguments(p):
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present, else cpu)")
    p.add_argument("--json", metavar="OUT.json", help="write every check and its numbers here")
    p.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    p.add_argument("--no-smoke", action="store_true", help="skip the end-to-end smoke and each compressor's default run on tiny")


def run(args) -> int:
    from gac.io import check_output_file, write_output
    from gac.jobs.doctor.node import run_doctor

    if args.json:
        check_output_file(args.json, "--json", args.force)
    # one line per check: the smoke's own INFO lines and progress would bury them (-v shows them)
    import logging

    from gac.progress import quiet_scope

    lib = logging.getLogger("gac")
    level = lib.level
    if not getattr(args, "verbose", False):
        lib.setLevel(logging.WARNING)
    try:
        with quiet_scope(not getattr(args, "verbose", False)):
            res = run_doctor(device=args.device, smoke=not args.no_smoke)
    finally:
        lib.setLevel(level)
    for line in res["lines"]:
        print(line)
    print(f"{res['failed']} check(s) failed" if res["failed"] else "all checks passed")
    if args.json:
        write_output(args.json, {k: v for k, v in res.items() if k != "lines"}, "--json", args.force)
        print(f"wrote {args.json}")
    return 1 if res["failed"] else 0
