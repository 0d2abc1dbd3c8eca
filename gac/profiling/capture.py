"""Kernel names captured in a child process, so the calling process never opens a ``torch.profiler`` session.

A profiler session with CUDA activities leaves CUPTI attached after it closes (torch 2.5-2.9 do not tear it down
unless ``TEARDOWN_CUPTI=1``; pytorch issue 144455: 10-20% slower kernels afterwards). A job that captured kernel
names during its dimension sweep would time its latency with CUPTI attached, and only the jobs that measured a
profile would pay for it. :func:`capture_in_child` sends the op specs of :func:`gac.profiling.sweeps.op_of` to
``python -m gac.profiling.capture_child`` on the same device (it inherits ``CUDA_VISIBLE_DEVICES``), which runs each once
under the profiler and answers with the names. A child that cannot start or fails (a GPU in exclusive-process
mode, say) costs the names, never the measurement: the rows keep an empty kernel and a warning says why.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gac.dtypes import dtype_str

log = logging.getLogger(__name__)

CHILD_TIMEOUT_S = 900


def capture_in_child(specs: Sequence[Mapping], device, dtype, timeout: float = CHILD_TIMEOUT_S) -> list[str | None]:
    """The longest kernel of each op spec, measured by a child process on ``device``; ``None`` each on failure."""
    import torch

    request = {"device": str(torch.device(device)), "dtype": dtype_str(dtype), "specs": list(specs)}
    root = str(Path(__file__).resolve().parents[2])  # the child imports this gac, not another one installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        res = subprocess.run([sys.executable, "-m", "gac.profiling.capture_child"], input=json.dumps(request), env=env,
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("kernel names not captured: the child process did not run (%s)", e)
        return [None] * len(specs)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1][:300]
        log.warning("kernel names not captured: the child process failed (exit %d: %s)", res.returncode, tail)
        return [None] * len(specs)
    try:
        names = json.loads(res.stdout.strip().splitlines()[-1])["kernels"]
    except (ValueError, KeyError, IndexError, TypeError):
        log.warning("kernel names not captured: the child process answered %r", res.stdout[-200:])
        return [None] * len(specs)
    if len(names) != len(specs):
        log.warning("kernel names not captured: %d names for %d shapes", len(names), len(specs))
        return [None] * len(specs)
    return names
