"""The compressible projections of a decoder model, found from its family's layout (:mod:`gac.compression.layouts`).

:func:`discover` reads the model's family from its config (a family without a layout is refused), then walks the
decoder layers and records, for every role the layout names, a :class:`Projection`: the module that holds its weight,
and for a fused module the output rows that are the role's (Phi-3's ``qkv_proj`` rows ``[0, H*hd)`` are ``q``).
Shapes come from the modules themselves, checked against the config's heads: a layout that does not fit the model
fails here, in one line, not as a wrong result later. Mixture-of-experts blocks are recorded per layer
(:class:`ExpertBlock`). :func:`discover_config` does the same from a config alone, on the ``meta`` device (no weight
is read), so a family gac cannot compress is refused before loading.

A projection's *name* is the name of its module when it holds the whole module (``model.layers.3.self_attn.q_proj``:
plans, records and checkpoints of Llama-family models read as before) and ``module[role]`` for part of a fused one
(``model.layers.3.self_attn.qkv_proj[q]``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gac.compression.layouts import (
    ATTN_ROLES,
    GATED_ROLES,
    PLAIN_ROLES,
    ROLES,
    Family,
    Slot,
    family_of,
    logit_transform,
    role_of,
)
from gac.errors import GacError
from gac.transformers_lock import transformers_lock

# Llama's module names, still accepted wherever roles are chosen (gac.compression.layouts.LLAMA_NAMES)
ATTN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
PROJECTIONS = ATTN_PROJECTIONS + MLP_PROJECTIONS


@dataclass(frozen=True)
class LayerInfo:
    """One decoder layer: its index and its module path."""

    index: int
    prefix: str  # e.g. "model.layers.3"


@dataclass(frozen=True)
class Projection:
    """One role's weight in one layer: ``module``'s rows ``rows`` (None: all of it), seen as ``out x in``."""

    name: str
    module: str
    role: str
    layer: int
    out_features: int
    in_features: int
    rows: tuple[tuple[int, int], ...] | None = None  # [start, stop) ranges of the module's output rows, in order
    conv1d: bool = False  # the module's weight is stored in x out

    @property
    def whole(self) -> bool:
        return self.rows is None

    def row_index(self) -> list[int]:
        """The module rows of this role, in order (all rows for a whole module)."""
        if self.rows is None:
            return list(range(self.out_features))
        return [i for a, b in self.rows for i in range(a, b)]


@dataclass(frozen=True)
class ExpertBlock:
    """A mixture-of-experts block of one layer: ``num_experts`` gated MLPs of width ``width`` in 3-D parameters."""

    layer: int
    module: str  # e.g. "model.layers.3.mlp.experts"
    num_experts: int
    hidden: int
    width: int
    gate_up: str  # the parameter names inside the module
    down: str

    @property
    def gate_up_key(self) -> str:
        return f"{self.module}.{self.gate_up}"

    @property
    def down_key(self) -> str:
        return f"{self.module}.{self.down}"


@dataclass(frozen=True)
class ModelLayout:
    """What gac needs to know about a decoder model's structure (module docstring)."""

    model_type: str
    family: str
    layers_path: str
    layers: tuple[LayerInfo, ...]
    hidden_size: int
    intermediate_size: int  # the dense MLP's width (or the experts' when every layer is a mixture of experts)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    projections: tuple[Projection, ...] = ()
    experts: tuple[ExpertBlock, ...] = ()
    norm: str = ""
    logits: str = "none"  # the family's logit transform and its value (gac.compression.layouts.transform_logits)
    logit_value: float | None = None
    mlp_kind: str = "gated"

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head (1 without GQA)."""
        return self.num_heads // self.num_kv_heads

    def projections_of(self, roles=ROLES, layers=None) -> list[Projection]:
        """The projections of ``roles`` (roles or Llama names) in ``layers`` (None: all), in layer then role order."""
        want = [role_of(r) for r in roles]
        keep = None if layers is None else set(layers)
        order = {r: i for i, r in enumerate(want)}
        out = [p for p in self.projections if p.role in order and (keep is None or p.layer in keep)]
        return sorted(out, key=lambda p: (p.layer, order[p.role]))

    def projection(self, layer: int, role: str) -> Projection | None:
        role = role_of(role)
        return next((p for p in self.projections if p.layer == layer and p.role == role), None)

    def mlp_of(self, layer: int) -> dict[str, Projection]:
        """The dense MLP's projections of ``layer`` by role (``gate``/``up``/``down`` or ``fc_in``/``fc_out``);
        empty for a mixture-of-experts layer."""
        return {p.role: p for p in self.projections if p.layer == layer and p.role in GATED_ROLES + PLAIN_ROLES}

    def experts_of(self, layer: int) -> ExpertBlock | None:
        return next((e for e in self.experts if e.layer == layer), None)

    def modules(self) -> list[str]:
        """Every module holding a projection or an expert block, in layer order (what a checkpoint records)."""
        pairs = [(p.layer, p.module) for p in self.projections] + [(e.layer, e.module) for e in self.experts]
        return list(dict.fromkeys(m for _, m in sorted(pairs, key=lambda lm: lm[0])))

    def linear_names(self, projections=PROJECTIONS, layers=None) -> list[str]:
        """The names of the projections of ``projections`` (roles or Llama names) in ``layers``."""
        return [p.name for p in self.projections_of(projections, layers)]

    def layer_of(self, module_name: str) -> int:
        for li in self.layers:
            if module_name.startswith(li.prefix + ".") or module_name == li.prefix:
                return li.index
        raise GacError(f"{module_name!r} is not inside a decoder layer")


def text_config(config):
    """The language model's config (the config itself, or a multimodal config's text part)."""
    get = getattr(config, "get_text_config", None)
    try:
        return get(decoder=True) if get else config
    except TypeError:
        return get()


def _head_counts(cfg) -> tuple[int, int, int]:
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    hd = getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads
    if heads % kv:
        raise GacError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    return heads, kv, int(hd)


def _oriented_shape(mod: nn.Module, slot: Slot, name: str) -> tuple[int, int]:
    """``(out, in)`` of the module a slot names, whatever it has become (dense, split, low rank, pruned)."""
    out_f, in_f = getattr(mod, "out_features", None), getattr(mod, "in_features", None)
    if out_f is None and slot.conv1d:  # transformers' Conv1D: weight [in, out], attribute nf = out
        w = getattr(mod, "weight", None)
        if w is not None and w.dim() == 2:
            in_f, out_f = int(w.shape[0]), int(w.shape[1])
    if out_f is None or in_f is None:
        raise GacError(f"{name} is a {type(mod).__name__}, not a linear projection; the layout of this family does "
                       f"not fit the model")
    return int(out_f), int(in_f)


def _role_rows(slot: Slot, out_f: int, heads: int, kv: int, hd: int, name: str) -> dict[str, tuple | None]:
    """The output rows of each role of a slot (None: the whole module)."""
    if len(slot.roles) == 1:
        return {slot.roles[0]: None}
    sizes = {"q": heads * hd, "k": kv * hd, "v": kv * hd}
    if slot.interleave:
        if set(slot.roles) != {"q", "k", "v"} or heads != kv or out_f != 3 * heads * hd:
            raise GacError(f"{name}: a per-head interleaved q/k/v weight of {out_f} rows does not fit {heads} heads of "
                           f"{hd} ({kv} KV heads); the family's layout does not fit this model")
        blk = len(slot.roles) * hd
        return {r: tuple((h * blk + j * hd, h * blk + (j + 1) * hd) for h in range(heads))
                for j, r in enumerate(slot.roles)}
    if all(r in sizes for r in slot.roles):
        want = [sizes[r] for r in slot.roles]
    else:  # equal blocks (a packed gate|up)
        if out_f % len(slot.roles):
            raise GacError(f"{name}: {out_f} rows do not split into {len(slot.roles)} equal blocks "
                           f"({', '.join(slot.roles)})")
        want = [out_f // len(slot.roles)] * len(slot.roles)
    if sum(want) != out_f:
        raise GacError(f"{name}: {out_f} rows, but its roles {'/'.join(slot.roles)} need {'+'.join(map(str, want))} "
                       f"({heads} heads, {kv} KV heads of {hd}); the family's layout does not fit this model")
    out, a = {}, 0
    for r, n in zip(slot.roles, want):
        out[r] = ((a, a + n),)
        a += n
    return out


def discover(model: nn.Module, check_heads: bool = True) -> ModelLayout:
    """The :class:`ModelLayout` of a model of a supported family; a one-line :class:`GacError` for anything else.
    ``check_heads``: q/k/v rows must be whole heads of the config's (off for the audit, which reports them)."""
    config = getattr(model, "config", None)
    fam = family_of(config)
    return _walk(model, fam, config, check_heads)


