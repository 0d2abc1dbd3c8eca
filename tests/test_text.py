"""gac.text: calibration batches (the GPTQ/ASVD protocol: random windows of the tokenized train split, seeded),
the splits of a source, and offline the fix a message names is the one that works for the command at hand (its
own flag or config key)."""

from __future__ import annotations

import pytest
import torch

from gac.errors import GacError
from gac.text import calibration_batches, load_text, tokenize_text


def test_calibration_batches_are_seeded_windows_of_the_train_text(tiny):
    _, tok = tiny
    b = calibration_batches(tok, "tiny", n_samples=6, seq_len=64, seed=3)
    assert b.shape == (6, 64) and b.dtype == torch.long
    assert torch.equal(b, calibration_batches(tok, "tiny", n_samples=6, seq_len=64, seed=3))
    assert not torch.equal(b, calibration_batches(tok, "tiny", n_samples=6, seq_len=64, seed=4))
    ids = tokenize_text(tok, load_text("tiny", "train"))
    windows = ids.unfold(0, 64, 1)
    for row in b:  # every sample is a contiguous window of the tokenized train split
        assert (windows == row).all(dim=1).any()


def test_calibration_text_shorter_than_a_window_is_an_error(tiny, tmp_path):
    p = tmp_path / "short.txt"
    p.write_text("Exeunt.\n")
    with pytest.raises(GacError, match="fewer than one window"):
        calibration_batches(tiny[1], p, n_samples=2, seq_len=64)


def test_splits_of_the_tiny_source_are_distinct_files(tiny_files):
    assert load_text("tiny", "test") != load_text("tiny", "train") != load_text("tiny", "validation")
    with pytest.raises(GacError, match="unknown split 'tset'; did you mean 'test'"):
        load_text("tiny", "tset")


def test_offline_wikitext2_names_the_flag_of_the_command(monkeypatch):
    import gac.hub
    import gac.text

    monkeypatch.setattr(gac.hub, "hub_unreachable", lambda *a, **k: "offline")
    monkeypatch.setattr(gac.hub, "hub_dataset_cached", lambda *a, **k: False)
    with pytest.raises(GacError) as e:
        gac.text.check_source("wikitext2", "train", "--calib")
    msg = str(e.value)
    assert "--calib FILE" in msg and "--calib enwiki" in msg and "--ppl-data" not in msg
    with pytest.raises(GacError, match="calibration.source=FILE"):
        gac.text.check_source("wikitext2", "train", "calibration.source")
