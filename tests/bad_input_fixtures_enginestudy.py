"""The files the "Aligning for an engine" rows of docs/bad-input.md name: an allocation (``gac align``'s input) of
one MLP width target. Every name starts with ``es_``."""

from __future__ import annotations

import json
from pathlib import Path


def enginestudy_files(T: Path) -> None:
    """Every input of the "Aligning for an engine" rows, under ``T``."""
    target = {"name": "model.layers.0.mlp", "d_star": 1232.4, "score": 1.0, "params_per_dim": 1728, "d_max": 1536}
    (T / "es_alloc.json").write_text(json.dumps({"budget": 1728 * 1232, "targets": [target]}))
