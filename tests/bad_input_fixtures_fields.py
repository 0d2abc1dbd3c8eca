"""The files the "Configs that disagree with their weights, and refusals made clear" rows of docs/bad-input.md name:
copies of tiny's Hugging Face directory whose config.json, weights or tokenizer disagree, deeply nested JSON, task
files with empty or over-long items, stores with a damaged record, a named pipe and a dangling link."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "analysis" / "fixtures" / "store"
RECORD = "a015000000000000"  # a completed record of the fixture store
DEEP = "[" * 100_000 + "]" * 100_000  # JSON nested 100k levels deep: Python's parser raises RecursionError


def _hf(T: Path, case: str, edit=None) -> Path:
    """A copy of tiny's HF directory (its weights hard-linked where possible), ``edit(config)`` applied."""
    from gac.fixtures.tiny import tiny_dir
    from tests.bad_store_fixtures import copy_tiny_hf

    src, d = tiny_dir(), T / f"hf_{case}"
    d.mkdir()
    copy_tiny_hf(src, d)
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def _replace_weights(d: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d / "model.safetensors"))
    edit(sd)
    (d / "model.safetensors").unlink()
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})


def _hf_dirs(T: Path) -> None:
    import torch

    d = _hf(T, "bf16")  # every header dtype F16 -> BF16, the bytes unchanged: config.json still says float16
    _replace_weights(d, lambda sd: sd.update({k: v.view(torch.bfloat16) for k, v in sd.items()}))
    _hf(T, "maxpos0", lambda c: c.update(max_position_embeddings=0))
    _hf(T, "maxpos_neg", lambda c: c.update(max_position_embeddings=-1))
    _hf(T, "maxpos_frac", lambda c: c.update(max_position_embeddings=1024.5))
    _hf(T, "rope_neg", lambda c: c["rope_parameters"].update(rope_theta=-1.0))
    _hf(T, "eps_neg", lambda c: c.update(rms_norm_eps=-1.0))
    _hf(T, "eps0", lambda c: c.update(rms_norm_eps=0))
    _hf(T, "heads3", lambda c: c.update(num_attention_heads=3))
    d = _hf(T, "tok_id")  # the tokenizer maps " the" to an id the 4096-row embedding does not have
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["vocab"]["Ġthe"] = 9999
    (d / "tokenizer.json").write_text(json.dumps(tok))
    d = _hf(T, "nan")  # one projection's weights NaN (a broken conversion)
    _replace_weights(d, lambda sd: sd["model.layers.0.mlp.down_proj.weight"].fill_(float("nan")))


def _stores(T: Path) -> None:
    def store(name: str) -> Path:
        d = T / name
        shutil.copytree(STORE, d)
        return d

    d = store("st_deep")  # a record nested 100k levels deep
    (d / "records" / "3333333333333333.json").write_text(DEEP)
    d = store("st_date")  # a record whose time stamp is no time
    doc = json.loads((d / "records" / f"{RECORD}.json").read_text())
    doc["created"] = "not-a-date"
    (d / "records" / f"{RECORD}.json").write_text(json.dumps(doc))


def _run_stores(T: Path) -> None:
    """Stores for the experiments/run.py rows (they exist, so a refused run may leave nothing but what was there)."""
    from omegaconf import OmegaConf

    from gac.jobs.config.command_line import compose_config
    from gac.jobs.config.build import spec_from_config

    key = spec_from_config(OmegaConf.to_container(compose_config(["compressor=none", "eval=none"]), resolve=True)).key
    for name in ("run_lock_fifo", "run_nan"):
        d = T / name
        (d / "records").mkdir(parents=True)
        (d / ".gac-store.json").write_text(json.dumps({"format": "gac-results-store", "schema": 1}))
    (T / "run_lock_fifo" / "locks").mkdir()
    os.mkfifo(T / "run_lock_fifo" / "locks" / f"{key}.lock")  # reading it would block until a writer opens it


def _files(T: Path) -> None:
    (T / "deep.json").write_text(DEEP)
    ck = T / "ck_deep"
    ck.mkdir()
    (ck / "gac_checkpoint.json").write_text(DEEP)
    row = {"goal": "g", "sol1": "a", "sol2": "b", "label": 0}
    (T / "piqa_empty.jsonl").write_text(json.dumps({**row, "sol1": "", "sol2": ""}) + "\n")
    (T / "piqa_long.jsonl").write_text(json.dumps({**row, "goal": "the cat " * 3000}) + "\n")
    (T / "a_dir").mkdir()
    (T / "a_file.txt").write_text("not a model\n")
    (T / "dangling.json").symlink_to(T / "nowhere" / "report.json")
    (T / "fields_fifo").mkdir()
    os.mkfifo(T / "fields_fifo" / "piqa.jsonl")
    arch = (ROOT / "conf" / "model" / "llama3_8b.yaml").read_text()
    assert "\n  model_type: llama\n" in arch
    (T / "arch_notype.yaml").write_text(arch.replace("\n  model_type: llama\n", "\n"))
    (T / "arch_typo.yaml").write_text(arch.replace("model_type: llama\n", "model_type: llamma\n"))


def fields_files(T: Path) -> None:
    """Every input of the "Configs that disagree with their weights, and refusals made clear" rows, under ``T``."""
    _hf_dirs(T)
    _stores(T)
    _run_stores(T)
    _files(T)
