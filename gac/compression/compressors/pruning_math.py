"""Pure tensor math for structured pruning of a gated MLP (gate/up rows and down columns pruned together)."""

from __future__ import annotations

import torch

from gac.errors import GacError


def channel_order(energy: torch.Tensor, name: str = "mlp") -> torch.Tensor:
    """Channel indices, most important first (ties broken by index, so the order is deterministic)."""
    if energy.ndim != 1:
        raise GacError(f"{name}: channel importance must be 1-D, got shape {tuple(energy.shape)}")
    if not torch.isfinite(energy).all():
        raise GacError(f"{name}: NaN or inf in the channel importance; calibration produced non-finite values")
    idx = torch.arange(energy.numel())
    # stable sort on (-energy, index)
    order = sorted(idx.tolist(), key=lambda i: (-float(energy[i]), i))
    return torch.tensor(order, dtype=torch.long)


def kept_channels(order: torch.Tensor, width: int) -> torch.Tensor:
    """The ``width`` most important channels, in their original order (so the pruned MLP keeps channel order)."""
    if not 1 <= width <= order.numel():
        raise GacError(f"MLP width {width} outside 1..{order.numel()}")
    return order[:width].sort().values


def prune_rows(W: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return W.index_select(0, keep.to(W.device))


def prune_cols(W: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return W.index_select(1, keep.to(W.device))
