"""``gac predict --gpu a100 --model llama3_8b [--plan PLAN.json ...]``: predicted GPU prefill latency from shapes."""

from __future__ import annotations

NAME = "predict"
HELP = "predicted prefill latency of a model and its plans on an A100/H100, from published kernel data (no GPU)"
DESCRIPTION = """\
Predict the prefill latency (eager PyTorch, fp16) of MODEL and of each plan's compressed model on a GPU you do not
have, from the shapes alone: every GEMM from a tile/wave roofline with the alignment tiers fitted to the published
tensor-core sweeps, SDPA from its head-dim template plus the padding copy of a misaligned head dim, element-wise and
norm kernels as bandwidth-bound, and a per-kernel launch cost. Calibrated on the GAC authors' published A100/H100
kernel data (gac/data/profiles/published); the launch cost is solved from their Llama-3-8B baseline at S=128, the one
end-to-end number used. Every number printed is a prediction, labelled so. A model whose fp16 weights and logits
exceed the GPU's 80 GiB cannot run there and gets no latency. Accuracy against the paper's own end-to-end numbers:
benchmarks/predict_paper.py and docs/published-data-and-predictor.md.
Examples:
  gac predict --gpu a100 --model llama3_8b --seq-len 128 --seq-len 1024
  gac predict --gpu h100 --model llama3_8b --plan unaligned.json --plan gac.json --compressor llm_pruner --json out.json
"""


def add_arguments(p):
    import argparse

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--gpu", required=True, help="a100 or h100 (the GPUs with published kernel data)")
    p.add_argument("--model", required=True,
                   help="a conf/model name (llama3_8b, tiny, ...: its arch, no weights), a model YAML, a model "
                        "directory or a hub id")
    p.add_argument("--plan", action="append", default=[], metavar="PLAN.json",
                   help="a plan (gac align -o, or a job record) for MODEL (repeatable)")
    p.add_argument("--compressor", help="the compressor whose modules the plans size (default: the plan's own)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a compressor option (JSON value), e.g. group_size=4 (repeatable)")
    p.add_argument("--seq-len", action="append", type=int, default=[], metavar="S",
                   help="prefill length (repeatable; default 1024)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--json", metavar="OUT.json", help="also write the prediction document here")
    p.add_argument("--force", action="store_true", help="overwrite --json")


def run(args) -> int:
    from gac.io import check_output_file, write_output
    from gac.predict.report import format_prediction, predict_document

    if args.json:
        check_output_file(args.json, "--json", args.force, inputs=[args.model, *args.plan])
    from gac.commands.bench import option_values

    options = option_values(args.option)
    from gac.models import check_on_disk

    check_on_disk(args.model)  # its architecture is the one on disk
    doc = predict_document(args.gpu, args.model, args.plan, args.compressor, options, args.seq_len or [1024],
                           args.batch)
    print(format_prediction(doc))
    if args.json:
        write_output(args.json, doc, "--json", args.force, inputs=[args.model, *args.plan])
        print(f"wrote {args.json}")
    return 0
