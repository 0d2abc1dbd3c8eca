"""Architecture-aware discovery of the compressible projections of a Hugging Face decoder model.

Reads the structure from the model itself (its config and module tree), never from hard-coded model constants:
decoder layers, attention q/k/v/o, MLP gate/up/down, heads, KV heads (GQA) and head_dim. Supported families
share the Llama layout (``model.layers[i].self_attn.{q,k,v,o}_proj``, ``model.layers[i].mlp.{gate,up,down}_proj``):

==========  =============================================================
model_type  families
==========  =============================================================
llama       Llama 2, Llama 3 / 3.1 / 3.2 (GQA), TinyLlama, Vicuna, ...
mistral     Mistral 7B (GQA, sliding window)
qwen2       Qwen2, Qwen2.5 (q/k/v biases)
qwen3       Qwen3 dense (q_norm / k_norm per head)
==========  =============================================================

Anything else raises a :class:`~gac.errors.GacError` listing the supported types.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gac.errors import GacError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ATTN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
PROJECTIONS = ATTN_PROJECTIONS + MLP_PROJECTIONS


@dataclass(frozen=True)
class LayerInfo:
    """One decoder layer: its index and the dotted module names of its projections."""

    index: int
    prefix: str  # e.g. "model.layers.3"

    @property
    def attn(self) -> str:
        return f"{self.prefix}.self_attn"

    @property
    def mlp(self) -> str:
        return f"{self.prefix}.mlp"

    def name(self, proj: str) -> str:
        if proj not in PROJECTIONS:
            raise GacError(f"unknown projection {proj!r}; known: {', '.join(PROJECTIONS)}")
        return f"{self.attn if proj in ATTN_PROJECTIONS else self.mlp}.{proj}"


@dataclass(frozen=True)
class ModelLayout:
    """What gac needs to know about a decoder model's shapes."""

    model_type: str
    layers_path: str  # e.g. "model.layers"
    layers: tuple[LayerInfo, ...]
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head (1 without GQA)."""
        return self.num_heads // self.num_kv_heads

    def linear_names(self, projections=PROJECTIONS, layers=None) -> list[str]:
        idx = range(self.num_layers) if layers is None else layers
        return [self.layers[i].name(p) for i in idx for p in projections]

    def layer_of(self, module_name: str) -> int:
        for li in self.layers:
            if module_name.startswith(li.prefix + "."):
                return li.index
        raise GacError(f"{module_name!r} is not inside a decoder layer")


def discover(model: nn.Module) -> ModelLayout:
    """The :class:`ModelLayout` of a supported causal LM; a clear error for anything else."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise GacError(
            f"unsupported architecture {model_type!r} ({type(model).__name__}); gac discovers targets in decoder "
            f"models of type {', '.join(SUPPORTED_MODEL_TYPES)} (Llama 2/3, Mistral, Qwen2/2.5/3 dense, GQA included)"
        )
    layers_path = None
    for path in ("model.layers", "layers"):
        try:
            mod = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(mod, nn.ModuleList):
            layers_path = path
            break
    if layers_path is None:
        raise GacError(f"{type(model).__name__}: no decoder layer list at model.layers; is this a causal LM of type {model_type}?")
    n_layers = len(model.get_submodule(layers_path))
    layers = tuple(LayerInfo(i, f"{layers_path}.{i}") for i in range(n_layers))
    for li in layers:
        for p in PROJECTIONS:
            try:
                model.get_submodule(li.name(p))
            except AttributeError:
                raise GacError(
                    f"{type(model).__name__} layer {li.index} has no {li.name(p)}; gac expects the Llama projection layout "
                    f"({', '.join(PROJECTIONS)}) in {', '.join(SUPPORTED_MODEL_TYPES)} models"
                ) from None
    num_heads = int(cfg.num_attention_heads)
    num_kv = int(getattr(cfg, "num_key_value_heads", None) or num_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
    if num_heads % num_kv:
        raise GacError(f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv}")
    return ModelLayout(
        model_type=model_type,
        layers_path=layers_path,
        layers=layers,
        hidden_size=int(cfg.hidden_size),
        intermediate_size=int(cfg.intermediate_size),
        num_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=int(head_dim),
        vocab_size=int(cfg.vocab_size),
    )
