"""The files the "A shared results directory and a downloaded model directory" rows of docs/bad-input.md name:
copies of ``tiny``'s Hugging Face directory as a download can leave them (sharded, a pickle, a named pipe, a link to
a device, an oversized or foreign file), and results stores as colleagues on a shared file system can leave them (a
record that is a pipe or empty, a store or record of a newer gac, a clock far ahead, a lock that is a link). Every
name starts with ``own_``; large files are hard links or sparse, so the whole set costs a few MB and a second."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from tests.bad_store_fixtures import RECORD, STORE, _edit_json

FUTURE = time.mktime((2099, 1, 1, 0, 0, 0, 0, 0, -1))  # a time no clock shows yet


def _hf(T: Path, case: str) -> Path:
    """A copy of tiny's HF directory (its weights a hard link where the file system allows)."""
    from gac.fixtures.tiny import tiny_dir

    src, d = tiny_dir(), T / f"own_{case}"
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        try:
            if f != "model.safetensors":
                raise OSError
            os.link(src / f, d / f)
        except OSError:
            shutil.copy(src / f, d / f)
    return d


def _replace(path: Path, how) -> None:
    """``path`` removed and made again by ``how(path)`` (a fifo, a link, a directory, a sparse file)."""
    path.unlink()
    how(path)


def _sparse(size: int):
    def make(path: Path) -> None:
        with open(path, "wb") as f:
            f.truncate(size)
    return make


def _model_dirs(T: Path) -> None:
    from safetensors.torch import load_file, save_file

    from gac.fixtures.tiny import tiny_dir

    sd = load_file(str(tiny_dir() / "model.safetensors"))
    keys = sorted(sd)
    half = {k: sd[k] for k in keys[: len(keys) // 2]}, {k: sd[k] for k in keys[len(keys) // 2:]}
    names = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"

    def sharded(case: str, second=None, edit=None) -> Path:
        d = _hf(T, case)
        (d / "model.safetensors").unlink()
        save_file(half[0], str(d / names[0]), metadata={"format": "pt"})
        save_file(half[1] if second is None else second, str(d / names[1]), metadata={"format": "pt"})
        wm = {k: names[i] for i in (0, 1) for k in half[i]}
        if edit is not None:
            edit(wm)
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
        return d

    d = sharded("shard_up")  # the second shard moved out of the directory, the index pointing there
    shutil.move(d / names[1], T / "own_outside_shard.safetensors")
    _edit_json(d / "model.safetensors.index.json",
               lambda c: c["weight_map"].update({k: "../own_outside_shard.safetensors" for k in half[1]}))
    d = sharded("shard_abs", edit=lambda wm: wm.update({k: str(T / "own_outside_shard.safetensors") for k in half[1]}))
    (d / names[1]).unlink()
    d = sharded("shard_missing")
    (d / names[1]).unlink()
    first = keys[0]
    sharded("shard_dup", second={**half[1], first: half[0][first] * 2})  # one tensor in both shards, other values
    sharded("shard_wrongmap", edit=lambda wm: wm.update({first: names[1]}))
    sharded("shard_empty", edit=lambda wm: wm.clear())
    d = sharded("shard_dir")
    _replace(d / names[1], Path.mkdir)

    _edit_json(_hf(T, "vocab") / "config.json", lambda c: c.update(vocab_size=10**12))
    _edit_json(_hf(T, "kvheads") / "config.json", lambda c: c.update(num_key_value_heads=8))
    _edit_json(_hf(T, "int8") / "config.json", lambda c: c.update(dtype="int8"))
    _edit_json(_hf(T, "quant") / "config.json",
               lambda c: c.update(quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True}))
    _replace(_hf(T, "config_big") / "config.json", _sparse(50 << 20))
    _replace(_hf(T, "cfg_fifo") / "config.json", os.mkfifo)
    _replace(_hf(T, "cfg_zero") / "config.json", lambda p: p.symlink_to("/dev/zero"))
    _replace(_hf(T, "tok_huge") / "tokenizer.json", _sparse(300 << 20))
    _replace(_hf(T, "tok_fifo") / "tokenizer.json", os.mkfifo)
    _replace(_hf(T, "tok_zero") / "tokenizer.json", lambda p: p.symlink_to("/dev/zero"))
    d = _hf(T, "tok_trunc")
    (d / "tokenizer.json").write_text((d / "tokenizer.json").read_text()[:5000])
    _edit_json(_hf(T, "tok_class") / "tokenizer_config.json", lambda c: c.update(tokenizer_class="EvilTokenizerFast"))
    (_hf(T, "gen_bad") / "generation_config.json").write_text("{bad")
    _edit_json(_hf(T, "gen_odd") / "generation_config.json", lambda c: c.update(max_new_tokens=-5))
    _replace(_hf(T, "gen_fifo") / "generation_config.json", os.mkfifo)
    _replace(_hf(T, "w_zero") / "model.safetensors", lambda p: p.symlink_to("/dev/zero"))
    _replace(_hf(T, "w_dir") / "model.safetensors", Path.mkdir)

    class Evil:  # a pickle that would run a command when unpickled
        def __reduce__(self):
            return (os.system, (f"touch {T / 'own_pickle_ran'}",))

    import torch

    d = _hf(T, "pickle")
    (d / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Evil()}, d / "pytorch_model.bin")
    d = _hf(T, "gguf_cfg")
    (d / "model.safetensors").unlink()
    (d / "model-q4_1.gguf").write_bytes(b"GGUF" + bytes(60))
    _hf(T, "results")  # a downloaded model given as results_dir
    d = T / "own_gguf"
    d.mkdir()
    (d / "model-q4_1.gguf").write_bytes(b"GGUF" + bytes(60))


