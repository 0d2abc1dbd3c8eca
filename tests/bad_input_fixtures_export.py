"""The files the "Fifth catalogue: export" rows of docs/bad-input.md name: a gac checkpoint of tiny whose layer 0
MLP is pruned to 512 channels and the other layers' are not (per-layer widths: GGUF's deci architecture holds it, a
transformers config does not), and a folder an earlier ``gac export --format hf`` wrote. Every name starts with
``ex_``; the rows also use the bad-store catalogue's low-rank checkpoint ``ck`` and its tampered copy ``ck_swapped``."""

from __future__ import annotations

import json
from pathlib import Path


def pruned_checkpoint(path: Path, layers=(0,), width: int = 512) -> Path:
    """tiny with the MLP of ``layers`` cut to its first ``width`` channels, saved as a gac checkpoint at ``path``."""
    import torch

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.parts import linear_from
    from gac.compression.swap import replace_module
    from gac.models import load_model

    model, tok = load_model("tiny", dtype=torch.float32)
    for i in layers:
        mlp, p = model.model.layers[i].mlp, f"model.layers.{i}.mlp."
        replace_module(model, p + "gate_proj", linear_from(mlp.gate_proj.weight[:width].detach().clone(), None))
        replace_module(model, p + "up_proj", linear_from(mlp.up_proj.weight[:width].detach().clone(), None))
        replace_module(model, p + "down_proj", linear_from(mlp.down_proj.weight[:, :width].detach().contiguous(), None))
    return save_checkpoint(model, tok, path)


def export_files(T: Path) -> None:
    """Every input of the "Fifth catalogue: export" rows, under ``T``."""
    pruned_checkpoint(T / "ex_pruned")
    d = T / "ex_hf_done"  # what --format hf leaves: its note and the HF files
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "gac_export.json").write_text(json.dumps({"format": "hf"}))
