"""Table 5 as the GAC authors ran it, re-implemented independently of gac (a reference for the parity tests).

Written from the authors' scripts in ``JihaoXin/GAC`` (commit 2b0a2a4): ``scripts/asvd_gac_experiment.py`` (the
"ASVD" rows and the "GAC DP" strategy), ``scripts/llmpruner_gac_experiment.py`` and ``scripts/eval_llmpruner_r8.py``
(the LLM-Pruner bars). Nothing here imports gac; it uses plain torch. What the script does, step by step:

1. **Sensitivity** (:func:`layer_sensitivity`): for every ``nn.Linear`` of the model (``lm_head`` included) the
   stable-rank score ``sqrt(||W||_F^2 / (||W||_2^2 + 1e-8))``, in float32, times ``(1 - p)`` for each kept
   parameter ratio ``p`` of the grid 0.4 ... 0.9. No calibration data, no activations: this is not ASVD's
   perplexity table, although the script's rows are labelled "ASVD".
2. **Ideal ranks** (:func:`ideal_ranks`): ASVD's binary search over the cut of the (Linear, ratio, score) list
   sorted by score descending; each Linear keeps its smallest accepted ratio, 1.0 when none. The kept ratio is
   counted nominally (``sum numel * p / sum numel`` over *every* Linear, ``lm_head`` included) and the loop ends at
   the first cut whose ratio is above the target. The rank of a projection is ``max(1, int(numel * p) // (in +
   out))``; at ``p = 1`` that is the break-even rank, and the projection is still factorised (nothing stays dense).
   ``lm_head`` takes part in the search but is never compressed.
3. **Fisher** (:func:`fisher_from_sensitivity`): the largest score of a projection's row, i.e. its score at 0.4.
4. **Budget**: the parameter cost ``sum r * (in + out)`` of the ideal ranks (not ``(1 - ratio) * |W|``).
5. **GAC DP** (:func:`gac_dp`): a multiple-choice knapsack whose value is ``fisher * (r - ideal)`` in rank units;
   candidates are the multiples of 8 within +-3 units of ``round(ideal / 8) * 8`` (Python's half-to-even ``round``),
   in ``[8, min(in, out)]``; the budget is quantised to units of ``8 * min(in + out)`` with each candidate's cost
   floored to whole units; the solution is the largest reachable budget cell (within 10 cells of the budget, else
   any), then one pass that steps the least sensitive projections down by 8 while over budget and one pass that
   steps the most sensitive up by 8 while the exact cost fits. Above 500,000 cells it falls back to
   :func:`round_to_n`. One pass down need not reach the budget: the result can exceed it (``gac_dp`` says so in its
   ``info``).
6. **round_to_n** (:func:`round_to_n`, the script's "aligned_8" baseline and the DP's fallback): each rank to the
   nearest multiple of 8 (half to even, at least 8, at most ``min(in, out)``), then round-robin passes stepping the
   least sensitive down by 8 until the budget holds, then passes stepping the most sensitive up while it fits.
7. **Compression** (:func:`svd_compress`): a plain truncated SVD of each projection in float32 (no activation
   scaling), ``sqrt(S)`` into each factor, cast to the weight's dtype.
8. **Perplexity** (:func:`sliding_ppl`): windows of ``seq_len`` tokens starting every ``seq_len // 2`` tokens; each
   window's loss is the mean NLL of its tokens not scored by the previous window (the first window: all but its first
   token); ``exp`` of the *unweighted* mean of the window losses; the last window ends at the text's end.
9. **PiQA / HellaSwag** (:func:`accuracy`): the first ``limit`` (200) items; PiQA scores ``goal + " " + sol`` by the
   summed log-probability of all its tokens after the first; HellaSwag by the mean log-probability of the ending's
   tokens (the tokens after ``len(tokenizer(ctx))``); ``eval_llmpruner_r8.py`` scores HellaSwag like PiQA instead
   (``hellaswag="full_sum"``). The first best choice wins ties.

**What is generalised** from the script's Llama-3-8B constants, so the same functions run on tiny and smollm2:

* ``NUM_LAYERS`` / ``PROJ_SHAPES`` (32 layers, 4096 / 1024 / 14336 shapes): read from the model
  (:func:`projection_shapes`: ``(out, in)`` of each projection of each decoder layer, keyed ``(layer, proj)``); the
  script's ``PROJ_SHAPES[proj]`` is one shape per projection name, which is the same thing for a uniform model.
* ``load_model`` (fp16, ``device_map="cpu"``), the moves between CPU and GPU and ``torch.cuda`` calls: dropped; the
  functions take a loaded model and work on its device and dtype (the script casts the factors to fp16, the dtype
  it loads; here the weight's own dtype).
* WikiText-2 and the hub's PiQA / HellaSwag: the functions take the token ids / the items (lists of dicts with the
  hub's field names), so local look-alike files work too; the script joins WikiText-2's test rows with blank lines
  and tokenizes them once, which the caller does.
* The layer index is parsed from the module name's third field (``model.layers.<i>....``) as in the script; any other
  Linear (``lm_head``) only takes part in the search.
"""