def _walk(model: nn.Module, fam: Family, config, check_heads: bool = True) -> ModelLayout:
    cfg = text_config(config)
    try:
        layers = model.get_submodule(fam.layers)
    except AttributeError:
        layers = None
    if not isinstance(layers, nn.ModuleList):
        raise GacError(f"{type(model).__name__}: no decoder layer list at {fam.layers} (the {fam.name} layout); is "
                       f"this a causal LM of type {fam.model_types[0]}?")
    heads, kv, hd = _head_counts(cfg)
    infos = tuple(LayerInfo(i, f"{fam.layers}.{i}") for i in range(len(layers)))
    projections: list[Projection] = []
    experts: list[ExpertBlock] = []
    widths: list[int] = []
    for li in infos:
        layer = layers[li.index]
        block = None
        if fam.experts is not None:
            try:
                block = layer.get_submodule(fam.experts.path)
            except AttributeError:
                block = None
        shared = tuple(s for s in fam.shared if _has(layer, s.path))  # a model configured without a shared expert
        slots = fam.attn + (shared if block is not None else fam.mlp)
        if block is None and not fam.mlp:
            raise GacError(f"{li.prefix} has no {fam.experts.path if fam.experts else 'MLP'} (the {fam.name} layout)")
        for slot in slots:
            name = f"{li.prefix}.{slot.path}"
            try:
                mod = layer.get_submodule(slot.path)
            except AttributeError:
                raise GacError(f"{type(model).__name__} layer {li.index} has no {slot.path}; the {fam.name} layout "
                               f"does not fit this model") from None
            out_f, in_f = _oriented_shape(mod, slot, name)
            for role, rows in _role_rows(slot, out_f, heads, kv, hd, name).items():
                n_out = out_f if rows is None else sum(b - a for a, b in rows)
                pname = name if rows is None else f"{name}[{role}]"
                projections.append(Projection(pname, name, role, li.index, n_out, in_f, rows, slot.conv1d))
        if block is not None:
            e = _expert_block(block, fam, li, int(cfg.hidden_size))
            experts.append(e)
            widths.append(e.width)
        if check_heads:
            _check_heads(projections, li.index, heads, kv, hd)
    mlp = [p for p in projections if p.role in ("gate", "fc_in")]
    inter = mlp[0].out_features if mlp else (widths[0] if widths else 0)
    logits, value = logit_transform(fam, model, cfg)
    return ModelLayout(
        model_type=str(getattr(config, "model_type", fam.model_types[0])),
        family=fam.name,
        layers_path=fam.layers,
        layers=infos,
        hidden_size=int(cfg.hidden_size),
        intermediate_size=int(inter),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        vocab_size=int(cfg.vocab_size),
        projections=tuple(projections),
        experts=tuple(experts),
        norm=fam.norm,
        logits=logits,
        logit_value=value,
        mlp_kind=fam.mlp_kind,
    )


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _expert_block(block: nn.Module, fam: Family, li: LayerInfo, hidden: int) -> ExpertBlock:
    name = f"{li.prefix}.{fam.experts.path}"
    gu, dn = (getattr(block, a, None) for a in (fam.experts.gate_up, fam.experts.down))
    widths = getattr(block, "widths", None)
    if widths is not None:  # already pruned by gac (gac.compression.modules.ExpertMLPs): per-expert widths
        return ExpertBlock(li.index, name, len(widths), hidden, max(widths), fam.experts.gate_up, fam.experts.down)
    if not (isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter) and gu.dim() == 3 and dn.dim() == 3):
        raise GacError(f"{name}: expected 3-D expert parameters {fam.experts.gate_up} [E, 2I, H] and {fam.experts.down} "
                       f"[E, H, I] (transformers 5's layout); found {type(block).__name__}")
    E, two_i, H = gu.shape
    if two_i % 2 or tuple(dn.shape) != (E, H, two_i // 2) or hidden != H:
        raise GacError(f"{name}: expert shapes {tuple(gu.shape)} / {tuple(dn.shape)} are not [E, 2I, H] / [E, H, I] "
                       f"with H = hidden_size {hidden}")
    return ExpertBlock(li.index, name, int(E), int(H), int(two_i // 2), fam.experts.gate_up, fam.experts.down)


def _check_heads(projections: list[Projection], layer: int, heads: int, kv: int, hd: int) -> None:
    for p in projections:
        if p.layer != layer or p.role not in ATTN_ROLES[:3]:
            continue
        want = heads * hd if p.role == "q" else kv * hd
        if p.out_features != want:
            raise GacError(f"{p.name}: {p.out_features} output rows, but the config's heads give {want} "
                           f"({heads if p.role == 'q' else kv} heads of {hd}); the config and the weights disagree")


def discover_config(config) -> ModelLayout:
    """:func:`discover` from a config alone: the family is checked first (no model is built for a family gac cannot
    compress), then the architecture is laid out on the ``meta`` device (no memory, no weights)."""
    family_of(config)
    return discover(skeleton(config))


@transformers_lock()
def skeleton(config, dtype=None, device="meta") -> nn.Module:
    """``config``'s causal LM with unallocated (``meta``) or uninitialised storage, in eval mode (tied weights tied)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, **({"dtype": dtype} if dtype is not None else {}))
    model.tie_weights()
    return model.eval()


__all__ = ["ATTN_PROJECTIONS", "MLP_PROJECTIONS", "PROJECTIONS", "ExpertBlock", "LayerInfo", "ModelLayout",
           "Projection", "discover", "discover_config", "skeleton", "text_config"]
