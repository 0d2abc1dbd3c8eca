"""Perplexity with the protocol of the compression papers (GPTQ, SparseGPT, ASVD, SVD-LLM, PaLU).

WikiText-2 (``wikitext-2-raw-v1``) test split, rows joined with ``"\\n\\n"``, tokenized once; the token stream is cut
into non-overlapping windows of ``seq_len`` tokens (default 2048; the tail shorter than a window is dropped); each
window is scored on its own (no context carried over), every position but the first predicting the next token.
Perplexity is ``exp`` of the mean token negative log-likelihood over all scored tokens::

    ppl = exp( sum_w sum_{t=1}^{L-1} -log p(x_{w,t} | x_{w,<t}) / (n_windows * (L - 1)) )

which equals the papers' ``exp(sum_w loss_w * L / (n_windows * L))`` with ``loss_w`` the mean loss of window ``w``.

Memory. The logits of a batch are ``batch x seq_len x vocab``: 8 x 2048 x 128k in float32 with their log-softmax is
~21 GB beside Llama-3-8B's 16 GB of weights. For the causal LMs whose head is a plain ``lm_head`` on the decoder's
last hidden state (Llama, Mistral, Qwen2/3, gac's compressed checkpoints of them) the decoder runs on the whole
batch and the head and the loss run on at most :data:`LOSS_CHUNK_BYTES` of float32 logits at a time; any other
model is scored one window at a time. Both give the sum the unchunked formula gives (up to float rounding).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time

# LOSS_CHUNK_BYTES: float32 logits scored at once (their log-softmax and gradient-free temporaries beside), defined
# with the job's memory estimate, which counts it
from gac.compression.footprint import LOSS_CHUNK_BYTES
from gac.devices import model_device
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


LOGITS_BUDGET = 1 << 26


def perplexity_batch(batch_size: int, seq_len: int, vocab_size: int | None) -> int:
    """The windows per forward: ``batch_size``, capped so one forward's logits stay within :data:`LOGITS_BUDGET`."""
    if not vocab_size:
        return batch_size
    return max(1, min(batch_size, LOGITS_BUDGET // (seq_len * int(vocab_size))))


def _plain_head(model):
    """``(decoder, head)`` when the model's logits are its family's tail over ``decoder(ids).last_hidden_state``
    (``head`` applies the lm_head and the family's logit transform: gac.compression.layouts), else None (a family
    gac has no layout for is scored window by window through the model's own forward)."""
    from gac.compression.discovery import text_config
    from gac.compression.layouts import family_of, logit_transform, transform_logits

    cfg = getattr(model, "config", None)
    try:
        fam = family_of(cfg)
    except GacError:
        return None
    get_dec, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_dec is None or get_head is None:
        return None
    try:
        dec, head = get_dec(), get_head()
    except Exception:  # noqa: BLE001 - an unusual model: score it window by window
        return None
    if dec is None or head is None:
        return None
    kind, value = logit_transform(fam, model, text_config(cfg))
    if kind == "none":
        return dec, head
    return dec, lambda h: transform_logits(head(h), kind, value)


def _nll_chunks(head, hidden, targets, chunk_tokens: int):
    """Sum of the token NLLs of ``head(hidden)`` against ``targets``, ``chunk_tokens`` rows of logits at a time."""
    import torch.nn.functional as F

    total = None
    for a in range(0, hidden.shape[0], chunk_tokens):
        logits = head(hidden[a : a + chunk_tokens]).float()
        t = targets[a : a + chunk_tokens]  # on the head's device (a model spread over devices ends elsewhere)
        nll = F.cross_entropy(logits, t.to(logits.device), reduction="sum").double()
        total = nll if total is None else total + nll
        del logits
    return total


def window_nll(model, x, chunk_tokens: int | None = None):
    """Summed next-token NLL (float64 tensor) of the windows ``x`` ([batch, L]); see the module docstring (memory).

    ``chunk_tokens``: logit rows per chunk (None: as many as fit in :data:`LOSS_CHUNK_BYTES` in float32)."""
    import torch

    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 32000)
    chunk = int(chunk_tokens) if chunk_tokens else max(1, LOSS_CHUNK_BYTES // (4 * vocab))
    targets = x[:, 1:]
    plain = _plain_head(model)
    if plain is not None:
        dec, head = plain
        h = dec(input_ids=x, use_cache=False).last_hidden_state[:, :-1]
        return _nll_chunks(head, h.reshape(-1, h.shape[-1]), targets.reshape(-1), chunk)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for row in range(x.shape[0]):  # one window at a time: [L, vocab] logits at most
        logits = model(input_ids=x[row : row + 1], use_cache=False).logits[0, :-1]
        total = total + _nll_chunks(lambda t: t, logits, targets[row], chunk).to(total.device)
        del logits
    return total


def perplexity_of_ids(model, ids, seq_len: int | None = None, batch_size: int = 1, device=None,
                      max_windows: int | None = None, chunk_tokens: int | None = None) -> dict:
    """Perplexity of a 1-D token stream ``ids`` under ``model`` (see the module docstring for the protocol).
    ``chunk_tokens``: logit rows scored at once (None: :data:`LOSS_CHUNK_BYTES` worth)."""
    import torch

    seq_len = resolve_seq_len(model, seq_len)
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    n_text = int(ids.numel())
    n_windows = n_text // seq_len
    if n_windows == 0:
        raise GacError(
            f"the text has {n_text} tokens, fewer than one window of seq_len={seq_len}; use a longer text or a "
            f"smaller seq_len"
        )
    n_windows_total = n_windows
    if max_windows is not None:
        if int(max_windows) < 1:
            raise GacError(f"max_windows={max_windows}; use at least 1 (None scores the whole text)")
        n_windows = min(n_windows, int(max_windows))
    if batch_size < 1:
        raise GacError(f"batch_size={batch_size}; use at least 1")
    device = torch.device(device) if device is not None else model_device(model)
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
                total += float(window_nll(model, x, chunk_tokens=chunk_tokens))
                bar.update(min(i + batch_size, n_windows) - i)
    finally:
        if was_training:
            model.train()
    n_tokens = n_windows * (seq_len - 1)
    nll = total / n_tokens
    ppl = math.exp(nll) if nll < math.log(sys.float_info.max) else math.inf
    out = {
        "ppl": ppl,
        "nll": nll,
        "n_tokens": n_tokens,
        "n_windows": n_windows,
        "n_windows_total": n_windows_total,
        "seq_len": seq_len,
        "n_text_tokens": n_text,
        "dropped_tokens": n_text - n_windows * seq_len,
        "batch_size": batch_size,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    warning = wrecked_warning(ppl, getattr(getattr(model, "config", None), "vocab_size", None))
    if warning:
        out["warning"] = warning
        log.warning("%s", warning)
    return out


def wrecked_warning(ppl: float, vocab_size: int | None) -> str | None:
    """A perplexity above the vocabulary size is worse than guessing every token uniformly at random (whose
    perplexity is exactly the vocabulary size): the model no longer models the text, whatever else it scores.
    Returns the one-line warning the log, the record (``evaluation.perplexity.warning``) and the reports carry."""
    if not vocab_size or not (ppl > vocab_size):
        return None
    return (f"perplexity {ppl:.4g} is above the vocabulary size ({vocab_size}), worse than a uniform guess over it: "
            f"the model is wrecked, so its task scores and speed compare with nothing")


# Sliding-window perplexity (``stride``): the protocol of the GAC authors' ASVD script and of Hugging Face's guide.
#
# Not gac's default (``perplexity_of_ids``: non-overlapping windows, the compression papers' protocol).
# Windows of ``seq_len`` tokens start every ``stride`` tokens (the authors: ``stride = seq_len // 2``); a window
# scores only the tokens the previous window did not reach (the first window: all but its first token), each with the
# window's context before it; the last window ends at the text's end (nothing is dropped). Perplexity is ``exp`` of the
# *unweighted* mean of the windows' mean losses, as the authors compute it (``torch.exp(torch.stack(nlls).mean())``),
# so the last, shorter window weighs as much as a full one::
#
#     ppl = exp( (1 / W) sum_w  mean_{t in scored(w)} -log p(x_t | x_{begin_w .. t-1}) )
#
# ``stride = seq_len`` is *not* gac's default protocol: it keeps the text's tail as a last short window and averages
# window means. ``token_weighted=True`` gives ``exp`` of the mean over all scored tokens instead (the usual definition).


def check_stride(stride, seq_len: int) -> int:
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= seq_len:
        raise GacError(f"perplexity stride={stride!r} must be a whole number of tokens in 1..seq_len ({seq_len}); "
                       f"the GAC authors' script uses seq_len // 2")
    return stride


def sliding_windows(n_tokens: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, scored)`` of each window: tokens ``[begin, end)``, its last ``scored`` positions scored."""
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + seq_len, n_tokens)
        out.append((begin, end, min(end - prev_end, end - begin - 1)))
        prev_end = end
        if end == n_tokens:
            break
    return out


def sliding_perplexity_of_ids(model, ids, seq_len: int | None = None, stride: int | None = None, device=None,
                              token_weighted: bool = False, max_windows: int | None = None) -> dict:
    """Sliding-window perplexity of a 1-D token stream (module docstring); ``stride`` defaults to ``seq_len // 2``."""
    import torch
    import torch.nn.functional as F

    seq_len = resolve_seq_len(model, seq_len)
    stride = check_stride(seq_len // 2 if stride is None else stride, seq_len)
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    n_text = int(ids.numel())
    if n_text < 2:
        raise GacError(f"the text has {n_text} tokens; perplexity needs at least 2")
    windows = [w for w in sliding_windows(n_text, seq_len, stride) if w[2] > 0]
    if max_windows is not None:
        if int(max_windows) < 1:
            raise GacError(f"max_windows={max_windows}; use at least 1 (None scores the whole text)")
        windows = windows[: int(max_windows)]
    device = torch.device(device) if device is not None else model_device(model)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    means, total, n_tok = [], 0.0, 0
    t0 = time.perf_counter()
    try:
        with torch.inference_mode(), progress(len(windows), "perplexity", "windows") as bar:
            for begin, end, scored in windows:
                x = ids[begin:end].to(device)[None]
                logits = model(input_ids=x, use_cache=False).logits[0, -scored - 1 : -1].float()
                nll = F.cross_entropy(logits, x[0, -scored:], reduction="sum").double().item()
                means.append(nll / scored)
                total += nll
                n_tok += scored
                bar.update(1)
    finally:
        if was_training:
            model.train()
    nll = total / n_tok if token_weighted else math.fsum(means) / len(means)
    ppl = math.exp(nll) if nll < 700 else math.inf
    out = {"ppl": ppl, "nll": nll, "n_tokens": n_tok, "n_windows": len(windows), "seq_len": seq_len,
           "stride": stride, "token_weighted": bool(token_weighted), "n_text_tokens": n_text, "dropped_tokens": 0,
           "seconds": round(time.perf_counter() - t0, 3)}
    warning = wrecked_warning(ppl, getattr(getattr(model, "config", None), "vocab_size", None))
    if warning:
        out["warning"] = warning
    return out


def perplexity(model, tokenizer, text_or_source: str | os.PathLike = "wikitext2", seq_len: int | None = None,
               batch_size: int = 1, device=None, split: str = "test", max_windows: int | None = None,
               stride: int | None = None) -> dict:
    """Perplexity of ``model`` on a text source or a text.

    ``text_or_source``: a named source (``"wikitext2"``: the hub's wikitext-2-raw-v1; ``"tiny"``: tiny's held-out
    text), a local ``.txt``/``.jsonl``/``.parquet`` path (see :func:`gac.text.load_text`), or the text itself (any
    string containing whitespace that is not an existing file). ``seq_len`` defaults to 2048, capped at the model's
    maximum; a larger explicit value is an error. ``max_windows`` scores only the first windows (quick checks).
    ``stride``: None (default) is the protocol above; a number of tokens scores overlapping windows that start every
    ``stride`` tokens instead (:mod:`gac.evaluation.perplexity`, the GAC authors' script: ``seq_len // 2``;
    ``batch_size`` does not apply; the result adds ``stride``).

    Returns ``ppl``, ``nll`` (mean token NLL, nats), ``n_tokens`` (scored), ``n_windows``, ``seq_len``,
    ``n_text_tokens``, ``dropped_tokens``, ``seconds`` and ``source``.
    """
    from gac.text import load_text, looks_like_source, tokenize_text

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
    if stride is not None:
        out = sliding_perplexity_of_ids(model, ids, seq_len=seq_len, stride=stride, device=device,
                                        max_windows=max_windows)
    else:
        out = perplexity_of_ids(model, ids, seq_len=seq_len, batch_size=batch_size, device=device,
                                max_windows=max_windows)
    from gac.text import is_named_source

    out["source"] = f"{source} ({split})" if is_named_source(source) else source
    log.info("perplexity %.3f over %d windows of %d tokens (%s)", out["ppl"], out["n_windows"], seq_len, out["source"])
    return out
