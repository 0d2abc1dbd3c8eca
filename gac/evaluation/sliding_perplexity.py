"""Sliding-window perplexity (``stride``): the protocol of the GAC authors' ASVD script and of Hugging Face's guide.

Not gac's default (:mod:`gac.evaluation.perplexity`: non-overlapping windows, the compression papers' protocol).
Windows of ``seq_len`` tokens start every ``stride`` tokens (the authors: ``stride = seq_len // 2``); a window
scores only the tokens the previous window did not reach (the first window: all but its first token), each with the
window's context before it; the last window ends at the text's end (nothing is dropped). Perplexity is ``exp`` of the
*unweighted* mean of the windows' mean losses, as the authors compute it (``torch.exp(torch.stack(nlls).mean())``),
so the last, shorter window weighs as much as a full one::

    ppl = exp( (1 / W) sum_w  mean_{t in scored(w)} -log p(x_t | x_{begin_w .. t-1}) )

``stride = seq_len`` is *not* gac's default protocol: it keeps the text's tail as a last short window and averages
window means. ``token_weighted=True`` gives ``exp`` of the mean over all scored tokens instead (the usual definition).
"""

from __future__ import annotations

import math
import time

from gac.errors import GacError
from gac.evaluation.perplexity import _model_device, resolve_seq_len, wrecked_warning
from gac.progress import progress


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
    device = torch.device(device) if device is not None else _model_device(model)
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
