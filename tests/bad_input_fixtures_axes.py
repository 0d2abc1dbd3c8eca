"""The files the "Fourth catalogue: axes, numbers and crashes" rows of docs/bad-input.md name: an allocation whose
latency quantum is 1e-300 ms, an allocation file with latencies to compare, a file where a directory belongs, a path
whose one name is longer than any file system allows, and a W&B tag of 100 characters. Every name starts with
``ax_``; the whole set costs a few KB."""

from __future__ import annotations

import json
from pathlib import Path

LATENCY_ALLOCATION = {  # two targets with per-candidate latencies (tests/commands/test_align_latency.py's shape)
    "budget": 2000, "latency_budget_ms": 2.0, "latency_fixed_ms": 0.45, "window": 2,
    "targets": [
        {"name": "lo", "d_star": 100.0, "score": 0.1, "params_per_dim": 10, "d_max": 4096,
         "latency_ms": {"88": 0.5, "96": 0.6, "104": 0.7, "112": 0.8}},
        {"name": "hi", "d_star": 100.0, "score": 5.0, "params_per_dim": 10, "d_max": 4096,
         "latency_ms": {"88": 0.5, "96": 0.6, "104": 1.5, "112": 0.8}},
    ],
}


def axes_files(T: Path) -> None:
    """Every input of the "Fourth catalogue: axes, numbers and crashes" rows, under ``T``."""
    (T / "ax_alloc_quantum.json").write_text(json.dumps({**LATENCY_ALLOCATION, "latency_quantum_ms": 1e-300}))
    (T / "ax_a_file").write_text("not a directory\n")
