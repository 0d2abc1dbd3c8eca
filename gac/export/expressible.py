"""What a model can be exported as, decided from its structure alone (shapes on the ``meta`` device, no weight read),
so that a format that cannot hold it is refused before any work.

* ``onnx`` holds every model gac loads: the graph is traced from the model's own forward.
* ``gguf`` holds what llama.cpp's Llama architectures compute: a ``llama``-family model whose projections are all
  dense ``Linear`` s (pruned widths included, low-rank factors not), no biases, default or Llama-3 RoPE. Uniform
  widths and head counts are llama.cpp's ``llama`` architecture; per-layer MLP widths or head counts its ``deci``
  architecture, the one whose tensors are created from per-layer ``feed_forward_length`` / ``head_count`` /
  ``head_count_kv`` arrays (llama.cpp reads those arrays for every architecture, but ``llama`` builds every layer at
  layer 0's sizes).
* ``hf`` (a plain Hugging Face folder) holds what transformers builds from a config: every parameter's name and
  shape those of the architecture built from the written config (uniform widths: one MLP width and, in a
  mixture-of-experts model, one expert width in every layer, as LLM-Pruner's ``expert_width=shared`` leaves when
  its layers agree; no low-rank, split or per-expert modules).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from gac.align.engine_types import LLAMA_CPP_TYPES, parse_engine
from gac.errors import GacError, unknown_name

FORMATS = ("onnx", "gguf", "hf")
#: --quant name -> llama.cpp's file type name (what its quantizer makes from an f32 file), from the one table of
#: engine types (:data:`gac.align.engine_types.LLAMA_CPP_TYPES`)
GGUF_TYPES = {t: ftype for t, (ftype, _) in LLAMA_CPP_TYPES.items()}
UNQUANTIZED = tuple(t for t, (_, block) in LLAMA_CPP_TYPES.items() if block is None)  # f32, f16
ROPE_TYPES = ("default", "llama3")  # the RoPE llama.cpp's Llama architectures compute (llama3: a rope_freqs tensor)


@dataclass
class Source:
    """The model to export, as far as it is known before loading: its spec, kind, config and a weightless skeleton."""

    spec: str
    kind: str  # "builtin", "checkpoint" or "local" (gac.models.model_kind)
    config: object  # the base transformers config
    skeleton: nn.Module  # the (compressed) structure on the meta device
    has_tokenizer: bool = True
    meta: dict | None = None  # a gac checkpoint's config

    @property
    def model_type(self) -> str:
        return str(getattr(self.config, "model_type", "?"))


@dataclass(frozen=True)
class GgufLayout:
    """The llama.cpp architecture and the per-layer sizes a GGUF file declares."""

    arch: str  # "llama" (uniform sizes) or "deci" (per-layer arrays)
    n_ff: tuple[int, ...]
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_dim: int
    tied: bool
    rope_type: str


@dataclass
class Verdicts:
    """Per format: what it holds (a :class:`GgufLayout`, an HF config dict, True) or why it cannot (a str)."""

    results: dict = field(default_factory=dict)

    def can(self) -> list[str]:
        return [f for f in FORMATS if not isinstance(self.results.get(f), str)]


def describe(spec: str | os.PathLike) -> Source:
    """The :class:`Source` of ``spec`` (a gac checkpoint, a named model or a local HF directory), from its config."""
    import torch
    from transformers import AutoModelForCausalLM

    from gac.models import model_kind

    s = str(spec)
    kind = model_kind(s)
    if kind == "hub":
        raise GacError(f"{s!r} is a hub id; gac export reads a gac checkpoint, a named model (tiny, smollm2) or a local "
                       f"Hugging Face directory: download it first and pass the directory")
    if kind == "checkpoint":
        from gac.compression.checkpoint_format import read_meta
        from gac.compression.checkpoint_load import build_skeleton

        meta = read_meta(s)
        skeleton = build_skeleton(meta, meta_device=True)
        return Source(s, kind, skeleton.config, skeleton, bool(meta.get("tokenizer_files")), meta)
    if kind == "builtin":
        from gac.fixtures import named_config

        config = named_config(s)
    else:
        from gac.models import hf_config

        config = hf_config(Path(s).expanduser())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return Source(s, kind, config, skeleton)


def verdicts(src: Source) -> Verdicts:
    """What each format makes of ``src`` (:class:`Verdicts`)."""
    out = Verdicts()
    out.results["onnx"] = True
    for fmt, judge in (("gguf", gguf_layout), ("hf", hf_config_of)):
        try:
            out.results[fmt] = judge(src)
        except GacError as e:
            out.results[fmt] = str(e)
    return out


def check_format(src: Source, fmt: str):
    """What ``fmt`` holds of ``src`` (see :class:`Verdicts`), or a one-line :class:`GacError` naming why not and the
    formats that can."""
    if fmt not in FORMATS:
        raise unknown_name("export format (--format)", fmt, FORMATS)
    v = verdicts(src)
    got = v.results[fmt]
    if isinstance(got, str):
        others = [f for f in v.can() if f != fmt]
        raise GacError(f"--format {fmt} cannot express {src.spec!r}: {got}; export it as "
                       f"{' or '.join(others) if others else 'none of ' + ', '.join(FORMATS)} instead")
    return got


def check_quant(fmt: str, quant: str | None) -> str | None:
    """``--quant`` for ``fmt``: a GGUF type name (default f32), or None for the other formats."""
    if fmt != "gguf":
        if quant is not None:
            raise GacError(f"--quant {quant} applies to --format gguf only; drop it for --format {fmt}")
        return None
    if quant is None:
        return UNQUANTIZED[0]
    try:
        return parse_engine(f"llama.cpp:{quant}")[1]  # the type as --engine llama.cpp:TYPE reads it
    except GacError:
        raise unknown_name("GGUF type (--quant)", quant, GGUF_TYPES) from None


# ------------------------------------------------------------------------------------------------------------ gguf


def _kind(m: nn.Module) -> str:
    return type(m).__name__


def gguf_layout(src: Source) -> GgufLayout:
    """The :class:`GgufLayout` of ``src``, or a :class:`GacError` saying why llama.cpp cannot run it."""
    cfg = src.config
    if src.model_type != "llama":
        raise GacError(f"llama.cpp's llama/deci architectures hold Llama-family models (model_type 'llama'), and this "
                       f"is a {src.model_type!r} model")
    if not src.has_tokenizer:
        raise GacError("it holds no tokenizer, and a GGUF file carries its vocabulary")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise GacError("its projections have biases, which llama.cpp's llama/deci graphs do not all add")
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = str(rope.get("rope_type", "default"))
    if rope_type not in ROPE_TYPES:
        raise GacError(f"its RoPE is {rope_type!r}; gac writes llama.cpp's {' and '.join(ROPE_TYPES)} RoPE")
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    layers = src.skeleton.model.layers
    n_ff, n_head, n_kv = [], [], []
    for i, layer in enumerate(layers):
        att, mlp = layer.self_attn, layer.mlp
        mods = {"q_proj": att.q_proj, "k_proj": att.k_proj, "v_proj": att.v_proj, "o_proj": att.o_proj,
                "gate_proj": mlp.gate_proj, "up_proj": mlp.up_proj, "down_proj": mlp.down_proj}
        for name, m in mods.items():
            if not isinstance(m, nn.Linear):
                what = "low-rank factors" if "LowRank" in _kind(m) else f"a {_kind(m)}"
                raise GacError(f"it holds {what} (model.layers.{i}.*.{name}), which GGUF's llama/deci tensors cannot "
                               f"hold (one dense matrix per projection)")
        q, k, v = (mods[n].out_features for n in ("q_proj", "k_proj", "v_proj"))
        o = mods["o_proj"].in_features
        if q % head_dim or k % head_dim or k != v or o != q or (q // head_dim) % max(k // head_dim, 1):
            raise GacError(f"layer {i}'s attention (q {q}, k {k}, v {v} rows, o {o} columns) is not whole heads of "
                           f"{head_dim}")
        w = mlp.gate_proj.out_features
        if mlp.up_proj.out_features != w or mlp.down_proj.in_features != w:
            raise GacError(f"layer {i}'s MLP widths differ (gate {w}, up {mlp.up_proj.out_features}, down "
                           f"{mlp.down_proj.in_features})")
        n_ff.append(w)
        n_head.append(q // head_dim)
        n_kv.append(k // head_dim)
    uniform = len(set(n_ff)) == len(set(n_head)) == len(set(n_kv)) == 1
    return GgufLayout("llama" if uniform else "deci", tuple(n_ff), tuple(n_head), tuple(n_kv), head_dim,
                      bool(getattr(cfg, "tie_word_embeddings", False)), rope_type)


# -------------------------------------------------------------------------------------------------------------- hf


_WIDTH_KEYS = ("intermediate_size", "n_inner", "ffn_dim")  # the MLP width's name in the families' configs
#: an expert's width in the MoE families' configs: Qwen3-MoE's own key, else the MLP's (Mixtral's, OLMoE's)
_EXPERT_WIDTH_KEYS = ("moe_intermediate_size", "intermediate_size")


def _shapes(model: nn.Module) -> dict:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _expert_widths(model: nn.Module) -> dict[str, int]:
    """Every fused experts block of ``model`` (transformers' 3-D experts: pruned ones too) -> its experts' width."""
    from gac.compression.modules import is_fused_experts

    return {n: int(m.down_proj.shape[-1]) for n, m in model.named_modules() if is_fused_experts(m)}


def hf_config_of(src: Source) -> dict:
    """The ``config.json`` content under which transformers builds exactly ``src``'s parameters, or a
    :class:`GacError` saying why none does."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    mods = src.meta.get("modules", {}) if src.meta else {}
    odd = sorted({spec.get("type") for spec in mods.values()} - {"linear", "conv1d", "fused_experts"})
    if odd:
        first = next(n for n, spec in mods.items() if spec.get("type") in odd)
        kind = {"lowrank": "low-rank factors", "grouped_lowrank": "group-wise low-rank factors (PaLU)",
                "split": "a fused projection split into parts", "experts": "experts of their own widths"}.get(
            mods[first].get("type"), f"{mods[first].get('type')} modules")
        raise GacError(f"it holds {kind} ({first}), which no transformers architecture builds from a config")
    base = src.config.to_dict()
    target = _shapes(src.skeleton)
    widths = {spec["out"] for n, spec in mods.items()
              if spec.get("type") == "linear" and n.rsplit(".", 1)[-1] in ("gate_proj", "fc1", "c_fc", "fc_in")}
    widths |= {spec["in"] for n, spec in mods.items()
               if spec.get("type") == "linear" and n.rsplit(".", 1)[-1] in ("down_proj", "fc2", "fc_out")}
    experts = set(_expert_widths(src.skeleton).values())  # LLM-Pruner's shared width: one per layer
    mlp_opts = [{key: w} for w in widths for key in _WIDTH_KEYS if key in base] if len(widths) == 1 else []
    expert_opts = [{key: w} for w in experts for key in _EXPERT_WIDTH_KEYS if key in base] if len(experts) == 1 else []
    # the base config, then every way of writing the one MLP width and the one expert width into its keys
    candidates = [base] + [{**base, **m, **e} for m in mlp_opts or [{}] for e in expert_opts or [{}] if m or e]
    for cand in candidates:
        c = dict(cand)
        model_type = c.pop("model_type")
        try:
            config = AutoConfig.for_model(model_type, **c)
            with torch.device("meta"):
                ref = AutoModelForCausalLM.from_config(config)
        except Exception:  # noqa: BLE001 - a config transformers refuses expresses nothing
            continue
        if _shapes(ref) == target:
            return config.to_dict()
    return _refuse_widths(src)


def _refuse_widths(src: Source):
    experts = _expert_widths(src.skeleton)
    if len(set(experts.values())) > 1:
        shown = ", ".join(str(w) for w in list(experts.values())[:8])
        raise GacError(f"its experts' widths differ from layer to layer ({shown}{' ...' if len(experts) > 8 else ''}), "
                       f"and a transformers config has one expert width for every layer")
    widths = {}
    for name, spec in (src.meta or {}).get("modules", {}).items():
        if spec.get("type") == "linear" and name.rsplit(".", 1)[-1] in ("gate_proj", "fc1", "c_fc", "fc_in"):
            widths[name.rsplit(".", 2)[0]] = spec["out"]
    if len(set(widths.values())) > 1:
        shown = ", ".join(str(w) for w in list(widths.values())[:8])
        raise GacError(f"its MLP widths differ from layer to layer ({shown}{' ...' if len(widths) > 8 else ''}), and "
                       f"a transformers config has one width for every layer")
    raise GacError(f"no {src.model_type} config builds its parameters' shapes")