from __future__ import annotations

import torch
from torch import nn

GRID = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ATTN_PROJS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJS = ("gate_proj", "up_proj", "down_proj")
ALL_PROJS = ATTN_PROJS + MLP_PROJS
DP_CELL_LIMIT = 500_000


# ------------------------------------------------------------------------------------------------- shapes and keys
def _key(name: str):
    """``(layer, proj)`` of ``model.layers.<i>.<block>.<proj>``, or None (the script's parse)."""
    parts = name.split(".")
    try:
        layer = int(parts[2])
    except (ValueError, IndexError):
        return None
    return (layer, parts[-1]) if parts[-1] in ALL_PROJS else None


def projection_shapes(model) -> dict:
    """``{(layer, proj): (out, in)}`` for every projection of the decoder layers (replaces ``PROJ_SHAPES``)."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            k = _key(name)
            if k is not None:
                out[k] = (mod.out_features, mod.in_features)
    return out


def num_layers(model) -> int:
    return len(model.model.layers)


# ------------------------------------------------------------------------------------------------- steps 1 to 3
@torch.no_grad()
def stable_rank(w: torch.Tensor) -> float:
    """``sqrt(||W||_F^2 / (||W||_2^2 + 1e-8))`` in float32, as the script computes it."""
    w = w.data.float()
    w_fro = torch.norm(w, p="fro") ** 2
    try:
        spectral = torch.linalg.svdvals(w)[0]
    except Exception:  # noqa: BLE001 - the script's fallback
        spectral = torch.norm(w, p=2)
    return ((w_fro / (spectral**2 + 1e-8)) ** 0.5).item()


@torch.no_grad()
def layer_sensitivity(model, grid=GRID) -> dict:
    """``{linear name: {p: stable_rank * (1 - p)}}`` over every nn.Linear, in ``named_modules`` order."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            sr = stable_rank(module.weight)
            out[name] = {p: sr * (1 - p) for p in grid}
    return out


