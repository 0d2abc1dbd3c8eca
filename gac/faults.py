"""Fault injection for tests: make a job die (or wait) at a named stage, deterministically.

Set ``GAC_FAULT=<stage>[:<action>]`` in a job's environment; when the job reaches :func:`fault_point` with that
stage name, the action runs:

* ``kill`` (default): ``SIGKILL`` the own process — what ``kill -9``, an OOM killer or a lost node does;
* ``raise``: raise :class:`InjectedFault` (an ordinary error: the job records a failure);
* ``hold``: create ``$GAC_FAULT_DIR/held-<stage>`` and wait until that file is removed (a test can then look at
  a job that is provably inside the stage, kill it from outside, or let it go on).

Several faults may be given, comma separated (``GAC_FAULT=scoring:hold,record_write``). ``<stage>:<action>@N``
runs the action the N-th time this process reaches the stage (the earlier passes go on): a stage reached after each
item is done, such as ``sensitivity_row``, is interrupted after N items. Stages are named where the
work happens: ``load``, ``calibration``, ``scoring``, ``factorize``, ``plan``, ``apply``, ``ppl``, ``tasks``,
``latency``, ``record_write`` (the record is complete in its temp file but not yet published),
``record_written`` (published, temp file not yet removed), ``prepared_write`` (the prepared-state cache file),
``sensitivity_row`` (a row of ASVD's sensitivity table is saved to its resume file).
Without ``GAC_FAULT`` a fault point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ENV = "GAC_FAULT"
DIR_ENV = "GAC_FAULT_DIR"
ACTIONS = ("kill", "raise", "hold")
_passes: dict[str, int] = {}  # stage -> times this process reached it (for ``@N``)


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault throws."""


def _faults() -> dict[str, str]:
    spec = os.environ.get(ENV, "")
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        stage, _, action = item.partition(":")
        out[stage] = action or "kill"
    return out


def fault_point(stage: str) -> None:
    """Run the fault ``GAC_FAULT`` names for ``stage``, if any (see the module docstring)."""
    if ENV not in os.environ:
        return
    action = _faults().get(stage)
    if action is None:
        return
    action, _, nth = action.partition("@")
    if nth:
        _passes[stage] = _passes.get(stage, 0) + 1
        try:
            n = int(nth)
        except ValueError:
            raise ValueError(f"{ENV}: {stage}:{action}@{nth}: the pass must be a whole number") from None
        if _passes[stage] != n:
            return
    action = action or "kill"
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # never returns: SIGKILL is not deliverable-later
    if action == "raise":
        raise InjectedFault(f"injected fault at stage {stage!r}")
    if action == "hold":
        d = Path(os.environ.get(DIR_ENV) or ".")
        d.mkdir(parents=True, exist_ok=True)
        marker = d / f"held-{stage}"
        marker.write_text(str(os.getpid()))
        while marker.exists():
            time.sleep(0.05)
        return
    raise ValueError(f"{ENV}: unknown action {action!r} for stage {stage!r}; known: {', '.join(ACTIONS)}")
