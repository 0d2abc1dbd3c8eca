"""``gac export CHECKPOINT --format onnx|gguf|hf -o OUT``: a gac checkpoint as files serving engines run."""

from __future__ import annotations

NAME = "export"
HELP = "export a gac checkpoint to ONNX (onnxruntime), GGUF (llama.cpp) or a plain Hugging Face folder"
DESCRIPTION = """\
Export CHECKPOINT (a gac checkpoint directory; also 'tiny', 'smollm2' or a local Hugging Face directory, for the
dense baseline) as:
  onnx  an ONNX graph, input_ids [batch, sequence] -> logits, both axes dynamic (any checkpoint)
  gguf  a GGUF file for llama.cpp: Llama-family models, dense or pruned (per-layer MLP widths and head counts
        through llama.cpp's 'deci' architecture); --quant f32 (default), f16, or q8_0, q4_0, q4_K, ... made by
        llama.cpp's own quantizer
  hf    a plain Hugging Face folder that transformers loads without gac (uniform widths, no low-rank factors)
A format that cannot hold the model is refused before any work, naming the formats that can. Every export is run in
its engine (onnxruntime, llama.cpp, transformers without gac) and its logits compared with gac's before it is kept;
the comparison is printed. ONNX and GGUF need the engines: pip install 'gac[engines]'.
Examples:
  gac export ck/ --format onnx -o model.onnx
  gac export ck/ --format gguf --quant q8_0 -o model-q8_0.gguf
  gac export ck/ --format hf -o hf_model/
"""


def add_arguments(p):
    from gac.export.expressible import FORMATS, GGUF_TYPES

    p.add_argument("model", metavar="CHECKPOINT", help="a gac checkpoint directory (or 'tiny', 'smollm2', a local HF dir)")
    p.add_argument("--format", required=True, metavar="FORMAT", help=", ".join(FORMATS))
    p.add_argument("-o", "--output", required=True,
                   help="the file (onnx, gguf) or directory (hf) to write; must not exist unless --force")
    p.add_argument("--quant", default=None, metavar="TYPE",
                   help=f"GGUF tensor type: {', '.join(GGUF_TYPES)} (default f32)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing output file (an ONNX graph's <output>.data beside it included), or a "
                        "folder an earlier gac export --format hf wrote")


def validate(args):
    """Every check that needs no weights, in order: the flags, the output, the checkpoint (its hashes included),
    what the format can hold, the engine; then the checkpoint as a job (``args.job``, built as every entry point
    builds one: :func:`gac.jobs.config.build.job_from_config`), in float32 on the CPU. Returns ``(source, what the format
    holds, quant)``."""
    from gac.errors import unknown_name
    from gac.export.engines import require
    from gac.export.expressible import FORMATS, check_format, check_quant, describe
    from gac.models import check_model_files

    if args.format not in FORMATS:
        raise unknown_name("export format (--format)", args.format, FORMATS)
    quant = check_quant(args.format, args.quant)
    _check_output(args)
    check_model_files(args.model)  # config, files, shapes and sha256: a tampered checkpoint stops here
    src = describe(args.model)
    holds = check_format(src, args.format)
    require(args.format)
    from gac.jobs.config.build import command_config, job_from_config

    args.job = job_from_config(command_config(args.model, dtype="float32"))
    return src, holds, quant


def _check_output(args) -> None:
    from pathlib import Path

    from gac.errors import GacError
    from gac.io import check_output_file

    if args.format == "hf":
        from gac.export.hf import check_output_dir

        check_output_dir(Path(args.output), args.force, inputs=[args.model])
        return
    if check_output_file(args.output, "-o", args.force, inputs=[args.model]) != "file":
        raise GacError(f"-o {args.output!r} is a stream; gac export writes a file there (and runs it before keeping "
                       f"it): give a file path")
    if args.format == "onnx":  # the graph's side file: written, or an earlier one removed, with the graph
        from gac.export.onnx import data_file

        side = data_file(Path(args.output).expanduser())
        if check_output_file(side, "-o's weights file", args.force, inputs=[args.model]) != "file":
            raise GacError(f"-o's weights file {str(side)!r} is a stream; gac export writes or removes a file there "
                           f"with the graph: move it away or choose another -o")


def run(args) -> int:
    import json
    import logging
    import time

    from gac.export.write import export
    from gac.jobs.run.recipe import Recipe, StageContext

    src, holds, quant = validate(args)
    t0 = time.perf_counter()
    model, tok = Recipe(args.job.spec, StageContext(args.job.spec.device)).load()  # the recipe's load step
    summary = export(src, model, tok, args.format, holds, args.output, quant=quant)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    logging.getLogger(__name__).info("exported %s", args.output)
    print(json.dumps(summary, indent=2))
    return 0
