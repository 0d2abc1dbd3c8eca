"""PaLU's latent KV cache: a PaLU-compressed layer caches its K/V *codes* ``z = down(x)`` instead of the rebuilt K/V.

A PaLU projection (:class:`~gac.compression.modules.GroupedLowRankLinear`) computes ``y = concat_g(up_g(z_g)) + b``
from ``z = down(x)``, ``sum(r_g)`` numbers per token against the dense ``num_kv_heads * head_dim``. Caching ``z``
(PaLU's point: Chang et al. 2025) shrinks the cache by that ratio; attention rebuilds the past tokens' K and V from
it at every step. K's codes are cached *before* RoPE (rotary positions do not commute with the up-projection), so
the rebuild applies the family's own key pipeline: its per-head or full-width key norm, then its
``apply_rotary_pos_emb`` with the past tokens' cos/sin. The cos/sin are cached once per rotary kind (one layer type:
Gemma 3's local and global layers differ), beside the codes of the first latent layer of that kind, so they are
reordered, cropped and slid with the cache like everything else.

How it hooks into transformers' cache (transformers 5's ``Cache`` of per-layer ``DynamicLayer`` /
``DynamicSlidingWindowLayer``): a forward pre-hook on every compressed attention module (:class:`LatentHook`) turns
that layer's cache entry into a latent one (a subclass of its own class whose ``update`` stores codes, so growing,
sliding windows, beam reordering and cropping stay transformers' own, on tensors ``[batch, 1, tokens, codes]``) and
asks the projection for its codes. The layer's ``update`` stores the codes and returns the past tokens rebuilt with
the current step's own K/V appended: the step's tokens are exactly the model's, the past ones rebuilt to float
tolerance. On the first update of each layer the rebuild of the step's own tokens is checked against the model's K/V:
an attention this pipeline does not reproduce fails there, in one line naming ``cache=full``, never silently.

Families whose attention is verified exact here (:data:`LATENT_FAMILIES`, tests/compression/test_palu_cache.py) get
the latent cache by default (PaLU's option ``cache=auto``); the others keep the rebuilt K/V (``cache=full``) and an
explicit ``cache=latent`` is refused in one line. Other cache kinds (static, quantised layers) and an offloaded
cache (transformers 5: ``offloading=True`` on the cache, its layers plain dynamic ones) are refused the same way when
they reach a latent layer.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from gac.errors import GacError

#: model types whose attention the latent cache reproduces exactly, each checked on a random-weight model
#: (tests/compression/test_palu_cache.py): a key norm before or after the head split, RoPE by the modeling module's
#: ``apply_rotary_pos_emb`` (partial rotary inside it included), or no RoPE (GPT-2). Phi and StableLM (partial rotary
#: split in the attention itself), GPT-J (its own rotary signature) and the multimodal Gemma 3 keep ``cache=full``
LATENT_FAMILIES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "olmo3",
    "granite", "starcoder2", "mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "ministral", "ministral3", "internlm3",
    "seed_oss", "exaone4", "cohere", "cohere2", "gpt2", "phi3", "gpt_neox", "glm", "glm4", "glm4_moe", "ernie4_5",
    "ernie4_5_moe",
})
CACHE_MODES = ("auto", "latent", "full")
FIX = "compress with the PaLU option cache=full (parameters only, the rebuilt K/V cached)"


def supports_latent(model_type: str) -> bool:
    return model_type in LATENT_FAMILIES


def resolve_mode(mode: str, model_type: str) -> str:
    """``auto`` -> ``latent`` where the family is supported, else ``full``; an unsupported ``latent`` is refused."""
    if mode == "auto":
        return "latent" if supports_latent(model_type) else "full"
    if mode == "latent" and not supports_latent(model_type):
        raise GacError(f"PaLU's latent KV cache (cache=latent) is not available for {model_type!r} models (its "
                       f"attention is not one the latent cache rebuilds exactly); {FIX}")
    return mode


def _part(attn: nn.Module, path: str, role: str | None) -> nn.Module:
    m = attn.get_submodule(path)
    return m.part(role) if role is not None else m


def _latent_module(attn: nn.Module, path: str | None, role: str | None):
    from gac.compression.modules import GroupedLowRankLinear

    if path is None:
        return None
    m = _part(attn, path, role)
    return m if isinstance(m, GroupedLowRankLinear) else None


class LatentHook:
    """The forward pre-hook of one compressed attention module; holds names and numbers only (deep copies of the
    model keep working): where its K/V projections are (relative to the attention), its head size, its rotary kind,
    and which layer caches that kind's cos/sin."""

    def __init__(self, layer_idx: int, k: tuple | None, v: tuple | None, head_dim: int, rope_key: str,
                 rope_source: int | None):
        self.layer_idx, self.k, self.v, self.head_dim = int(layer_idx), k, v, int(head_dim)
        self.rope_key, self.rope_source = rope_key, rope_source

    def modules(self, attn: nn.Module):
        return (_latent_module(attn, *self.k) if self.k else None, _latent_module(attn, *self.v) if self.v else None)

    def __call__(self, attn: nn.Module, args, kwargs):
        from transformers.cache_utils import Cache

        # the cache under any name (cache, past_key_values, GPT-NeoX's layer_past)
        cache = next((x for x in (*kwargs.values(), *args) if isinstance(x, Cache)), None)
        if cache is None:
            return None
        if getattr(cache, "offloading", False):  # transformers 5: a flag on the cache over plain dynamic layers
            raise GacError("PaLU's latent KV cache cannot be offloaded (a cache made with offloading=True, e.g. "
                           "generate(cache_implementation='offloaded')); generate without cache offloading or "
                           f"{FIX}")
        if cache.layer_class_to_replicate is not None:
            while len(cache.layers) <= self.layer_idx:
                cache.layers.append(cache.layer_class_to_replicate())
        layer = cache.layers[self.layer_idx]
        if not getattr(layer, "palu_latent", False):
            make_latent(layer)
        km, vm = self.modules(attn)
        for m in (km, vm):
            if m is not None:
                m.keep_latent, m.latent = True, None
        pe = kwargs.get("position_embeddings")
        layer.palu_call = (self, attn, km, vm, pe, cache)
        return None