def _linear_info(model) -> dict:
    return {name: (m.in_features, m.out_features, m.weight.numel())
            for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def kept_ratios(model, sensitivity: dict, target_ratio: float) -> dict:
    """The binary search: ``{linear name: kept ratio}`` (1.0 where no entry is accepted)."""
    info = _linear_info(model)
    entries = [(ln, p, s) for ln, v in sensitivity.items() for p, s in v.items() if p < 1]
    entries = sorted(entries, key=lambda x: -x[2])

    def ratios(m):
        r = {ln: 1.0 for ln in sensitivity}
        for ln, p, _ in entries[m:]:
            r[ln] = min(r[ln], p)
        return r

    low, high = 0, len(entries) - 1
    while low < high:
        mid = (low + high) // 2
        tot = comp = 0
        for ln, p in ratios(mid).items():
            if ln in info:
                tot += info[ln][2]
                comp += info[ln][2] * p
        now = comp / tot if tot > 0 else 1.0
        if now > target_ratio:
            high = mid
        else:
            low = mid + 1
    return ratios(low)


def ideal_ranks(model, sensitivity: dict, target_ratio: float) -> dict:
    """``{(layer, proj): rank}``, ``rank = max(1, int(numel * p) // (in + out))``."""
    info = _linear_info(model)
    out = {}
    for ln, p in kept_ratios(model, sensitivity, target_ratio).items():
        if ln not in info:
            continue
        in_f, out_f, n = info[ln]
        k = _key(ln)
        if k is not None:
            out[k] = max(1, int(n * p) // (in_f + out_f))
    return out


def fisher_from_sensitivity(sensitivity: dict) -> dict:
    out = {}
    for ln, v in sensitivity.items():
        k = _key(ln)
        if k is not None:
            out[k] = max(v.values()) if v else 0
    return out


def param_cost(ranks: dict, shapes: dict) -> int:
    return sum(r * sum(shapes[k]) for k, r in ranks.items())


# ------------------------------------------------------------------------------------------------- steps 5 and 6
def round_to_n(base: dict, fisher: dict, budget: int, shapes: dict, n: int = 8) -> dict:
    ranks = {}
    for k, r in base.items():
        ranks[k] = min(max(n, round(r / n) * n), min(shapes[k]))
    total = param_cost(ranks, shapes)
    asc = sorted(ranks.keys(), key=lambda k: fisher.get(k, 0))
    desc = list(reversed(asc))
    while total > budget:
        reduced = False
        for k in asc:
            if ranks[k] > n:
                ranks[k] -= n
                total -= n * sum(shapes[k])
                reduced = True
                if total <= budget:
                    break
        if not reduced:
            break
    while True:
        added = False
        for k in desc:
            cost = n * sum(shapes[k])
            if ranks[k] + n <= min(shapes[k]) and total + cost <= budget:
                ranks[k] += n
                total += cost
                added = True
        if not added:
            break
    return ranks


def gac_dp(base: dict, fisher: dict, budget: int, shapes: dict, n_layers: int, align: int = 8,
           radius: int = 3) -> tuple[dict, dict]:
    """The script's ``strategy_gac_dp``; returns ``(ranks, info)`` (``info``: which path, and the budget outcome)."""
    projs = []
    for layer in range(n_layers):
        for proj in ALL_PROJS:
            key = (layer, proj)
            if key not in base:
                continue
            ideal = base[key]
            m, n = shapes[key]
            max_rank, unit_cost = min(m, n), m + n
            ideal_aligned = round(ideal / align) * align
            cands = [ideal_aligned + o * align for o in range(-radius, radius + 1)
                     if align <= ideal_aligned + o * align <= max_rank]
            if not cands:
                cands = [max(align, min(max_rank, ideal_aligned))]
            projs.append({"key": key, "ideal": ideal, "fisher": fisher.get(key, 1.0), "cands": cands, "uc": unit_cost})
    budget_unit = align * min(p["uc"] for p in projs)
    B = budget // budget_unit + 2
    if B > DP_CELL_LIMIT:
        ranks = round_to_n(base, fisher, budget, shapes, align)
        return ranks, {"path": "greedy", "cells": B, "over_budget": param_cost(ranks, shapes) > budget}
    NEG = float("-inf")
    dp = [NEG] * (B + 1)
    dp[0] = 0.0
    choice = [[None] * (B + 1) for _ in projs]
    for i, p in enumerate(projs):
        new = [NEG] * (B + 1)
        for c in p["cands"]:
            val = p["fisher"] * (c - p["ideal"])
            cu = (c * p["uc"]) // budget_unit
            if cu > B:
                continue
            for b in range(cu, B + 1):
                prev = b - cu
                if dp[prev] > NEG and dp[prev] + val > new[b]:
                    new[b] = dp[prev] + val
                    choice[i][b] = c
        dp = new
    max_b = budget // budget_unit
    best = next((b for b in range(min(max_b, B), max(0, max_b - 10), -1) if dp[b] > NEG), None)
    if best is None:
        best = next((b for b in range(min(max_b, B), -1, -1) if dp[b] > NEG), None)
    if best is None:
        ranks = round_to_n(base, fisher, budget, shapes, align)
        return ranks, {"path": "greedy", "cells": B, "over_budget": param_cost(ranks, shapes) > budget}
    ranks = {}
    b = best
    for i in range(len(projs) - 1, -1, -1):
        c = choice[i][b]
        if c is None:
            c = projs[i]["cands"][len(projs[i]["cands"]) // 2]
        ranks[projs[i]["key"]] = c
        b -= (c * projs[i]["uc"]) // budget_unit
    actual = param_cost(ranks, shapes)
    steps_down = 0
    if actual > budget:
        for k in sorted(ranks.keys(), key=lambda k: fisher.get(k, 0)):
            if actual <= budget:
                break
            if ranks[k] > align:
                ranks[k] -= align
                actual -= align * sum(shapes[k])
                steps_down += 1
    for k in sorted(ranks.keys(), key=lambda k: fisher.get(k, 0), reverse=True):
        cost = align * sum(shapes[k])
        if ranks[k] + align <= min(shapes[k]) and actual + cost <= budget:
            ranks[k] += align
            actual += cost
    return ranks, {"path": "dp", "cells": B, "best_cell": best, "steps_down": steps_down,
                   "over_budget": actual > budget}


# ------------------------------------------------------------------------------------------------- step 7
class SimpleSVDLinear(nn.Module):
    def __init__(self, U, V, bias=None):
        super().__init__()
        self.u_proj = nn.Linear(U.shape[1], U.shape[0], bias=bias is not None, dtype=U.dtype, device=U.device)
        self.v_proj = nn.Linear(V.shape[1], V.shape[0], bias=False, dtype=V.dtype, device=V.device)
        self.u_proj.weight.data = U.contiguous()
        self.v_proj.weight.data = V.contiguous()
        if bias is not None:
            self.u_proj.bias.data = bias

    def forward(self, x):
        return self.u_proj(self.v_proj(x))


@torch.no_grad()
def svd_compress(model, ranks: dict) -> None:
    """Replace each projection in ``ranks`` by its truncated SVD, in place."""
    for i, layer in enumerate(model.model.layers):
        for name, mod in list(layer.named_modules()):
            if not isinstance(mod, nn.Linear):
                continue
            key = (i, name.split(".")[-1])
            if key not in ranks:
                continue
            W = mod.weight.data.float()
            U, S, Vt = torch.linalg.svd(W, full_matrices=False)
            r = min(ranks[key], S.shape[0])
            s = torch.sqrt(S[:r])
            dt = mod.weight.dtype
            new = SimpleSVDLinear((U[:, :r] * s.unsqueeze(0)).to(dt), (s.unsqueeze(1) * Vt[:r]).to(dt),
                                  mod.bias.data.clone() if mod.bias is not None else None)
            parts = name.split(".")
            parent = layer
            for p in parts[:-1]:
                parent = getattr(parent, p)
            setattr(parent, parts[-1], new)


# ------------------------------------------------------------------------------------------------- steps 8 and 9
@torch.no_grad()
def sliding_ppl(model, input_ids: torch.Tensor, seq_len: int = 2048, stride: int | None = None) -> float:
    """The script's ``eval_ppl`` on ``input_ids`` ([1, N]); ``stride`` defaults to ``seq_len // 2``."""
    stride = seq_len // 2 if stride is None else stride
    dev = next(model.parameters()).device
    total = input_ids.size(1)
    nlls = []
    prev_end = 0
    for begin in range(0, total, stride):
        end = min(begin + seq_len, total)
        trg_len = end - prev_end
        ids = input_ids[:, begin:end].to(dev)
        target = ids.clone()
        target[:, :-trg_len] = -100
        nlls.append(model(ids, labels=target).loss)
        prev_end = end
        if end == total:
            break
    return torch.exp(torch.stack(nlls).mean()).item()


@torch.no_grad()
def _logprobs(model, ids):
    return torch.nn.functional.log_softmax(model(ids, use_cache=False).logits[0].float(), dim=-1)


@torch.no_grad()
def accuracy(model, tokenizer, piqa=None, hellaswag=None, limit: int = 200, hellaswag_score: str = "ending_mean") -> dict:
    """Accuracy on the first ``limit`` items of PiQA (``goal``, ``sol1``, ``sol2``, ``label``) and HellaSwag
    (``ctx``, ``endings``, ``label``). ``hellaswag_score``: ``"ending_mean"`` (asvd_gac_experiment.py,
    llmpruner_gac_experiment.py) or ``"full_sum"`` (eval_llmpruner_r8.py)."""
    dev = next(model.parameters()).device
    accs = {}
    if piqa is not None:
        items = list(piqa)[:limit] if limit else list(piqa)
        correct = 0
        for ex in items:
            scores = []
            for c in (ex["sol1"], ex["sol2"]):
                ids = tokenizer(f"{ex['goal']} {c}", return_tensors="pt").input_ids.to(dev)
                lp = _logprobs(model, ids)[:-1]
                scores.append(lp.gather(1, ids[0, 1:].unsqueeze(1)).sum().item())
            correct += scores.index(max(scores)) == int(ex["label"])
        accs["piqa"] = correct / len(items) if items else 0
    if hellaswag is not None:
        items = list(hellaswag)[:limit] if limit else list(hellaswag)
        correct = 0
        for ex in items:
            scores = []
            for c in ex["endings"]:
                ids = tokenizer(f"{ex['ctx']} {c}", return_tensors="pt").input_ids.to(dev)
                lp = _logprobs(model, ids)
                if hellaswag_score == "full_sum":
                    scores.append(lp[:-1].gather(1, ids[0, 1:].unsqueeze(1)).sum().item())
                    continue
                ctx_len = tokenizer(ex["ctx"], return_tensors="pt").input_ids.shape[1]
                targets = ids[0, ctx_len:]
                if targets.numel() == 0:
                    scores.append(float("-inf"))
                    continue
                scores.append(lp[ctx_len - 1 : -1].gather(1, targets.unsqueeze(1)).mean().item())
            correct += scores.index(max(scores)) == int(ex["label"])
        accs["hellaswag"] = correct / len(items) if items else 0
    return accs


# ------------------------------------------------------------------------------------------------- the whole row
def plan(model, target_ratio: float, grid=GRID) -> dict:
    """Steps 1-6 on ``model`` for the kept ratio ``target_ratio`` (the script's ``--param_ratio_target``)."""
    shapes = projection_shapes(model)
    sens = layer_sensitivity(model, grid)
    ideal = ideal_ranks(model, sens, target_ratio)
    fisher = fisher_from_sensitivity(sens)
    budget = param_cost(ideal, shapes)
    dp, info = gac_dp(ideal, fisher, budget, shapes, num_layers(model))
    return {"sensitivity": sens, "ideal": ideal, "fisher": fisher, "budget": budget, "shapes": shapes,
            "aligned_8": round_to_n(ideal, fisher, budget, shapes, 8), "gac_dp": dp, "dp_info": info,
            "kept_ratios": kept_ratios(model, sens, target_ratio)}
