"""Models and tokenizers with known outputs, for hand-checked perplexity."""

from __future__ import annotations

import types

import torch


class TableModel(torch.nn.Module):
    """A model with known outputs: the logits at position t are ``table[x_t]`` (a bigram model)."""

    def __init__(self, table: torch.Tensor, max_len: int = 64):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone(), requires_grad=False)
        self.config = types.SimpleNamespace(max_position_embeddings=max_len, vocab_size=table.shape[0])
        self.inputs: list[torch.Tensor] = []

    def forward(self, input_ids, **kwargs):
        self.inputs.append(input_ids.clone())
        return types.SimpleNamespace(logits=self.table[input_ids])


class CharTokenizer:
    """Token id = index of the character in a fixed alphabet (no special tokens)."""

    def __init__(self, alphabet: str):
        self.alphabet = alphabet
        self.index = {c: i for i, c in enumerate(alphabet)}

    def __call__(self, text, return_attention_mask=False, verbose=False):
        return {"input_ids": [self.index[c] for c in text]}