def make_latent(layer) -> None:
    """Turn a fresh transformers cache layer into its latent twin (a subclass whose ``update`` stores codes)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    kind = type(layer)
    if kind not in (DynamicLayer, DynamicSlidingWindowLayer):
        raise GacError(f"PaLU's latent KV cache works with transformers' dynamic cache layers, not {kind.__name__}; "
                       f"generate with the default DynamicCache or {FIX}")
    if layer.is_initialized:
        raise GacError("a KV cache filled before PaLU's latent cache was installed cannot continue with it; start "
                       "from an empty cache")
    if kind not in _LATENT:  # a direct subclass (a mixin in front would change the layout CPython checks on swap)
        _LATENT[kind] = type(f"PaLULatent{kind.__name__}", (kind,), {"update": _latent_update(kind), "palu_latent": True})
    layer.__class__ = _LATENT[kind]


def _rebuild_keys(hook: LatentHook, attn: nn.Module, km, z: torch.Tensor, cos, sin) -> torch.Tensor:
    """Post-RoPE keys ``[batch, kv_heads, tokens, head_dim]`` from K codes ``[batch, tokens, codes]``."""
    y = km.from_latent(z)
    b, t = y.shape[:2]
    norm = getattr(attn, "k_norm", None)
    w = getattr(norm, "weight", None) if norm is not None else None
    full_width = w is not None and w.dim() == 1 and w.shape[0] == y.shape[-1] != hook.head_dim
    if full_width:  # OLMo 2: one norm over all the heads, before the split
        y = norm(y)
    y = y.view(b, t, y.shape[-1] // hook.head_dim, hook.head_dim)
    if norm is not None and not full_width:
        y = norm(y)
    y = y.transpose(1, 2)
    if cos is not None:
        rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        y = rope(y, y, cos, sin)[1]
    return y


def _rebuild_values(hook: LatentHook, vm, z: torch.Tensor) -> torch.Tensor:
    y = vm.from_latent(z)
    return y.view(*y.shape[:2], y.shape[-1] // hook.head_dim, hook.head_dim).transpose(1, 2)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tol = 1e-4 if a.dtype in (torch.float32, torch.float64) else 3e-2
    a, b = a.float(), b.float()
    return a.shape == b.shape and float((a - b).norm()) <= tol * max(float(b.norm()), 1e-12)


def _latent_update(base: type):
    """The ``update`` of the latent twin of transformers' cache layer class ``base``: its cache holds PaLU codes,
    ``keys`` ``[batch, 1, tokens, K codes (+ cos, sin on a rope source)]``, ``values`` ``[batch, 1, tokens, V codes]``
    (or the dense K or V when that projection is not PaLU's), grown, slid and reordered by ``base`` itself."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        call = self.__dict__.pop("palu_call", None)
        if call is None:
            raise GacError("a PaLU latent cache layer was updated outside its attention module; " + FIX)
        hook, attn, km, vm, pe, cache = call
        kz = vz = None
        if km is not None:
            kz, km.latent, km.keep_latent = km.latent, None, False
        if vm is not None:
            vz, vm.latent, vm.keep_latent = vm.latent, None, False
        if (km is not None and kz is None) or (vm is not None and vz is None):
            raise GacError("PaLU's latent cache got no codes from the K/V projection in this step; " + FIX)
        first = not self.is_initialized
        n_new = key_states.shape[-2]
        batch = key_states.shape[0]
        cos = sin = None
        k_store = key_states
        source = kz is not None and hook.rope_source == hook.layer_idx and pe is not None
        if kz is not None:
            k_store = kz.unsqueeze(1)
            if source:
                c, s = (x.to(kz.dtype).expand(batch, n_new, -1).unsqueeze(1) for x in pe)
                k_store = torch.cat([k_store, c, s], dim=-1)
        v_store = vz.unsqueeze(1) if vz is not None else value_states
        keys, values = base.update(self, k_store, v_store, *args, **kwargs)
        n_all = keys.shape[-2]
        if kz is not None:
            width = kz.shape[-1]
            if pe is not None:
                rope = getattr(cache, "palu_rope", None)
                if source:
                    hd = pe[0].shape[-1]
                    rope = {**(rope or {}), hook.rope_key: (keys[:, 0, :, width:width + hd],
                                                            keys[:, 0, :, width + hd:width + 2 * hd])}
                    cache.palu_rope = rope
                if not rope or hook.rope_key not in rope or rope[hook.rope_key][0].shape[-2] < n_all:
                    raise GacError(f"PaLU's latent cache: layer {hook.layer_idx} found no cached rotary positions "
                                   f"for its {n_all} tokens; " + FIX)
                cos, sin = (x[:, -n_all:].to(kz.device) for x in rope[hook.rope_key])  # layers may sit on 2 devices
            if first:
                try:
                    mine = _rebuild_keys(hook, attn, km, kz, *(pe if pe is not None else (None, None)))
                except (RuntimeError, TypeError, AttributeError):  # another rotary signature or shape: not exact
                    mine = None
                if mine is None or not _close(mine, key_states):
                    raise GacError(f"PaLU's latent cache does not rebuild the keys of {type(attn).__name__} (layer "
                                   f"{hook.layer_idx}) exactly: this attention is not one it supports; " + FIX)
            old = keys[:, 0, : n_all - n_new, :width]
            past = _rebuild_keys(hook, attn, km, old, None if cos is None else cos[:, : n_all - n_new],
                                 None if sin is None else sin[:, : n_all - n_new])
            keys = torch.cat([past, key_states], dim=-2)
        if vz is not None:
            if first and not _close(_rebuild_values(hook, vm, vz), value_states):
                raise GacError(f"PaLU's latent cache does not rebuild the values of {type(attn).__name__} (layer "
                               f"{hook.layer_idx}) exactly: this attention is not one it supports; " + FIX)
            past = _rebuild_values(hook, vm, values[:, 0, : n_all - n_new])
            values = torch.cat([past, value_states], dim=-2)
        return keys, values

    return update


_LATENT: dict = {}  # transformers' layer class -> its latent twin, made on first use (no transformers import before)


def _hooks(model: nn.Module) -> list[tuple[nn.Module, int, LatentHook]]:
    return [(m, hid, h) for m in model.modules() for hid, h in m._forward_pre_hooks.items() if isinstance(h, LatentHook)]


def has_latent_cache(model: nn.Module) -> bool:
    """Whether ``model`` caches PaLU codes (:func:`install`)."""
    return bool(_hooks(model))


def remove(model: nn.Module) -> None:
    """Back to the rebuilt K/V cache (the parameter-only PaLU)."""
    for m, hid, _ in _hooks(model):
        del m._forward_pre_hooks[hid]


def install(model: nn.Module, layout=None) -> int:
    """Make every attention module of ``model`` whose K or V projection is PaLU's cache the codes; returns how many.
    Refused in one line for a family the latent cache does not support (:data:`LATENT_FAMILIES`)."""
    from gac.compression.discovery import discover, text_config

    layout = layout or discover(model)
    if not supports_latent(layout.model_type):
        resolve_mode("latent", layout.model_type)
    remove(model)
    cfg = text_config(model.config)
    layer_types = getattr(cfg, "layer_types", None)
    attns: dict[str, dict] = {}
    for p in layout.projections_of(("k", "v")):
        attn_path, _, own = p.module.rpartition(".")
        attns.setdefault(attn_path, {})[p.role] = (own, None if p.whole else p.role)
    found = []
    for attn_path, roles in attns.items():
        attn = model.get_submodule(attn_path)
        k, v = (roles[r] if r in roles and _latent_module(attn, *roles[r]) is not None else None for r in ("k", "v"))
        if k is None and v is None:
            continue
        idx = getattr(attn, "layer_idx", None)
        if not isinstance(idx, int):
            raise GacError(f"{attn_path} has no layer_idx, so its cache entry cannot be found; " + FIX)
        found.append((idx, attn, k, v))
    sources: dict[str, int] = {}  # rotary kind -> the first layer caching K codes of that kind holds its cos/sin
    for idx, attn, k, v in sorted(found, key=lambda f: f[0]):
        rope_key = str(layer_types[idx]) if layer_types is not None and idx < len(layer_types) else ""
        if k is not None:
            sources.setdefault(rope_key, idx)
        attn.register_forward_pre_hook(LatentHook(idx, k, v, layout.head_dim, rope_key, sources.get(rope_key)),
                                       with_kwargs=True)
    n = len(found)
    return n


def cache_bytes(cache) -> int:
    """Bytes a transformers cache holds now: every storage its layers' keys and values (and the latent cache's rotary
    views) keep alive, each counted once and whole (a sliding window's slice keeps its whole storage)."""
    tensors = [t for layer in getattr(cache, "layers", ()) for t in (getattr(layer, "keys", None),
                                                                     getattr(layer, "values", None))]
    tensors += [t for pair in (getattr(cache, "palu_rope", None) or {}).values() for t in pair]
    storages = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            st = t.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())
