"""The inputs of docs/bad-input.md's "Engines as an axis" rows (written by tests/test_bad_input.py's ``_files``)."""

from __future__ import annotations

import json
from pathlib import Path


def engineaxis_files(T: Path) -> None:
    """A low-rank plan for tiny (ASVD's factors: no GGUF tensor holds them) and a pruned one (per-layer widths)."""
    (T / "ea_lowrank.json").write_text(json.dumps({"dims": {"model.layers.0.self_attn.q_proj": 64}}))
    (T / "ea_pruned.json").write_text(json.dumps({"dims": {f"model.layers.{i}.mlp": 500 for i in range(3)}}))
