"""PaLU: low-rank K/V projections per head group (Chang et al. 2025; reference ``shadowpa0327/Palu``).

Each K and V projection is split into groups of ``group_size`` KV heads (PaLU's G-LRD; ``--head_group_size``,
default 4); every group ``W_g`` (``group_size * head_dim x hidden``) gets its own rank. The compressed projection is a
:class:`~gac.compression.modules.GroupedLowRankLinear` (one shared down-projection to the latent, one up-projection
per group), so ``params(r_g) = r_g * (hidden + group_size * head_dim)``.

What reproduces the reference's defaults (``compress.py``: ``--decompose_method whiten``, ``--search_method
fisher_uniform``), and what gac adds as named options:

=================  ==============================================  ===============================================
option             default (PaLU's)                                alternatives
=================  ==============================================  ===============================================
``decomposition``  ``whiten``: SVD of ``W_g L`` with ``L`` the      ``svd``: plain truncated SVD of ``W_g``
                   Cholesky factor of the calibration ``X^T X``
                   of the projection's input (shared by its
                   groups), ``B = sqrt(S) V^T L^-1``
proxy              ``fisher_rms``: per element ``sqrt(mean g^2)``  any proxy (``fisher``, ``magnitude``, ...)
allocation         ``fisher_uniform``: one score per projection,   ``proportional`` (gac's Eq. 2 rule, per group),
                   rank proportional to it, split evenly over      ``uniform``
                   the projection's head groups
``rank_cap``       gac's ``break_even``: at most the rank whose    ``full``: a group's rank may reach its full rank
                   factors hold no more parameters than the dense  ``group_size * head_dim`` (PaLU's cap; past
                   group (so its codes are fewer than its K/V)     break-even a group outweighs its dense rows)
``cache``          gac's ``auto``: the KV cache holds the groups'  ``latent`` (refused for a family it cannot
                   latent codes where the family's attention is    rebuild), ``full``: the rebuilt K/V (PaLU saves
                   supported (gac.compression.latent_cache)        weights only)
``fisher_loss``    ``next_token``: the Fisher of the ordinary      ``two_ahead``: the reference code's loss
                   next-token loss                                 (``x[:, :-1]`` in, ``x[:, 1:]`` as labels, which
                                                                   the model shifts again: two tokens ahead)
=================  ==============================================  ===============================================

``rank_cap`` departs from the reference because of what is saved: a rank past break-even holds more weights than
the dense group, and with the latent cache its codes save less than that costs. ``fisher_loss`` departs too: its
double shift reads as a slip (a Hugging Face model shifts the labels it is given), so gac takes the ordinary
next-token loss and offers the reference's as ``two_ahead`` for parity with the authors' code (docs/compressors.md
measures both on smollm2).

PaLU then rounds each group's rank to the nearest multiple of 32 (at least 32): in gac that is the ``round_nearest``
strategy with ``unit=32``; the ``unaligned`` strategy keeps the search's ranks as integers.

``svd`` (gac's, as for ASVD / SVD-LLM): the factorisation method of
:data:`~gac.compression.compressors.lowrank_math.SVD_METHODS`; ``exact`` is the reference's full float64 SVD, the
default the Gram method of :data:`~gac.compression.compressors.lowrank_math.DEFAULT_SVD` (a head group is narrower
than the hidden size, so the whitened Gram ``W_g X^T X W_g^T`` needs no ``L^-1``; docs/scale.md has the accuracy).

``group_size`` must divide the model's KV head count (PaLU raises otherwise); ``None`` means PaLU's 4, or all KV
heads when the model has fewer than 4.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gac.compression.compressors.base import (
    Compressor,
    Unit,
    lowrank_unit,
    part_specs,
    unit_projection,
)
from gac.compression.compressors.lowrank_math import (
    DEFAULT_SVD,
    SVD_METHODS,
    lapack_threads,
    svd_factors,
    whitened_factors,
    whitening,
)
from gac.compression.discovery import ModelLayout, discover
from gac.compression.latent_cache import CACHE_MODES, install, resolve_mode
from gac.compression.modules import GroupedLowRankLinear
from gac.compression.parts import is_dense, part_bias, part_weight, replace_part
from gac.compression.proxies import Proxy, check_score
from gac.errors import GacError, unknown_name
from gac.progress import track

DECOMPOSITIONS = ("whiten", "svd")
FISHER_LOSSES = {"next_token": 1, "two_ahead": 2}  # -> tokens ahead the gradient loss predicts
RANK_CAPS = ("break_even", "full")
PALU_GROUP_SIZE = 4  # PaLU's --head_group_size default


class PaLU(Compressor):
    name = "palu"
    xtx_of = "kv"  # k_proj and v_proj share their input
    default_proxy = "fisher_rms"
    default_allocation = "fisher_uniform"
    supports_sensitivity = False
    low_rank = True

    def __init__(self, layers=None, group_size: int | None = None, projections=("k_proj", "v_proj"),
                 decomposition: str = "whiten", rank_cap: str = "break_even", svd: str = DEFAULT_SVD,
                 fisher_loss: str = "next_token", cache: str = "auto"):
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
            raise GacError(f"PaLU group_size must be a positive number of KV heads per group (or null for PaLU's "
                           f"{PALU_GROUP_SIZE}), got {group_size!r}")
        if isinstance(projections, str) or not projections or any(
                str(p) not in ("k", "v", "k_proj", "v_proj") for p in projections):
            raise GacError(f"PaLU compresses k_proj and/or v_proj (roles k, v), got {list(projections)}")
        if decomposition not in DECOMPOSITIONS:
            raise unknown_name("PaLU decomposition", str(decomposition), DECOMPOSITIONS)
        if rank_cap not in RANK_CAPS:
            raise unknown_name("PaLU rank_cap", str(rank_cap), RANK_CAPS)
        if svd not in SVD_METHODS:
            raise unknown_name("factorisation method (compressor option svd)", str(svd), SVD_METHODS)
        if fisher_loss not in FISHER_LOSSES:
            raise unknown_name("PaLU fisher_loss", str(fisher_loss), tuple(FISHER_LOSSES))
        if cache not in CACHE_MODES:
            raise unknown_name("PaLU cache", str(cache), CACHE_MODES)
        self.cache = cache
        self.resolved_cache: str | None = None  # latent | full once the model's family is known (units)
        self.fisher_loss = fisher_loss
        self.gradient_tokens_ahead = FISHER_LOSSES[fisher_loss]
        self.layers, self.group_size, self.projections = layers, group_size, tuple(projections)
        self.decomposition, self.rank_cap, self.svd = decomposition, rank_cap, svd
        self.needs_xtx = decomposition == "whiten"  # X^T X of the k / v inputs from calibration

    def heads_per_group(self, num_kv_heads: int) -> int:
        """The group size for a model with ``num_kv_heads`` KV heads; a GacError when it does not divide them."""
        gs = self.group_size if self.group_size is not None else min(PALU_GROUP_SIZE, num_kv_heads)
        if num_kv_heads % gs:
            divisors = [d for d in range(1, num_kv_heads + 1) if num_kv_heads % d == 0]
            raise GacError(
                f"PaLU group_size {gs} does not divide the model's {num_kv_heads} KV heads; pass a group_size that "
                f"does (one of {divisors}), e.g. compressor option group_size={max(d for d in divisors if d <= gs)}"
            )
        return gs

    def units(self, model, layout: ModelLayout) -> list[Unit]:
        n_kv, hd = layout.num_kv_heads, layout.head_dim
        gs = self.heads_per_group(n_kv)
        self.resolved_cache = resolve_mode(self.cache, layout.model_type)
        out = []
        for i in self.layer_indices(layout.num_layers):
            for p in layout.projections_of(self.projections, [i]):
                if not is_dense(model, p):
                    raise GacError(f"{p.name} is not a dense Linear; it is already compressed")
                if p.out_features != n_kv * hd:
                    raise GacError(f"{p.name}: {p.out_features} outputs != num_kv_heads * head_dim ({n_kv} * {hd})")
                rows = gs * hd
                bias = part_bias(model, p) is not None
                for g in range(n_kv // gs):
                    meta = {"layer": i, "module": p.name, "group": g, "rows": [g * rows, (g + 1) * rows], "heads": gs,
                            "projection": p, "bias": bias}
                    u = lowrank_unit(f"{p.name}.group{g}", rows, p.in_features, (p.module,), meta)
                    if self.rank_cap == "full":
                        u = Unit(u.name, u.kind, u.params_per_dim, u.dense_params, u.d_full, u.d_full, u.modules, u.meta)
                    out.append(replace(u, parts=((p.module, None if p.whole else p.role),)))
        return out

    def factor_rank(self, out_features: int, in_features: int) -> int:
        """With ``rank_cap="full"`` a group's factors reach its full rank: the whole projection's ``min(out, in)``
        bounds its groups' together (at the break-even cap the groups' factors add up to the projection's)."""
        if self.rank_cap == "full":
            return min(out_features, in_features)
        return super().factor_rank(out_features, in_features)

    def after_apply(self, model, units, dims, originals, calib_ids, layout) -> dict:
        """With the latent cache, the compressed attention modules cache PaLU's codes (gac.compression.latent_cache)."""
        mode = self.resolved_cache or resolve_mode(self.cache, layout.model_type)
        layers = install(model, layout) if mode == "latent" else 0
        return {"kv_cache": {"mode": mode, "latent_layers": layers}}

    def score(self, model, units, stats, proxy: Proxy):
        cache: dict[str, torch.Tensor] = {}
        scores = {}
        for u in units:
            p = unit_projection(u)
            if p.name not in cache:
                st = stats.get(p.module)
                cache[p.name] = proxy.row_energy(p.name, part_weight(model, p),
                                                 None if st is None else st.part(None if p.whole else p.row_index()))
            a, b = u.meta["rows"]
            e = float(cache[p.name][a:b].sum())
            scores[u.name] = check_score(proxy.group_score(e, u.dense_params), u.name, proxy.name)
        return scores

    def factorize(self, model, units, stats, proxy):
        out = {}
        roots: dict[str, tuple[torch.Tensor, str]] = {}
        for u in track(units, "factorization (SVD)", "units"):
            p = unit_projection(u)
            W = part_weight(model, p)
            a, b = u.meta["rows"]
            if self.decomposition == "svd":
                A, B, S = svd_factors(W[a:b], max_rank=u.d_cap, name=u.name, method=self.svd, return_sigma=True)
                out[u.name] = {"A": A.cpu(), "B": B.cpu(), "S": S.cpu()}
                continue
            m = p.module
            if m not in roots:  # one Cholesky factor per input, shared by the head groups of the projections it feeds
                st = stats.get(m)
                if st is None or st.xtx is None:
                    raise GacError(f"PaLU's whiten decomposition needs X^T X for {m}; calibration did not record it")
                with lapack_threads(st.xtx):
                    roots[m] = whitening(st.xtx, name=m)
            L, how = roots[m]
            A, B, S = whitened_factors(W[a:b], L, max_rank=u.d_cap, name=u.name, method=self.svd, how=how,
                                       return_sigma=True)
            out[u.name] = {"A": A.cpu(), "B": B.cpu(), "S": S.cpu(), "whitening": how}
        return out

    @staticmethod
    def _by_projection(units, dims) -> dict:
        """The units of each projection that ``dims`` changes, in group order (PaLU applies a projection whole)."""
        by: dict = {}
        for u in units:
            by.setdefault(u.meta["module"], []).append(u)
        out = {}
        for name, us in by.items():
            chosen = [u for u in us if u.name in dims]
            if not chosen:
                continue
            if len(chosen) != len(us):
                raise GacError(f"PaLU applies a whole projection at once: {name} needs a rank for each of its "
                               f"{len(us)} groups")
            out[unit_projection(us[0])] = sorted(us, key=lambda u: u.meta["group"])
        return out

    def module_specs(self, model, units, dims):
        self.check_dims(units, dims)
        return part_specs(model, {
            p: {"type": "grouped_lowrank", "in": p.in_features,
                "outs": [u.meta["rows"][1] - u.meta["rows"][0] for u in us],
                "ranks": [int(dims[u.name]) for u in us], "bias": bool(us[0].meta.get("bias"))}
            for p, us in self._by_projection(units, dims).items()})

    def apply(self, model, units, dims, factors):
        old: dict = {}
        layout = None
        for p, us in self._by_projection(units, dims).items():
            W = part_weight(model, p)
            bias = part_bias(model, p)
            ranks = [int(dims[u.name]) for u in us]
            for u, r in zip(us, ranks):
                if not 1 <= r <= factors[u.name]["A"].shape[1]:
                    raise GacError(f"{u.name}: rank {r} outside the factorised range 1..{factors[u.name]['A'].shape[1]}")
            new = GroupedLowRankLinear(p.in_features, [u.meta["rows"][1] - u.meta["rows"][0] for u in us], ranks,
                                       bias=bias is not None, dtype=W.dtype, device=W.device)
            with torch.no_grad():
                new.down.weight.copy_(torch.cat([factors[u.name]["B"][:r] for u, r in zip(us, ranks)]).to(W))
                for up, u, r in zip(new.ups, us, ranks):
                    up.weight.copy_(factors[u.name]["A"][:, :r].to(W))
                if bias is not None:
                    new.bias.copy_(bias)
            if layout is None and not p.whole:
                layout = discover(model)
            replace_part(model, layout, p, new, old)
        return old
