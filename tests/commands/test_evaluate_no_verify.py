"""``gac evaluate --no-verify`` skips every sha256 check of a gac checkpoint (its weights, config and tokenizer
files): one warning line says so, where before nothing said verification was off."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch

    from gac.compression.checkpoint import save_checkpoint
    from gac.models import load_model

    model, tok = load_model("tiny", dtype=torch.float32)
    return save_checkpoint(model, tok, tmp_path_factory.mktemp("nv") / "ck")


def _run(args, caplog, tmp_path):
    from gac.cli import main

    text = tmp_path / "few.txt"  # a few windows of text: the run is about the warning, not the score
    text.write_text("The quick brown fox jumps over the lazy dog.\n" * 8)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        rc = main(["evaluate", *args, "--ppl", "--ppl-data", str(text), "--seq-len", "32"])
    return rc, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_no_verify_says_the_checks_were_off(checkpoint, caplog, tmp_path):
    rc, warnings = _run([str(checkpoint), "--no-verify"], caplog, tmp_path)
    assert rc == 0
    said = [w for w in warnings if w.startswith("--no-verify: the sha256 checks of")]
    assert len(said) == 1 and "(weights, config, tokenizer files) are off" in said[0]


def test_verified_runs_and_plain_models_say_nothing(checkpoint, caplog, tmp_path):
    for args in ([str(checkpoint)], ["tiny", "--no-verify"]):
        rc, warnings = _run(args, caplog, tmp_path)
        assert rc == 0 and not [w for w in warnings if "--no-verify" in w], (args, warnings)
