"""A reader that leaves (``... | head``) ends every command line quietly: no traceback, no BrokenPipeError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "gac.cli", "audit", "tiny", "--all"],
    [sys.executable, "-m", "gac.cli", "audit", "tiny", "--json"],
    [sys.executable, "experiments/run.py", "--cfg", "job"],
], ids=["audit", "audit-json", "run.py"])
def test_a_reader_that_left_is_no_traceback(argv):
    p = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # `... | true`: the reader is gone before the first line
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert p.returncode in (0, 141), (p.returncode, err)
