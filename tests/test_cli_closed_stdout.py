"""``gac demo >&-``: with stdout closed every print went nowhere and the command exited 0 (``gac align`` ended in
a traceback). Now one line on stderr and exit code 2, before any work. A catalogue row cannot close stdout, so this
is an ordinary test (a subprocess whose file descriptor 1 is closed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [["demo"], ["align", "no_such_allocation.json"]])
def test_a_closed_stdout_is_refused_in_one_line(argv):
    r = subprocess.run([sys.executable, "-m", "gac.cli", *argv], cwd=ROOT, capture_output=False,
                       stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1),
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith(f"gac {argv[0]}: error: stdout is closed (>&-)"), lines
