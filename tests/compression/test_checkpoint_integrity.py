"""Checkpoints that cannot be silently wrong: verified hashes, audits from the weights, truncated files refused,
and no save_pretrained that transformers would reload with random weights."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch

from gac.cli import main
from gac.compression.checkpoint import save_checkpoint
from gac.compression.checkpoint_format import META_FILE, WEIGHTS_FILE
from gac.compression.checkpoint_load import load_checkpoint
from gac.errors import GacError
from tests.compression.conftest import small_model

IDS = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def compressed():
    from gac.compression.preparation import prepare

    m = small_model()
    cm, plan, _ = prepare(m, None, "asvd", calib_ids=IDS).compress(0.3, "unaligned")
    with torch.no_grad():
        logits = cm(IDS).logits
    return cm, logits


@pytest.fixture
def ckpt(compressed, tmp_path):
    d = tmp_path / "ck"
    save_checkpoint(compressed[0], None, d)
    return d


def test_flipped_bytes_are_caught_by_the_hash(ckpt, capsys):
    w = ckpt / WEIGHTS_FILE
    data = bytearray(w.read_bytes())
    mid = len(data) // 2
    for i in range(1000):
        data[mid + i] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(GacError, match="does not match the sha256 recorded"):
        load_checkpoint(ckpt)
    m, _ = load_checkpoint(ckpt, verify=False)  # documented escape hatch: loads (and would give other logits)
    assert m is not None
    assert main(["evaluate", str(ckpt), "--latency", "--iters", "1", "--warmup", "0", "--trials", "1",
                 "--seq-len", "8"]) == 2
    assert "sha256" in capsys.readouterr().err


@pytest.mark.parametrize("verify", [True, False])
def test_truncated_weights_are_an_error_not_a_traceback(ckpt, verify, capsys):
    w = ckpt / WEIGHTS_FILE
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 3])
    with pytest.raises(GacError, match="truncated"):  # named as such, hash or not
        load_checkpoint(ckpt, verify=verify)
    assert main(["audit", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and err.count("\n") == 1


def test_audit_reads_the_weights_and_flags_an_edited_json(ckpt, compressed, capsys):
    meta = json.loads((ckpt / META_FILE).read_text())
    name, spec = next((n, s) for n, s in meta["modules"].items() if s["type"] == "lowrank")
    true_rank, true_out = spec["rank"], spec["out"]
    spec.update(rank=120, out=999)
    (ckpt / META_FILE).write_text(json.dumps(meta))
    assert main(["audit", str(ckpt), "--json", "--all"]) == 2
    out, err = capsys.readouterr()
    rep = json.loads(out)
    row = next(r for r in rep["weights"] if r["name"] == name)
    assert row["dims"]["rank"] == true_rank and row["dims"]["out"] == true_out
    assert rep["shapes_from"] == "weights" and rep["config_mismatch"][0]["name"] == name
    assert "disagrees with the weights" in err and "rank=120" in err and err.count("\n") == 1


def test_audit_of_a_missing_path_says_so(tmp_path, capsys):
    for p in (tmp_path / "nope", "./nope", "../nope/x", "/no/such/dir"):
        assert main(["audit", str(p)]) == 2
        err = capsys.readouterr().err
        assert "does not exist" in err and "Repo id" not in err


def test_loaded_model_save_pretrained_writes_a_gac_checkpoint(ckpt, compressed, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    m, _ = load_checkpoint(ckpt)
    out = tmp_path / "via_hf_api"
    m.save_pretrained(out)
    assert (out / META_FILE).is_file() and not (out / "config.json").exists()
    assert "wrote a gac checkpoint" in caplog.text
    with pytest.raises((OSError, ValueError)):  # transformers refuses it: never a random-initialised model
        AutoModelForCausalLM.from_pretrained(out)
    m2, _ = load_checkpoint(out)
    with torch.no_grad():
        assert torch.equal(m2(IDS).logits, compressed[1])


def test_in_memory_compressed_model_is_guarded_too(compressed, tmp_path):
    cm = compressed[0]
    with pytest.raises(GacError, match="push_to_hub"):
        cm.save_pretrained(tmp_path / "hub", push_to_hub=True)
    with pytest.raises(GacError, match="state_dict"):
        cm.save_pretrained(tmp_path / "sd", state_dict=cm.state_dict())
    # a tokenizer saved first (the usual order) does not block it; another model's folder does
    d = tmp_path / "with_tok"
    d.mkdir()
    (d / "tokenizer.json").write_text("{}")
    cm.save_pretrained(d)
    assert {"tokenizer.json", META_FILE, WEIGHTS_FILE} <= set(os.listdir(d))
    with pytest.raises(GacError, match="already holds a gac checkpoint; refusing to overwrite it \\(save_pretrained never"):
        cm.save_pretrained(d)  # never overwrites a checkpoint
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_an_uncompressed_model_keeps_transformers_save(tmp_path):
    from transformers import AutoModelForCausalLM

    from gac.compression.checkpoint import guard_save_pretrained, hf_loadable

    m = small_model()
    guard_save_pretrained(m)  # installed, but the model is still exactly its architecture
    assert hf_loadable(m)
    m.save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "config.json").is_file()
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        assert torch.equal(m(IDS).logits, m2(IDS).logits)


def test_checkpoint_files_honour_the_umask(compressed, tmp_path):
    old = os.umask(0o022)
    try:
        save_checkpoint(compressed[0], None, tmp_path / "ck")
    finally:
        os.umask(old)
    for f in (tmp_path / "ck").iterdir():
        assert f.stat().st_mode & 0o777 == 0o644, f


def test_killed_save_leaves_a_temp_dir_that_the_next_save_removes(compressed, tmp_path):
    import subprocess
    import sys

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    from gac.machine import machine_id

    left = tmp_path / f".ck.{machine_id()}.{dead}.0123abcd.tmp"
    left.mkdir()
    (left / WEIGHTS_FILE).write_bytes(b"\0" * 1000)
    # the checkpoint's folder is the user's: another tool's temp-like names and another output's temp stay
    others = [tmp_path / ".notes.txt.tmp12345", tmp_path / ".build.abcd1234.tmp",
              tmp_path / f".other.{machine_id()}.{dead}.0123abcd.tmp"]
    aged = time.time() - 7 * 3600  # older than GAC_TEMP_STALE_S
    for p in others:
        p.mkdir()
        (p / "f").write_text("x")
        os.utime(p, (aged, aged))
    save_checkpoint(compressed[0], None, tmp_path / "ck")
    assert not left.exists() and (tmp_path / "ck" / META_FILE).is_file()
    assert all((p / "f").read_text() == "x" for p in others)


def test_compress_validates_everything_before_loading(tmp_path, capsys, monkeypatch):
    import gac.models

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(gac.models, "load_model", boom)
    base = ["compress", "tiny", "--compressor", "asvd", "--ratio", "0.2", "-o", str(tmp_path / "out")]
    for extra, msg in ((["--unit", "0"], "multiple of 8"), (["--unit", "7"], "multiple of 8"),
                       (["--window", "0"], "window"), (["--strategy", "gca"], "did you mean 'gac'"),
                       (["--proxy", "magnitdue"], "did you mean 'magnitude'"),
                       (["--calib", str(tmp_path / "none.txt")], "neither"), (["--calib-samples", "0"], "calib")):
        assert main(base + extra) == 2, extra
        assert msg in capsys.readouterr().err, extra
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_compress_calibrates_tiny_on_its_own_text_by_default(ckpt, tmp_path):
    """`gac compress tiny` without --calib must not go to the hub for WikiText-2 (30 s of retries offline, then exit 2):
    tiny and checkpoints built from it calibrate on tiny's training text, 256-token samples; other models keep the
    papers' WikiText-2 x 2048."""
    import argparse

    from gac.commands import compress as C

    p = argparse.ArgumentParser()
    C.add_arguments(p)
    args = p.parse_args(["tiny", "--compressor", "asvd", "--ratio", "0.2", "-o", str(tmp_path / "a")])
    C.validate(args)
    assert (args.calib, args.calib_seq_len) == ("tiny", 256)
    from gac.compression.checkpoint_format import meta_sha256

    ck = ckpt  # a real checkpoint, recorded as built from tiny
    meta = json.loads((ck / META_FILE).read_text())
    meta["base_model"] = "tiny"
    meta["meta_sha256"] = meta_sha256(meta)
    (ck / META_FILE).write_text(json.dumps(meta))
    args = p.parse_args([str(ck), "--compressor", "asvd", "--ratio", "0.2", "-o", str(tmp_path / "b")])
    C.validate(args)
    assert args.calib == "tiny"
    args = p.parse_args(["meta-llama/Meta-Llama-3-8B", "--compressor", "asvd", "--ratio", "0.2", "--calib-seq-len",
                         "512", "-o", str(tmp_path / "c")])
    with pytest.raises(GacError, match="hub"):  # offline, a hub id is refused before loading ...
        C.validate(args)
    assert (args.calib, args.calib_seq_len) == ("wikitext2", 512)  # ... after its data defaults were chosen