def _stores(T: Path) -> None:
    rec = lambda d: T / d / "records" / f"{RECORD}.json"  # noqa: E731

    def store(name: str) -> Path:
        d = T / name
        shutil.copytree(STORE, d)
        return d

    os.mkfifo(store("own_st_fifo") / "records" / "3333333333333333.json")
    (store("own_st_empty") / "records" / "3333333333333333.json").write_bytes(b"")
    store("own_st_schema2")
    _edit_json(rec("own_st_schema2"), lambda r: r.update(schema=2))
    d = store("own_st_future")  # a re-run written by a host whose clock is 74 years ahead
    rerun = d / "records" / f"{RECORD}.rerun-20990101T000000.000000Z.json"
    shutil.copy(rec("own_st_future"), rerun)
    _edit_json(rerun, lambda r: r.update(created="2099-01-01T00:00:00Z"))
    d = store("own_st_marker2")
    (d / ".gac-store.json").write_text(json.dumps({"format": "gac-results-store", "schema": 2}))
    d = store("own_st_marker_foreign")
    (d / ".gac-store.json").write_text(json.dumps({"format": "zarr", "zarr_format": 2}))
    (T / "own_st_is_file").write_text("results\n")
    d = store("own_st_bench_fifo")
    (d / "bench").mkdir()
    os.mkfifo(d / "bench" / "abcdabcdabcdabcd.json")


def _run_stores(T: Path) -> None:
    """Stores for the experiments/run.py rows, at the baseline point's key (as tests.bad_store_fixtures makes)."""
    from tests.bad_store_fixtures import baseline_key, empty_store

    key = baseline_key()

    def store(name: str) -> Path:
        return empty_store(T, name)

    d = store("own_run_lock_link")  # the lock a link to a colleague's file
    (d / "locks").mkdir()
    (d / "locks" / f"{key}.lock").symlink_to(T / "full" / "keep.txt")
    d = store("own_run_lock_future")  # a lock of another host whose clock is far ahead
    (d / "locks").mkdir()
    lock = d / "locks" / f"{key}.lock"
    lock.write_text(json.dumps({"what": f"job {key}", "host": "node17", "pid": 4242, "machine": "node17-4026531836",
                                "started": FUTURE, "started_iso": "2099-01-01T00:00:00Z", "token": "0123456789abcdef"}))
    os.utime(lock, (FUTURE, FUTURE))
    d = store("own_run_events_link")
    (d / "runs").mkdir()
    (d / "runs" / f"{key}.jsonl").symlink_to(T / "full" / "keep.txt")
    d = store("own_run_marker2")
    (d / ".gac-store.json").write_text(json.dumps({"format": "gac-results-store", "schema": 2}))
    (T / "own_run_is_file").write_text("results\n")


def own_files(T: Path) -> None:
    """Every input of the "A shared results directory and a downloaded model directory" rows, under ``T``."""
    _model_dirs(T)
    _stores(T)
    _run_stores(T)
