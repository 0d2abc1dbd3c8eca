"""One declarative layout per model family: where each projection lives, how fused weights split, what the tail is.

gac compresses *roles*, not module names: the attention's ``q``, ``k``, ``v``, ``o``; a gated MLP's ``gate``, ``up``,
``down``; a plain MLP's ``fc_in`` and ``fc_out``; and the expert MLPs of a mixture-of-experts layer. A family's
:class:`Family` entry says, for one decoder layer, which module holds each role (:class:`Slot`):

* a whole module (Llama's ``self_attn.q_proj``);
* a row block of a fused module (Phi-3's ``self_attn.qkv_proj`` holds ``q``, ``k``, ``v`` one after the other;
  ``mlp.gate_up_proj`` holds ``gate`` and ``up`` as two halves);
* a per-head interleave (GPT-NeoX's ``attention.query_key_value``: for each head, its ``q``, ``k`` and ``v`` rows);
* a transposed ``Conv1D`` (GPT-2, whose weight is stored ``in x out``).

It also names the decoder layers' list, the final norm, the mixture-of-experts block (3-D expert parameters
``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I], as transformers 5 stores Mixtral, Qwen3-MoE and OLMoE) and
the shared expert beside it (Qwen2-MoE, GLM-4-MoE: a dense MLP), and
the logit transform after the head (Granite divides by ``logits_scaling``, Cohere multiplies by ``logit_scale``,
Gemma 2 and Gemma 3's text model soft-cap), with the model classes whose forward applies it. The entries restate what transformers' own tensor-parallel plans say
(``config.base_model_tp_plan``: which modules are column- or row-parallel, which are packed); a test checks every
entry against its family's plan, so the two cannot drift apart.

A model whose ``model_type`` has no entry is refused before its weights load, in one line (:func:`family_of`);
gac never guesses a layout. :data:`REFUSED` names families whose layout is known but which gac cannot compress
well, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from gac.errors import GacError

ATTN_ROLES = ("q", "k", "v", "o")
GATED_ROLES = ("gate", "up", "down")
PLAIN_ROLES = ("fc_in", "fc_out")
ROLES = ATTN_ROLES + GATED_ROLES + PLAIN_ROLES
#: roles that read the layer's hidden state (their weight's input is hidden_size) and write rows of it
INPUT_ROLES = ("q", "k", "v", "gate", "up", "fc_in")
#: Llama's module names for the roles: compressor options accept either (``projections: [q_proj, k_proj]``)
LLAMA_NAMES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
               "down_proj": "down"}
LOGIT_TRANSFORMS = ("none", "divide", "multiply", "softcap")


@dataclass(frozen=True)
class Slot:
    """One module of a decoder layer and the roles its weight holds.

    ``roles``: the roles in the order of the weight's output rows (one role: the whole module). ``interleave``: the
    rows repeat per attention head (``[h0: q k v][h1: q k v]...``), each block ``head_dim`` rows. ``conv1d``: the
    weight is stored ``in x out`` (GPT-2's ``Conv1D``)."""

    path: str
    roles: tuple[str, ...]
    interleave: bool = False
    conv1d: bool = False

    def __post_init__(self):
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise GacError(f"layout slot {self.path!r}: unknown roles {bad}; roles are {', '.join(ROLES)}")


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts block of 3-D parameters: ``gate_up`` [E, 2I, H] (gate rows, then up rows) and ``down``
    [E, H, I], called as ``experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])``."""

    path: str  # the experts module inside a layer, e.g. "mlp.experts"
    gate_up: str = "gate_up_proj"
    down: str = "down_proj"


@dataclass(frozen=True)
class Family:
    """The layout of one model family (module docstring)."""

    name: str  # what the family is called in messages ("Phi-3 / Phi-4-mini")
    model_types: tuple[str, ...]
    attn: tuple[Slot, ...]
    mlp: tuple[Slot, ...] = ()  # a dense MLP (gated: gate/up/down, plain: fc_in/fc_out)
    experts: Experts | None = None  # a mixture-of-experts block (layers without it have the dense ``mlp``)
    #: a dense MLP beside the experts in a mixture-of-experts layer (a shared expert): compressed as a dense MLP is;
    #: the gate that scales its output, like the router, is not touched; a model configured without one has none
    shared: tuple[Slot, ...] = ()
    layers: str = "model.layers"
    norm: str = "model.norm"
    logits: str = "none"  # the transform after the head: none | divide | multiply | softcap
    logits_attr: str = ""  # the config attribute the transform reads
    #: the model classes whose forward applies the transform (read from transformers' source): a model of another
    #: class of the family (or a wrapper) gets no transform, whatever its config says
    logits_classes: tuple[str, ...] = ()
    tp_plan_names: tuple[str, ...] = ()  # the plan's module paths, when they are not the slots' (a test compares)

    def __post_init__(self):
        if self.logits not in LOGIT_TRANSFORMS:
            raise GacError(f"family {self.name}: unknown logit transform {self.logits!r}")
        if (self.logits != "none") != bool(self.logits_attr and self.logits_classes):
            raise GacError(f"family {self.name}: a logit transform names its config attribute and the model classes "
                           f"that apply it")
        for mlp in (self.mlp, self.shared):
            roles = [r for s in self.attn + mlp for r in s.roles]
            if sorted(set(roles)) != sorted(roles):
                raise GacError(f"family {self.name}: a role is held by two slots")
        if self.shared and (self.experts is None or any(r in ATTN_ROLES for s in self.shared for r in s.roles)):
            raise GacError(f"family {self.name}: a shared expert is an MLP beside an experts block")

    @property
    def mlp_kind(self) -> str:
        roles = {r for s in (self.mlp or self.shared) for r in s.roles}
        if roles == set(GATED_ROLES):
            return "gated"
        if roles == set(PLAIN_ROLES):
            return "plain"
        return "none" if not roles else "partial"

    def slot_of(self, role: str) -> Slot | None:
        return next((s for s in self.attn + self.mlp if role in s.roles), None)


def _llama_attn(o: str = "o_proj", prefix: str = "self_attn") -> tuple[Slot, ...]:
    return tuple(Slot(f"{prefix}.{p}", (r,)) for p, r in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), (o, "o")))


_LLAMA_MLP = tuple(Slot(f"mlp.{p}", (r,)) for p, r in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")))

def _shared(path: str) -> tuple[Slot, ...]:
    return tuple(Slot(f"{path}.{p}", (r,)) for p, r in (("gate_proj", "gate"), ("up_proj", "up"),
                                                         ("down_proj", "down")))


FAMILIES: tuple[Family, ...] = (
    Family("Llama 2/3, TinyLlama, SmolLM", ("llama",), _llama_attn(), _LLAMA_MLP),
    Family("Mistral", ("mistral",), _llama_attn(), _LLAMA_MLP),
    Family("Qwen2 / Qwen2.5", ("qwen2",), _llama_attn(), _LLAMA_MLP),
    Family("Qwen3", ("qwen3",), _llama_attn(), _LLAMA_MLP),
    Family("SmolLM3", ("smollm3",), _llama_attn(), _LLAMA_MLP),
    Family("Gemma", ("gemma",), _llama_attn(), _LLAMA_MLP),
    Family("Gemma 2", ("gemma2",), _llama_attn(), _LLAMA_MLP, logits="softcap", logits_attr="final_logit_softcapping",
           logits_classes=("Gemma2ForCausalLM",)),
    Family("Gemma 3 (text)", ("gemma3_text",), _llama_attn(), _LLAMA_MLP, logits="softcap",
           logits_attr="final_logit_softcapping", logits_classes=("Gemma3ForCausalLM",)),
    # Gemma3ForConditionalGeneration's forward is lm_head alone: no soft-cap, whatever its text config says
    Family("Gemma 3 (multimodal: its language model)", ("gemma3",), _llama_attn(), _LLAMA_MLP,
           layers="model.language_model.layers", norm="model.language_model.norm"),
    Family("OLMo", ("olmo",), _llama_attn(), _LLAMA_MLP),
    Family("OLMo 2", ("olmo2",), _llama_attn(), _LLAMA_MLP),
    Family("Granite", ("granite",), _llama_attn(), _LLAMA_MLP, logits="divide", logits_attr="logits_scaling",
           logits_classes=("GraniteForCausalLM",)),
    Family("Cohere Command-R", ("cohere",), _llama_attn(), _LLAMA_MLP, logits="multiply", logits_attr="logit_scale",
           logits_classes=("CohereForCausalLM",)),
    Family("Phi-3 / Phi-4-mini", ("phi3",),
           (Slot("self_attn.qkv_proj", ("q", "k", "v")), Slot("self_attn.o_proj", ("o",))),
           (Slot("mlp.gate_up_proj", ("gate", "up")), Slot("mlp.down_proj", ("down",)))),
    Family("Phi-1/2", ("phi",), _llama_attn(o="dense"), (Slot("mlp.fc1", ("fc_in",)), Slot("mlp.fc2", ("fc_out",))),
           norm="model.final_layernorm"),
    Family("StarCoder2", ("starcoder2",), _llama_attn(),
           (Slot("mlp.c_fc", ("fc_in",)), Slot("mlp.c_proj", ("fc_out",)))),
    Family("GPT-NeoX / Pythia", ("gpt_neox",),
           (Slot("attention.query_key_value", ("q", "k", "v"), interleave=True), Slot("attention.dense", ("o",))),
           (Slot("mlp.dense_h_to_4h", ("fc_in",)), Slot("mlp.dense_4h_to_h", ("fc_out",))),
           layers="gpt_neox.layers", norm="gpt_neox.final_layer_norm"),
    Family("GPT-2", ("gpt2",),
           (Slot("attn.c_attn", ("q", "k", "v"), conv1d=True), Slot("attn.c_proj", ("o",), conv1d=True)),
           (Slot("mlp.c_fc", ("fc_in",), conv1d=True), Slot("mlp.c_proj", ("fc_out",), conv1d=True)),
           layers="transformer.h", norm="transformer.ln_f"),
    Family("OLMo 3", ("olmo3",), _llama_attn(), _LLAMA_MLP),
    Family("Ministral, Ministral 3", ("ministral", "ministral3"), _llama_attn(), _LLAMA_MLP),
    Family("EXAONE 4", ("exaone4",), _llama_attn(), _LLAMA_MLP),
    Family("Seed-OSS", ("seed_oss",), _llama_attn(), _LLAMA_MLP),
    Family("InternLM3", ("internlm3",), _llama_attn(), _LLAMA_MLP),
    Family("ERNIE 4.5", ("ernie4_5",), _llama_attn(), _LLAMA_MLP),
    Family("Cohere2: Command R7B / A", ("cohere2",), _llama_attn(), _LLAMA_MLP, logits="multiply",
           logits_attr="logit_scale", logits_classes=("Cohere2ForCausalLM",)),
    Family("StableLM", ("stablelm",), _llama_attn(), _LLAMA_MLP),
    Family("GLM-4 (glm, glm4)", ("glm", "glm4"), _llama_attn(),
           (Slot("mlp.gate_up_proj", ("gate", "up")), Slot("mlp.down_proj", ("down",)))),
    Family("GPT-J", ("gptj",), _llama_attn(o="out_proj", prefix="attn"),
           (Slot("mlp.fc_in", ("fc_in",)), Slot("mlp.fc_out", ("fc_out",))), layers="transformer.h",
           norm="transformer.ln_f"),
    Family("Mixtral", ("mixtral",), _llama_attn(), experts=Experts("mlp.experts")),
    Family("Qwen3-MoE", ("qwen3_moe",), _llama_attn(), _LLAMA_MLP, experts=Experts("mlp.experts")),
    Family("OLMoE", ("olmoe",), _llama_attn(), experts=Experts("mlp.experts")),
    Family("Qwen2-MoE / Qwen1.5-MoE", ("qwen2_moe",), _llama_attn(), _LLAMA_MLP, experts=Experts("mlp.experts"),
           shared=_shared("mlp.shared_expert")),
    Family("GLM-4-MoE (GLM-4.5)", ("glm4_moe",), _llama_attn(), _LLAMA_MLP, experts=Experts("mlp.experts"),
           shared=_shared("mlp.shared_experts")),
    Family("ERNIE 4.5 MoE", ("ernie4_5_moe",), _llama_attn(), _LLAMA_MLP, experts=Experts("mlp.experts"),
           shared=_shared("mlp.shared_experts")),
)

#: families whose layout is known but that gac cannot compress well: model_type -> why (said before loading)
REFUSED = {
    "deepseek_v3": "its multi-head latent attention (q_a/q_b, kv_a/kv_b projections) is already low rank (a "
                   "low-rank compressor would factorise factors, and there are no K/V head groups for PaLU)",
    "deepseek_v2": "its multi-head latent attention (kv_a/kv_b projections) is already low rank (a low-rank "
                   "compressor would factorise factors, and there are no K/V head groups for PaLU)",
    "gpt_oss": "its experts interleave gate and up rows and carry biases and a clamped activation gac's expert "
               "module does not reproduce",
    "llama4": "a multimodal mixture of experts whose experts are stored transposed (packed_rowwise)",
    "llama4_text": "its experts are stored transposed (packed_rowwise) and interleave dense and MoE layers",
    "falcon": "its fused query_key_value layout depends on new_decoder_architecture / multi_query flags",
}

_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def supported_types() -> tuple[str, ...]:
    return tuple(sorted(_BY_TYPE))


def model_type_of(config) -> str | None:
    t = getattr(config, "model_type", None)
    return str(t) if t is not None else None


def family_of(config) -> Family:
    """The layout of ``config``'s family; a one-line :class:`GacError` for a family gac has no layout for (before any
    weight is loaded: this reads the config only)."""
    t = model_type_of(config)
    fam = _BY_TYPE.get(t)
    if fam is not None:
        return fam
    arch = ", ".join(getattr(config, "architectures", None) or []) or "?"
    if t in REFUSED:
        raise GacError(f"gac does not compress {t} models ({arch}): {REFUSED[t]}; gac supports "
                       f"{', '.join(supported_types())}")
    plan = getattr(config, "base_model_tp_plan", None) or {}
    named = sorted({k.split("layers.*.", 1)[-1] for k in plan if "layers.*." in k})
    hint = f" (its tensor-parallel plan names {', '.join(named[:8])})" if named else ""
    raise GacError(f"gac has no layout for model_type {t!r} ({arch}){hint}; gac supports "
                   f"{', '.join(supported_types())}. A new family is one Family entry in "
                   f"gac/compression/layouts.py")


def role_of(name: str) -> str:
    """A role given by its name or Llama's module name (``q`` or ``q_proj``)."""
    r = LLAMA_NAMES.get(name, name)
    if r not in ROLES:
        raise GacError(f"unknown projection {name!r}; choose among the roles {', '.join(ROLES)} (or Llama's names "
                       f"{', '.join(LLAMA_NAMES)})")
    return r


def logit_transform(fam: Family, model, text_config) -> tuple[str, float | None]:
    """``(kind, value)`` of the transform ``model``'s own forward applies after its head: the family's, when the
    model's class (or a class it derives from) is one of ``fam.logits_classes`` and its text config sets the value;
    ``("none", None)`` otherwise."""
    value = getattr(text_config, fam.logits_attr, None) if fam.logits_attr else None
    applies = {c.__name__ for c in type(model).__mro__} & set(fam.logits_classes)
    if value is None or not applies:
        return "none", None
    return fam.logits, float(value)


def transform_logits(logits, kind: str, value):
    """Apply a family's logit transform (:class:`Family` ``logits``) to ``logits``."""
    if kind == "none" or value is None:
        return logits
    import torch

    if kind == "divide":
        return logits / value
    if kind == "multiply":
        return logits * value
    if kind == "softcap":
        return torch.tanh(logits / value) * value
    raise GacError(f"unknown logit transform {kind!r}")
