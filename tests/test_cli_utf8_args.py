"""A path that is not valid UTF-8 (``mod\\xff``, a surrogate escape in Python) is refused up front by every command
with one line naming it: it was reported as a truncated safetensors file (audit, evaluate), or a traceback once a
checkpoint had been compressed (``-o``). A catalogue row cannot hold such a name (the page is UTF-8), so these are
ordinary tests."""

from __future__ import annotations

import os
import sys

import pytest

from gac.cli import main

NON_UTF8 = os.fsdecode(b"mod\xff")


@pytest.mark.parametrize("argv", [
    ["audit", NON_UTF8],
    ["evaluate", NON_UTF8, "--ppl", "--ppl-data", "tiny"],
    ["compress", "gac/data/tiny", "--compressor", "asvd", "--ratio", "0.2", "--calib", "tiny", "-o", NON_UTF8],
])
def test_a_non_utf8_argument_is_refused_before_any_work(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where -o would be written
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument 'mod\\xff' is not valid UTF-8 text" in err[0], err
    assert "truncated" not in err[0]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("prog", ["experiments/run.py", "experiments/bench.py"])
def test_the_hydra_apps_refuse_it_too(prog, capsys, monkeypatch):
    from gac.commands.hydra_apps import check_argv

    monkeypatch.setattr(sys, "argv", [prog, "eval=none", f"results_dir={os.fsdecode(b'r' + bytes([0xfe]))}"])
    with pytest.raises(SystemExit) as e:
        check_argv(prog)
    assert e.value.code == 2
    assert "argument 'results_dir=r\\xfe' is not valid UTF-8 text" in capsys.readouterr().err
