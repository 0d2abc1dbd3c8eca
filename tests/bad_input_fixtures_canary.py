"""The files "The canary" rows of docs/bad-input.md name: a sweep directory that already holds something (an earlier
canary's, or a real sweep's), which the canary must not write into. Every name starts with ``can_``."""

from __future__ import annotations

from pathlib import Path


def canary_files(T: Path) -> None:
    """Every input of "The canary" rows, under ``T``."""
    used = T / "can_used_sweep"
    used.mkdir(parents=True, exist_ok=True)
    (used / "sweep-end.md").write_text("# an earlier sweep's report\n")
