"""The layer swap every compressor uses: :func:`replace_module` puts a compressed module where the original was and
guards the model's ``save_pretrained`` (:func:`gac.compression.checkpoint.guard_save_pretrained`), so a model gac
changed saves a gac checkpoint, never a folder transformers reloads with random weights. The bare swap, without
the guard, is :func:`gac.compression.modules.set_module`."""

from __future__ import annotations

from torch import nn

from gac.compression.checkpoint import guard_save_pretrained
from gac.compression.modules import set_module


def replace_module(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Swap the module at dotted path ``name`` for ``new``; return the old one. Every compressor swaps through here,
    so a model gac changed saves a gac checkpoint, never a folder transformers reloads with random weights."""
    old = set_module(model, name, new)
    guard_save_pretrained(model)
    return old
