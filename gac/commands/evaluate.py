"""``gac evaluate``: perplexity, any lm-eval task (zero-shot) and prefill/decode latency, as the job's recipe from a
checkpoint (or any model): the Job of its flags, then :meth:`~gac.jobs.run.recipe.Recipe.load` ->
:meth:`~gac.jobs.run.recipe.Recipe.evaluate`."""

from __future__ import annotations

import logging
from pathlib import Path

NAME = "evaluate"
HELP = "perplexity, lm-eval task scores and latency of a model or a gac checkpoint"
DESCRIPTION = """\
Evaluate MODEL: 'tiny' (the embedded model, offline), 'smollm2' (a real 135M Llama, built once), a gac
checkpoint directory, a local Hugging Face model directory or a hub id: any causal LM transformers can load (a
family gac has no compression layout for, such as Bloom or DeepSeek-V3, is scored too). Its config's values and
its weights' shapes are checked before any weight loads. Prints a table whose rows carry the names results records use (ppl_<dataset>,
<task>_<metric>, prefill_ms, decode_ms_per_token); --json writes the full report (metrics, lm-eval's own results
layout, protocol details, provenance). Tasks are lm-eval's registry names; an unknown name exits 2 with suggestions.
Data: for 'tiny', 'smollm2' and gac checkpoints built from them their local files are the defaults (no network;
a checkpoint records its base model); for other models WikiText-2 and the
lm-eval tasks come from the hub unless --ppl-data / --task-file (or --data tiny) point at local files.
Examples:
  gac evaluate tiny --ppl --tasks piqa,hellaswag --limit 50 --json out.json
  gac evaluate meta-llama/Meta-Llama-3-8B --dtype fp16 --device cuda --ppl --tasks piqa,hellaswag --latency
  gac evaluate ./llama3 --ppl --ppl-data ./wiki.test.raw --task-file piqa=./piqa_valid.jsonl --tasks piqa
  gac evaluate ./SmolLM2-135M --ppl --ppl-data enwiki --ppl-windows 4     # a quick look on the CPU
"""


