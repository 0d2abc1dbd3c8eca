"""The files the "Pruned MoE experts" rows of docs/bad-input.md name: a gac checkpoint of a random-weight Mixtral
whose fused experts (the model's own experts class, narrower) hold 3 experts where its router picks among 4. Every
name starts with ``moef_``."""

from __future__ import annotations

from pathlib import Path


def moefused_files(T: Path) -> None:
    """Every input of the "Pruned MoE experts" rows, under ``T``."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.modules import fused_experts_like
    from gac.compression.swap import replace_module
    from gac.fixtures.tiny import tiny_dir
    from tests.bad_input_fixtures_modelchecks import SMALL

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2))
    name = "model.layers.0.mlp.experts"
    new = fused_experts_like(model.get_submodule(name), 16)
    new.gate_up_proj = nn.Parameter(torch.randn(3, 32, 64) * 0.02)  # 3 experts of width 16, hidden 64
    new.down_proj = nn.Parameter(torch.randn(3, 64, 16) * 0.02)
    replace_module(model, name, new)
    save_checkpoint(model, AutoTokenizer.from_pretrained(str(tiny_dir())), T / "moef_ck_router")
