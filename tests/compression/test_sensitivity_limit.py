"""ASVD's sensitivity search says its cost before it starts and refuses above a limit (``--sensitivity-limit``,
``GAC_SENSITIVITY_LIMIT``), with one line from the CLI."""

from __future__ import annotations

import os

import pytest
import torch

from gac.errors import GacError


def test_parse_duration():
    from gac.compression.sensitivity import parse_duration, sensitivity_limit

    assert parse_duration("90m") == 5400 and parse_duration("12h") == 43200 and parse_duration("30") == 30
    assert parse_duration("none") is None
    for bad in ("abc", "-3h", "h"):
        with pytest.raises(GacError, match="is not a duration"):
            parse_duration(bad)
    os.environ.pop("GAC_SENSITIVITY_LIMIT", None)
    assert sensitivity_limit() == 7200 and sensitivity_limit(None) is None and sensitivity_limit(5) == 5


def test_the_search_says_its_cost_and_refuses_above_the_limit(monkeypatch):
    import gac.compression.preparation as cc
    from gac.models import load_model

    def calibrating(*a, **k):
        raise AssertionError("the calibration started before the search's cost was checked")

    monkeypatch.setattr(cc, "iter_activation_stats", calibrating)
    model, tok = load_model("tiny")
    cal = cc.Calibration("tiny", n_samples=4, seq_len=64)
    with pytest.raises(GacError) as e:
        cc.prepare(model, tok, "asvd", calibration=cal, sensitivity_limit_s=1e-9)
    msg = str(e.value)
    assert msg.startswith("sensitivity search: 168 probes (28 weights x 6 kept ratios), each 4 x 64 calibration tokens")
    for fix in ("sensitivity_samples=N", "sensitivity_grid", "layers=START:END", "allocation=proportional",
                "--sensitivity-limit", "GAC_SENSITIVITY_LIMIT="):
        assert fix in msg, fix
    # probing on fewer samples than were calibrated: the message counts both
    with pytest.raises(GacError) as e:
        cc.prepare(model, tok, "asvd", calibration=cal, sensitivity_limit_s=1e-9,
                   compressor_options={"sensitivity_samples": 1})
    msg = str(e.value)
    assert "each 1 x 64 calibration tokens" in msg and "probe on N of the 4 calibration samples; now 1" in msg, msg


def test_the_estimate_counts_what_the_table_runs():
    from gac.compression.preparation import prepare
    from gac.compression.sensitivity import count_probes
    from gac.models import load_model

    model, tok = load_model("tiny")
    calib = torch.randint(0, 100, (2, 32))
    p = prepare(model, tok, "asvd", calib_ids=calib, compressor_options={"sensitivity_grid": (0.5, 0.9, 1.0)},
                sensitivity_limit_s=None)
    table = p.sensitivity["table"]
    base = p.sensitivity["base_ppl"]
    ran = sum(1 for row in table for v, g in zip(row, p.sensitivity["grid"]) if g < 1 and v != base)
    assert count_probes(p.units, p.sensitivity["grid"]) == ran == 2 * len(p.units)


def test_compress_cli_refuses_with_one_line(tmp_path, capsys, monkeypatch):
    import logging

    from gac.cli import main

    monkeypatch.setattr(logging.root, "handlers", [])  # gac's log lines to this test's stderr, not an earlier one's
    rc = main(["compress", "tiny", "--compressor", "asvd", "--ratio", "0.2", "--calib-samples", "2",
               "--calib-seq-len", "32", "--sensitivity-limit", "0.001s", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [ln for ln in err if "error:" in ln]
    # a limit no estimate is under (tiny's 2 x 32-token search takes about 1 s on a quiet machine)
    assert rc == 2 and errors == err[-1:] and "above the limit of 0 s" in err[-1], err  # INFO lines may come first
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert main(["compress", "tiny", "--compressor", "asvd", "--ratio", "0.2", "--sensitivity-limit", "soon",
                 "-o", str(tmp_path / "out")]) == 2
    assert "--sensitivity-limit='soon' is not a duration" in capsys.readouterr().err
