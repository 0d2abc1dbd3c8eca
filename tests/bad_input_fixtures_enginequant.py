"""The inputs of docs/bad-input.md's "Engines at a quantized type" rows (written by tests/test_bad_input.py's
``_files``)."""

from __future__ import annotations

import json
from pathlib import Path


def enginequant_files(T: Path) -> None:
    """A pruned plan for tiny (per-layer widths), and a Mixtral-layout checkpoint whose two layers' experts were cut
    to different shared widths (32 and 48: no transformers config holds them)."""
    from tests.export.test_hf_moe import _cut_experts

    (T / "eq_pruned.json").write_text(json.dumps({"dims": {f"model.layers.{i}.mlp": 500 for i in range(3)}}))
    _cut_experts("mixtral", [32, 48], T / "eq_moe_layers")
