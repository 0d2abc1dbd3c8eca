"""The files the "Fourth catalogue: writes, checkpoints and messages" rows of docs/bad-input.md name: a results store
and a model directory to write into, nodes where a file should be (a looping link, a block device and a socket made
here, never a real one), copies of the catalogue's checkpoint of tiny with their tokenizer, weights or config
damaged, copies of tiny's Hugging Face directory with a second copy of a tied weight or a bad RoPE block, and a
hardware profile whose profile.json is a named pipe. Every name starts with ``wr_``; weights are hard links."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "analysis" / "fixtures" / "store"
PROFILE = ROOT / "tests" / "analysis" / "fixtures" / "profile"


def _hf(T: Path, case: str, edit=None) -> Path:
    """A copy of tiny's HF directory ``T/wr_<case>`` (weights hard-linked where possible), ``edit(config)`` applied."""
    from gac.fixtures.tiny import tiny_dir
    from tests.bad_store_fixtures import copy_tiny_hf

    d = T / f"wr_{case}"
    d.mkdir(parents=True)
    copy_tiny_hf(tiny_dir(), d)
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def _with_lm_head(d: Path, scale: float) -> None:
    """Store ``lm_head.weight`` = ``scale`` x the embedding beside it (tiny ties the two: it stores one)."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = (sd["model.embed_tokens.weight"] * scale).contiguous()
    (d / "model.safetensors").unlink()
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})


def _model_dirs(T: Path) -> None:
    _hf(T, "model")  # a model directory an output must not go into
    (T / "wr_nest").mkdir()
    _hf(T / "wr_nest", "model")  # a directory that holds the model being compressed
    _with_lm_head(_hf(T, "hf_tied"), 0.8)  # tie_word_embeddings true, and an lm_head of other values
    _with_lm_head(_hf(T, "hf_tied_same"), 1.0)  # the same, its copy equal: accepted
    _hf(T, "hf_rope_lin", lambda c: c["rope_parameters"].update(rope_type="linear", factor=-2.0))
    _hf(T, "hf_rope_legacy", lambda c: c.update(rope_scaling={"type": "linear", "factor": -2}))
    _hf(T, "hf_rope_type", lambda c: c["rope_parameters"].update(rope_type="lineer", factor=2.0))
    _hf(T, "hf_rope_llama3", lambda c: c["rope_parameters"].update(
        rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
        original_max_position_embeddings=512))
    _hf(T, "hf_rope_str", lambda c: c.update(rope_scaling="linear"))
    _hf(T, "hf_rope_zero", lambda c: c["rope_parameters"].update(rope_type="dynamic", factor=0))


def _checkpoints(T: Path) -> None:
    """Copies of the catalogue's checkpoint ``T/ck`` (tests/bad_store_fixtures.py) with one thing changed."""
    from gac.compression.checkpoint_format import META_FILE, WEIGHTS_FILE, meta_sha256
    from tests.bad_store_fixtures import _edit_json, _link_copy

    def ck(case: str, edit=None) -> Path:
        d = _link_copy(T / "ck", T / f"wr_ck_{case}")
        if edit is not None:
            _edit_json(d / META_FILE, edit)
        return d

    d = ck("tok_swap")  # two ids of the tokenizer swapped: every text is scored as another
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["Ġthe"], vocab["Ġa"] = vocab["Ġa"], vocab["Ġthe"]
    (d / "tokenizer.json").write_text(json.dumps(tok))

    ck("tok_nohash", lambda m: m.pop("tokenizer_files"))

    def format2(m):  # what a checkpoint of the previous format holds: no tokenizer hashes, its own hash right
        m.pop("tokenizer_files")
        m["format_version"] = 2
        m["meta_sha256"] = meta_sha256(m)

    ck("format2", format2)
    d = ck("tok_extra")  # a tokenizer file planted beside the ones it saved
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|x|>"}))
    d = ck("tok_gone")
    (d / "tokenizer_config.json").unlink()
    d = ck("w_fifo")
    (d / WEIGHTS_FILE).unlink()
    os.mkfifo(d / WEIGHTS_FILE)
    ck("rope", lambda m: m["base_config"]["rope_parameters"].update(rope_type="linear", factor=-2.0))
    d = ck("tied")  # the output layer stored beside the embedding it is tied to, of other values
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d / WEIGHTS_FILE))
    pair = ("lm_head.weight", "model.embed_tokens.weight")  # the file holds one of the two: add the other
    have, add = pair if pair[0] in sd else pair[::-1]
    sd[add] = (sd[have] * 0.8).contiguous()
    (d / WEIGHTS_FILE).unlink()
    save_file(sd, str(d / WEIGHTS_FILE), metadata={"format": "pt"})
    d = ck("extra")  # a checkpoint someone keeps notes in: --force must not delete them
    (d / "notes.txt").write_text("a colleague's notes")


def _nodes(T: Path) -> None:
    """Nodes where a file or directory should be: made here, in ``T``, never a real device."""
    os.symlink("wr_loop", T / "wr_loop")  # a link to itself
    os.symlink(T / "wr_nowhere" / "dir", T / "wr_dangling_dir")
    os.mknod(T / "wr_blk", stat.S_IFBLK | 0o600, os.makedev(7, 255))  # a block device node (a loop device)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(T / "wr_sock"))  # the socket file stays after close
    s.close()
    os.mkfifo(T / "wr_model_fifo")
    (T / "wr_dir").mkdir()
    (T / "wr_dir" / "x.txt").write_text("x")
    prof = T / "wr_profile_fifo"
    shutil.copytree(PROFILE, prof)
    (prof / "profile.json").unlink()
    os.mkfifo(prof / "profile.json")


def _stores(T: Path) -> None:
    shutil.copytree(STORE, T / "wr_store")
    (T / "wr_store" / "bench").mkdir()
    (T / "wr_store" / ".gac-store.json").write_text(json.dumps({"format": "gac-results-store", "schema": 1}))
    (T / "wr_plan.json").write_text((T / "plan_ok.json").read_text())
    (T / "wr_alloc.json").write_text((T / "alloc_ok.json").read_text())
    (T / "wr_piqa.jsonl").write_text(json.dumps({"goal": "g", "sol1": "a", "sol2": "b", "label": 0}) + "\n")
    (T / "wr_text.txt").write_text("the cat sat on the mat. " * 200)


def writes_files(T: Path) -> None:
    """Every input of the "Fourth catalogue: writes, checkpoints and messages" rows, under ``T`` (after the other
    catalogues' files: it copies ``T/ck``, ``T/plan_ok.json`` and ``T/alloc_ok.json``)."""
    _model_dirs(T)
    _checkpoints(T)
    _nodes(T)
    _stores(T)
