"""Perplexity with the protocol of the compression papers (GPTQ, SparseGPT, ASVD, SVD-LLM, PaLU).

WikiText-2 (``wikitext-2-raw-v1``) test split, rows joined with ``"\\n\\n"``, tokenized once; the token stream is cut
into non-overlapping windows of ``seq_len`` tokens (default 2048; the tail shorter than a window is dropped); each
window is scored on its own (no context carried over), every position but the first predicting the next token.
Perplexity is ``exp`` of the mean token negative log-likelihood over all scored tokens::

    ppl = exp( sum_w sum_{t=1}^{L-1} -log p(x_{w,t} | x_{w,<t}) / (n_windows * (L - 1)) )

which equals the papers' ``exp(sum_w loss_w * L / (n_windows * L))`` with ``loss_w`` the mean loss of window ``w``.
"""

from __future__ import annotations

import logging
import math
import os
import time

from gac.errors import GacError
from gac.progress import progress

log = logging.getLogger(__name__)

DEFAULT_SEQ_LEN = 2048


def model_max_length(model) -> int | None:
    """The longest sequence the model accepts (``config.max_position_embeddings``), or None when it does not say."""
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def resolve_seq_len(model, seq_len: int | None, what: str = "seq_len") -> int:
    """``seq_len`` checked against the model's maximum; ``None`` means 2048 capped at that maximum."""
    limit = model_max_length(model)
    if seq_len is None:
        seq_len = DEFAULT_SEQ_LEN if limit is None else min(DEFAULT_SEQ_LEN, limit)
        if limit is not None and limit < DEFAULT_SEQ_LEN:
            log.info("%s defaults to %d, the model's maximum (the protocol's %d is longer)", what, seq_len,
                     DEFAULT_SEQ_LEN)
        return seq_len
    seq_len = int(seq_len)
    if seq_len < 2:
        raise GacError(f"{what}={seq_len} is too short; use at least 2 tokens (the protocol uses 2048)")
    if limit is not None and seq_len > limit:
        raise GacError(
            f"{what}={seq_len} is above the model's maximum sequence length ({limit}, config.max_position_embeddings); "
            f"use {what} <= {limit}"
        )
    return seq_len


def _model_device(model):
    import torch

    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


#: at most this many logits (batch x seq_len x vocab) per forward: a batch of 8 windows of 2048 tokens over a 49k
#: vocabulary (smollm2) is 3.2 GB of fp32 logits, and on a CPU it ran 2.5x slower than one window at a time (3 min
#: 25 s against 1 min 21 s for 13 windows); the sum of the NLL does not depend on the batch
LOGITS_BUDGET = 1 << 26


def perplexity_batch(batch_size: int, seq_len: int, vocab_size: int | None) -> int:
    """The windows per forward: ``batch_size``, capped so one forward's logits stay within :data:`LOGITS_BUDGET`."""
    if not vocab_size:
        return batch_size
    return max(1, min(batch_size, LOGITS_BUDGET // (seq_len * int(vocab_size))))


def perplexity_of_ids(model, ids, seq_len: int | None = None, batch_size: int = 1, device=None,
                      max_windows: int | None = None) -> dict:
    """Perplexity of a 1-D token stream ``ids`` under ``model`` (see the module docstring for the protocol).

    ``batch_size`` windows go through the model together, fewer when their logits would exceed
    :data:`LOGITS_BUDGET` (large vocabularies); the result records the batch used."""
    import torch
    import torch.nn.functional as F

    seq_len = resolve_seq_len(model, seq_len)
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    n_text = int(ids.numel())
    n_windows = n_text // seq_len
    if n_windows == 0:
        raise GacError(
            f"the text has {n_text} tokens, fewer than one window of seq_len={seq_len}; use a longer text or a "
            f"smaller seq_len"
        )
    if max_windows is not None:
        n_windows = min(n_windows, int(max_windows))
    if batch_size < 1:
        raise GacError(f"batch_size={batch_size}; use at least 1")
    device = torch.device(device) if device is not None else _model_device(model)
    batch_size = perplexity_batch(batch_size, seq_len, getattr(getattr(model, "config", None), "vocab_size", None))
    windows = ids[: n_windows * seq_len].view(n_windows, seq_len)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    total = 0.0
    t0 = time.perf_counter()
    try:
        with torch.inference_mode(), progress(n_windows, "perplexity", "windows") as bar:
            for i in range(0, n_windows, batch_size):
                x = windows[i : i + batch_size].to(device)
                logits = model(input_ids=x, use_cache=False).logits
                nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                      reduction="sum")
                total += float(nll)
                bar.update(min(i + batch_size, n_windows) - i)
    finally:
        if was_training:
            model.train()
    n_tokens = n_windows * (seq_len - 1)
    nll = total / n_tokens
    return {
        "ppl": math.exp(nll),
        "nll": nll,
        "n_tokens": n_tokens,
        "n_windows": n_windows,
        "seq_len": seq_len,
        "n_text_tokens": n_text,
        "dropped_tokens": n_text - n_windows * seq_len,
        "batch_size": batch_size,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def perplexity(model, tokenizer, text_or_source: str | os.PathLike = "wikitext2", seq_len: int | None = None,
               batch_size: int = 1, device=None, split: str = "test", max_windows: int | None = None) -> dict:
    """Perplexity of ``model`` on a text source or a text.

    ``text_or_source``: a named source (``"wikitext2"``: the hub's wikitext-2-raw-v1; ``"tiny"``: tiny's held-out
    text), a local ``.txt``/``.jsonl``/``.parquet`` path (see :func:`gac.data.load_text`), or the text itself (any
    string containing whitespace that is not an existing file). ``seq_len`` defaults to 2048, capped at the model's
    maximum; a larger explicit value is an error. ``max_windows`` scores only the first windows (quick checks).

    Returns ``ppl``, ``nll`` (mean token NLL, nats), ``n_tokens`` (scored), ``n_windows``, ``seq_len``,
    ``n_text_tokens``, ``dropped_tokens``, ``seconds`` and ``source``.
    """
    from gac.data import load_text, looks_like_source, tokenize_text

    if isinstance(text_or_source, str | os.PathLike) and looks_like_source(text_or_source):
        source = str(text_or_source)
        text = load_text(text_or_source, split)
    elif isinstance(text_or_source, str):
        source, text = "<text>", text_or_source
        if not text.strip():
            raise GacError("the text to score is empty; pass a source name, a file path, or non-empty text")
    else:
        raise GacError(f"text_or_source must be a string or a path, not {type(text_or_source).__name__}")
    seq_len = resolve_seq_len(model, seq_len)
    ids = tokenize_text(tokenizer, text)
    out = perplexity_of_ids(model, ids, seq_len=seq_len, batch_size=batch_size, device=device, max_windows=max_windows)
    from gac.data import is_named_source

    out["source"] = f"{source} ({split})" if is_named_source(source) else source
    log.info("perplexity %.3f over %d windows of %d tokens (%s)", out["ppl"], out["n_windows"], seq_len, out["source"])
    return out
