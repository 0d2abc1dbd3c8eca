"""Allocation problems shaped like real models, for benchmarks, tests and the solver demo.

The shapes are the real ones (Llama-3-8B, Llama-3-70B, a 2,000-target MoE); the importance scores are
synthetic (a U-shaped profile over depth, a factor per projection, log-normal noise) because real scores
need the real weights. d* follows the square-root allocation: keep fraction k_i = c * sqrt(s_i / mean s) of
each weight's parameters, with c set so the total equals the budget, capped at 97% of the break-even
rank ``out*in/(out+in)`` where factorising stops paying (d_max: that rank rounded down to a multiple of 64). Nothing here pretends to be a
measurement of a real model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gac.align.candidates import DEFAULT_UNIT
from gac.align.targets import Target

# name -> (layers, [(projection, out, in)])
_SHAPES = {
    "llama3_8b": (32, [("q_proj", 4096, 4096), ("k_proj", 1024, 4096), ("v_proj", 1024, 4096), ("o_proj", 4096, 4096),
                       ("gate_proj", 14336, 4096), ("up_proj", 14336, 4096), ("down_proj", 4096, 14336)]),
    "llama3_70b": (80, [("q_proj", 8192, 8192), ("k_proj", 1024, 8192), ("v_proj", 1024, 8192), ("o_proj", 8192, 8192),
                        ("gate_proj", 28672, 8192), ("up_proj", 28672, 8192), ("down_proj", 8192, 28672)]),
    "moe_2000": (50, [("q_proj", 4096, 4096), ("k_proj", 1024, 4096), ("v_proj", 1024, 4096), ("o_proj", 4096, 4096)]
                 + [(f"experts.{e}.{p}", o, i) for e in range(12)
                    for p, o, i in (("gate_proj", 1536, 4096), ("up_proj", 1536, 4096), ("down_proj", 4096, 1536))]),
}
_MLP = ("gate_proj", "up_proj", "down_proj")
_TYPE_FACTOR = {"q_proj": 0.8, "k_proj": 1.3, "v_proj": 1.5, "o_proj": 1.0, "gate_proj": 0.9, "up_proj": 1.0, "down_proj": 1.2}

SHAPES = tuple(_SHAPES)


@dataclass
class Problem:
    targets: list[Target]
    budget: int
    full_params: int


def lowrank_problem(shape: str = "llama3_8b", ratio: float = 0.15, seed: int = 0, windows=(8,),
                    unit: int = DEFAULT_UNIT, equal_scores: bool = False, dense: bool = False) -> Problem:
    """Low-rank (ASVD-like) allocation over every projection of ``shape`` at compression ``ratio``.

    ``windows``: candidate windows drawn per target (window 8 and unit 8 give 15-16 candidates; 4 gives 7-8).
    The budget is ``floor(sum_i params_i(d*_i))``, i.e. exactly the unconstrained plan's size.

    ``dense``: every target gets a dense option (``dense_params = out * in``), and a target whose square-root share
    reaches its cap is kept dense (d* = min(out, in)) instead of capped, as ASVD's sensitivity search keeps its
    most sensitive weights dense. With explicit candidate lists (``windows`` other than ``(8,)``) the dense option
    is a candidate of every target.
    """
    layers, projs = _SHAPES[shape]
    rng = np.random.default_rng(seed)
    rows = []
    for layer in range(layers):
        depth = layer / max(1, layers - 1)
        u = 1.0 + 1.5 * (2 * depth - 1) ** 2  # early and late layers matter more
        for name, out, inp in projs:
            factor = _TYPE_FACTOR[name.rsplit(".", 1)[-1]]
            s = 1.0 if equal_scores else u * factor * float(rng.lognormal(0.0, 0.35))
            block = "mlp" if name in _MLP else "self_attn"  # the module paths of a Llama-architecture model
            rows.append((f"model.layers.{layer}.{block}.{name}", out, inp, s))
    full = sum(o * i for _, o, i, _ in rows)
    scores = np.array([r[3] for r in rows])
    rel = np.sqrt(scores / scores.mean())
    sizes = np.array([o * i for _, o, i, _ in rows], dtype=np.float64)
    ppd = np.array([o + i for _, o, i, _ in rows], dtype=np.float64)
    # a low-rank factorisation only pays below the break-even rank out*in/(out+in); d_max is that rank
    # rounded down to a multiple of 64 (an aligned cap, so d_max as a candidate never breaks alignment)
    dmax = np.array([(o * i) // (o + i) // 64 * 64 for _, o, i, _ in rows], dtype=np.float64)
    target_params = (1 - ratio) * full
    cap = ppd * dmax * 0.97

    def kept_params(c):
        want = c * rel * sizes
        if dense:  # at the cap the weight stays dense (a jump to its full size)
            return np.where(want > cap, sizes, want)
        return np.minimum(want, cap)

    lo, hi = 0.0, 10.0
    for _ in range(100):  # bisection on c so that sum_i kept_i(c) = target (the largest c that does not exceed it)
        c = (lo + hi) / 2
        lo, hi = (c, hi) if kept_params(c).sum() <= target_params else (lo, c)
    kept = kept_params(lo)
    is_dense = dense & (kept >= sizes)
    d_star = np.where(is_dense, 0.0, kept / ppd)
    mins = np.array([min(o, i) for _, o, i, _ in rows], dtype=np.float64)
    d_star = np.where(is_dense, mins, d_star)
    targets = [
        Target(name=r[0], d_star=float(d), score=float(r[3]), params_per_dim=int(p), d_max=int(m), kind="lowrank",
               candidates=None, dense_params=r[1] * r[2] if dense else None, shape=(r[1], r[2]) if dense else None)
        for r, d, p, m in zip(rows, d_star, ppd, dmax)
    ]
    # per-target windows: realised as explicit candidate lists so one problem carries them
    if tuple(windows) != (8,):
        from gac.align.candidates import rank_candidates

        wins = rng.choice(np.asarray(windows), size=len(targets))
        targets = [Target(t.name, t.d_star, t.score, t.params_per_dim, t.d_max,
                          rank_candidates(t, unit, int(w)) or (t.d_max,), t.kind, dense_params=t.dense_params,
                          shape=t.shape) for t, w in zip(targets, wins)]
    budget = int(math.floor(sum(t.params_star for t in targets)))
    return Problem(targets, budget, int(full))