def add_arguments(p):
    p.add_argument("model", metavar="MODEL", help="'tiny', 'smollm2', a gac checkpoint dir, a local HF dir or a hub id")
    p.add_argument("--ppl", action="store_true", help="WikiText-2 perplexity (non-overlapping windows of --seq-len)")
    p.add_argument("--ppl-data", metavar="SOURCE",
                   help="'wikitext2' (hub), 'tiny', or a local .txt/.jsonl/.parquet (default: per --data)")
    p.add_argument("--ppl-windows", type=int, default=None, metavar="N",
                   help="score only the first N perplexity windows (default: the whole text; a quick check of a "
                        "large model on the CPU; the report says 'the first N of M windows')")
    p.add_argument("--tasks", metavar="T1,T2",
                   help="lm-eval tasks, groups or tags by their registry names, comma-separated (piqa,hellaswag; "
                        "arc_easy, mmlu, ... from the hub); tiny's piqa/hellaswag run offline on shipped files")
    p.add_argument("--limit", type=int, default=200, help="first N items per task (default 200, as in the paper)")
    p.add_argument("--task-file", action="append", default=[], metavar="TASK=FILE.jsonl",
                   help="run TASK's official config on a local JSONL file (repeatable)")
    p.add_argument("--data", choices=("auto", "tiny", "hub"), default="auto",
                   help="default data: 'tiny' = the shipped held-out files, 'hub' = WikiText-2 and lm-eval datasets "
                        "from the hub, 'auto' = a named model's own (tiny, smollm2) for it and checkpoints built from it, "
                        "else the hub (default)")
    p.add_argument("--latency", action="store_true", help="prefill and decode latency")
    p.add_argument("--seq-len", type=int, default=None,
                   help="perplexity window and prefill length (default: 2048 for perplexity and 1024 for prefill, "
                        "capped at the model's maximum)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="batch size for perplexity windows and lm-eval requests (default 8, a job's eval.batch_size)")
    p.add_argument("--latency-batch", type=int, default=1, help="prefill/decode batch (default 1)")
    p.add_argument("--decode-tokens", type=int, default=128, help="new tokens per decode measurement (default 128)")
    from gac.evaluation.suite import DECODE_PROMPT

    p.add_argument("--decode-prompt", type=int, default=DECODE_PROMPT,
                   help=f"prompt length before decoding (default {DECODE_PROMPT})")
    p.add_argument("--warmup", type=int, default=None, help="prefill warm-up calls (default 50 on CUDA, 3 on CPU)")
    p.add_argument("--iters", type=int, default=None, help="prefill measured calls (default 200 on CUDA, 10 on CPU)")
    p.add_argument("--trials", type=int, default=None, help="trials (default 3)")
    p.add_argument("--dtype", default=None, help="fp32, fp16, bf16 or auto (default: the model's own; tiny: fp32)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--json", metavar="OUT.json", help="write the report here")
    p.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    p.add_argument("--no-verify", action="store_true",
                   help="gac checkpoints: skip the sha256 checks of the weights, the config and the tokenizer files "
                        "(about 1 s per 1.5 GB) for a checkpoint you trust; a warning says it was skipped")


def _task_files(items: list[str]) -> dict[str, str]:
    from gac.errors import GacError
    from gac.evaluation.tasks import check_task_names

    out = {}
    for item in items:
        task, sep, path = item.partition("=")
        if not sep or not task or not path:
            raise GacError(f"--task-file {item!r} must be TASK=PATH, e.g. piqa=/data/piqa_valid.jsonl")
        if task in out:
            raise GacError(f"--task-file {task}={out[task]} and --task-file {item} both give {task}'s file; give "
                           f"one")
        out[task] = path
    check_task_names(list(out))
    return out


#: flag -> the evaluation setting it gives (gac.jobs.config.axes: which setting matters under which choice)
_FLAG_KEYS = {"ppl_data": "model.ppl_source", "limit": "eval.limit", "batch_size": "eval.batch_size",
              "latency_batch": "eval.latency_batch", "decode_tokens": "eval.decode_tokens",
              "decode_prompt": "eval.decode_prompt", "warmup": "eval.warmup", "iters": "eval.iters",
              "trials": "eval.trials"}


def evaluate_job(args, tasks: list[str], ppl_source: str, files: dict, max_len: int | None = None):
    """The :class:`~gac.jobs.config.spec.Job` of the flags (the baseline of ``args.model``, measured as asked), built as
    every entry point builds one (:func:`gac.jobs.config.build.job_from_config` on the config the flags give): every
    flag is a setting of its :class:`~gac.jobs.config.spec.EvalSpec`, so the Job holds the whole request.
    ``--seq-len`` is the perplexity window and the prefill length (the job's ``seq_len``, its ``prefill_ms``);
    without it the window is the evaluation's default and the prefill :func:`_default_latency_len` of ``max_len``,
    the model's maximum. ``--dtype`` unset: the model's own."""
    from gac.jobs.config.build import command_config, job_from_config

    prefill = args.seq_len or _default_latency_len(max_len)
    evaluation = {"ppl": bool(args.ppl), "tasks": list(tasks), "latency": bool(args.latency),
                  "ppl_seq_len": args.seq_len if args.ppl else None, "ppl_max_windows": args.ppl_windows,
                  "limit": args.limit, "latency_batch": args.latency_batch, "latency_seq_lens": [prefill],
                  "decode_tokens": args.decode_tokens, "decode_prompt": args.decode_prompt, "warmup": args.warmup,
                  "iters": args.iters, "trials": args.trials}
    if args.batch_size is not None:  # else the schema's eval.batch_size
        evaluation["batch_size"] = args.batch_size
    return job_from_config(command_config(
        args.model, device=args.device, dtype=args.dtype, ppl_source=ppl_source, task_files=files or None,
        evaluation=evaluation, seq_len=prefill))


def run(args) -> int:
    import json

    from gac.errors import GacError
    from gac.evaluation.suite import GROUPS
    from gac.evaluation.tasks import parse_tasks
    from gac.evaluation.text_report import format_table
    from gac.fixtures import default_data
    from gac.io import check_output_file, write_output
    from gac.models import base_model_of, describe
    from gac.provenance import provenance

    files = _task_files(args.task_file)
    tasks = parse_tasks(args.tasks, local=files) if args.tasks else []
    unused = [t for t in files if t not in tasks]
    if unused:  # never read, never checked: a typo in --tasks or in the file's task would go unnoticed
        t = unused[0]
        raise GacError(f"--task-file {t}={files[t]} is for task {t}, which --tasks does not run "
                       f"({', '.join(tasks) or 'no tasks given'}); add {t} to --tasks or drop the file")
    if not (args.ppl or tasks or args.latency):
        raise GacError("nothing to evaluate; pass --ppl, --tasks piqa,hellaswag and/or --latency")
    if args.ppl_windows is not None and not args.ppl:
        raise GacError("--ppl-windows caps perplexity windows, but --ppl is not given; add --ppl")
    inputs = [args.model, args.ppl_data, *files.values()]
    if args.json:
        check_output_file(args.json, "--json", args.force, inputs=inputs)
    for name, v in (("--limit", args.limit), ("--batch-size", args.batch_size), ("--latency-batch", args.latency_batch),
                    ("--decode-tokens", args.decode_tokens), ("--decode-prompt", args.decode_prompt),
                    ("--iters", args.iters), ("--trials", args.trials), ("--ppl-windows", args.ppl_windows)):
        if v is not None and v < 1:
            raise GacError(f"{name} must be at least 1 (got {v})")
    if args.warmup is not None and args.warmup < 0:
        raise GacError(f"--warmup must be at least 0 (got {args.warmup})")
    shortest = 2 if args.ppl else 1  # a perplexity window predicts from at least one token
    if args.seq_len is not None and args.seq_len < shortest:
        raise GacError(f"--seq-len must be at least {shortest}{' with --ppl' if args.ppl else ''} (got {args.seq_len})")
    # a gac checkpoint knows its base model: one built from tiny evaluates on tiny's files, never the hub
    named = default_data("tiny") if args.data == "tiny" else (
        default_data(base_model_of(args.model)) if args.data == "auto" else None)
    ppl_source = args.ppl_data or (named["ppl_source"] if named else "wikitext2")
    # what each task is scored on (gac.metrics.task_data): the table says so below a look-alike set's rows
    from gac.metrics import HUB_TASKS, OWN_TASK_FILES

    task_data = {t: OWN_TASK_FILES if t in files else HUB_TASKS for t in tasks}
    if named:
        from gac.fixtures import task_files_of

        own = {t: str(p) for t, p in task_files_of(named["task_files"]).items()
               if t in tasks and t not in files}
        task_data.update(dict.fromkeys(own, named["task_files"]))
        files = {**own, **files}

    from gac.evaluation.tasks import check_local_file

    for t in tasks:  # every row against the task's schema, before the model is loaded
        if t in files:
            check_local_file(t, files[t])
    from gac.evaluation.tasks import check_hub_tasks
    from gac.jobs.run.loading import model_max_positions
    from gac.jobs.run.preflight import check_model_here
    from gac.models import check_model_files
    from gac.text import check_source

    check_model_here(args.model)
    check_model_files(args.model, verify=not args.no_verify)  # weights that match their config, before the data
    from gac.jobs.config.axes import check_given, flags_given

    limit = model_max_positions(args.model)
    job = evaluate_job(args, tasks, ppl_source, files, limit)  # the request as a job: the same schema and rules
    check_given(job.spec, {}, flags_given(args, add_arguments, _FLAG_KEYS))  # a flag for a measurement not made
    if args.no_verify:
        from gac.compression.checkpoint import is_checkpoint

        if is_checkpoint(Path(args.model).expanduser()):  # the scores rest on files nothing checked: say so once
            logging.getLogger("gac.evaluate").warning(
                "--no-verify: the sha256 checks of %s (weights, config, tokenizer files) are off; these scores are of "
                "the files as they are now, not checked against what was saved", args.model)
    if args.ppl:
        check_source(ppl_source, "test", "--ppl-data")  # a binary file, a fifo, the hub while offline
    check_hub_tasks([t for t in tasks if t not in files])  # not a minute of retries after the model is loaded
    lengths = [("seq_len", "--seq-len", args.seq_len)] if args.seq_len is not None else []
    if args.latency:
        lengths.append(("decode_prompt + decode_tokens", "--decode-prompt + --decode-tokens",
                        args.decode_prompt + args.decode_tokens))
    for name, flag, n in lengths:
        if limit is not None and n > limit:
            raise GacError(f"{name}={n} is above the model's maximum sequence length ({limit}); "
                           f"use {flag} <= {limit}")
    from gac.jobs.run.memory_fits import check_model_fits, eval_load, is_out_of_memory, out_of_memory
    from gac.jobs.run.recipe import Recipe, StageContext

    # the weights and the evaluation the Job asks for against the device, before anything is loaded
    fp = check_model_fits(args.model, "none", job.spec.dtype, args.device, evaluation=eval_load(job.spec))
    recipe = Recipe(job.spec, StageContext(job.spec.device))  # the recipe from a checkpoint: load -> evaluate
    stage = "load"
    try:
        model, tokenizer = recipe.load(verify=not args.no_verify)
        if tokenizer is None and (args.ppl or tasks):
            raise GacError(f"{args.model!r} has no tokenizer, which perplexity and tasks need; save the tokenizer "
                           f"with the checkpoint, or run only --latency")
        info = describe(model)
        stage = "evaluate"
        if args.latency and args.seq_len is None and limit is None:  # no config offline: the loaded model's maximum
            from gac.evaluation.perplexity import model_max_length

            recipe = Recipe(evaluate_job(args, tasks, ppl_source, files, model_max_length(model)).spec, recipe.stages)
        measured = recipe.evaluate(model, tokenizer)
    except Exception as e:
        if is_out_of_memory(e):  # one line with the estimate and the fix, not torch's traceback
            raise out_of_memory(e, stage, args, fp) from None
        raise
    report = {**{k: measured["details"].get(k) for k in GROUPS}, "metrics": measured["metrics"]}
    print(format_table(report, info, task_data=task_data))
    if args.json:
        import math

        bad = {k: v for k, v in report["metrics"].items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:  # JSON has no inf or NaN: say so in one line rather than fail inside the writer
            k, v = next(iter(bad.items()))
            raise GacError(f"metric {k} is {v}: the model produced non-finite outputs, and a JSON report cannot hold "
                           f"{v}; {args.json!r} is not written (the table above is the result). Check the model "
                           f"(gac audit; its config.json and weights)")
        doc = {
            "model": args.model,
            "model_info": info,
            "metrics": report["metrics"],
            "perplexity": report["perplexity"],
            "tasks": report["tasks"],
            "task_data": task_data,
            "lm_eval": report["lm_eval"],
            "latency": report["latency"],
            "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
            "provenance": provenance(device=args.device),
        }
        write_output(args.json, json.loads(json.dumps(doc, default=str)), "--json", args.force, inputs=inputs)
        print(f"wrote {args.json}")
    return 0


def _default_latency_len(max_len: int | None) -> int:
    """The prefill length without ``--seq-len``: 1024, capped at the model's maximum ``max_len`` (None: none known)."""
    return 1024 if max_len is None else min(1024, max_len)
