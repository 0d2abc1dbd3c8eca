"""The model configs of the non-Llama families (conf/model): each composes as a job config, its `arch` block builds the
real architecture on the meta device (no weights) with the published parameter count, and discovery finds the
family's roles, and the expert blocks of the mixtures of experts."""

import inspect

import pytest
from omegaconf import OmegaConf

from gac.compression.discovery import discover_config, skeleton
from gac.compression.layouts import ATTN_ROLES, GATED_ROLES, PLAIN_ROLES
from gac.compression.structure import architecture
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config

# Published parameter counts (the model card or report; for Gemma 3 the language model alone, without the 417M
# vision tower the multimodal checkpoint also holds).
PUBLISHED = {
    "gemma3_4b": 3.875e9,  # Gemma 3 technical report, Table 1: 675M embedding + 3.2B non-embedding
    "gemma3_12b": 11.8e9,  # Gemma 3 technical report, Table 1: 1B embedding + 10.8B non-embedding
    "qwen3_8b": 8.2e9,  # Qwen3-8B model card: "Number of Parameters: 8.2B"
    "olmo2_7b": 7.3e9,  # OLMo-2-1124-7B safetensors: 7.3B params
    "phi4_mini": 3.84e9,  # Phi-4-mini-instruct model card: 3.8B (3,836,021,760)
    "mixtral_8x7b": 46.7e9,  # Mistral AI's Mixtral announcement: 46.7B total, 12.9B active
    "qwen3_30b_a3b": 30.5e9,  # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    "pythia_6.9b": 6_857_302_016,  # Pythia model card: total params of pythia-6.9b
    "granite_3_8b": 8.1e9,  # Granite-3.1-8B-Base model card: 8.1B
}

GATED = set(ATTN_ROLES + GATED_ROLES)
# name -> (family, roles in every layer, KV heads, head_dim, (experts, width) per layer or None, logit transform)
EXPECTED = {
    "gemma3_4b": ("Gemma 3 (text)", GATED, 4, 256, None, "none"),
    "gemma3_12b": ("Gemma 3 (text)", GATED, 8, 256, None, "none"),
    "qwen3_8b": ("Qwen3", GATED, 8, 128, None, "none"),
    "olmo2_7b": ("OLMo 2", GATED, 32, 128, None, "none"),
    "phi4_mini": ("Phi-3 / Phi-4-mini", GATED, 8, 128, None, "none"),
    "mixtral_8x7b": ("Mixtral", set(ATTN_ROLES), 8, 128, (8, 14336), "none"),
    "qwen3_30b_a3b": ("Qwen3-MoE", set(ATTN_ROLES), 4, 128, (128, 768), "none"),
    "pythia_6.9b": ("GPT-NeoX / Pythia", set(ATTN_ROLES + PLAIN_ROLES), 32, 128, None, "none"),
    "granite_3_8b": ("Granite", GATED, 8, 128, None, "divide"),
}

# `arch` keys the config classes take under their legacy names and turn into rope_parameters
LEGACY_ROPE_KEYS = {"rope_theta", "rope_scaling", "rope_local_base_freq", "partial_rotary_factor", "rotary_pct",
                    "rotary_emb_base"}


def _spec(name):
    cfg = compose_config([f"model={name}", "model.random_weights=true", "gpu=cpu", "eval=none", "calibration.source=random"])
    return spec_from_config(OmegaConf.to_container(cfg, resolve=True))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_family_config_builds_the_published_architecture(name):
    spec = _spec(name)
    assert spec.random_weights and spec.arch
    config = architecture(spec.model_spec, random_weights=True, arch=dict(spec.arch))
    model = skeleton(config)
    # every `arch` key is one the family's config class takes or its modeling code reads (Qwen3-MoE's head_dim): a
    # misspelt key would be kept on the config silently and change nothing
    taken = set(inspect.signature(type(config).__init__).parameters) | LEGACY_ROPE_KEYS | {"model_type"}
    source = inspect.getsource(inspect.getmodule(type(model)))
    assert not [k for k in spec.arch if k not in taken and f'"{k}"' not in source and f".{k}" not in source]

    layout = discover_config(config)
    family, roles, kv, head_dim, experts, logits = EXPECTED[name]
    assert layout.family == family
    assert (layout.num_layers, layout.num_kv_heads, layout.head_dim) == (
        spec.arch["num_hidden_layers"], kv, head_dim)
    assert layout.logits == logits
    for li in range(layout.num_layers):
        assert {p.role for p in layout.projections if p.layer == li} == roles, li
    if experts is None:
        assert layout.experts == ()
    else:
        assert len(layout.experts) == layout.num_layers
        assert {(e.num_experts, e.width, e.hidden) for e in layout.experts} == {(*experts, spec.arch["hidden_size"])}
        assert all(not layout.mlp_of(li) for li in range(layout.num_layers))  # no dense MLP beside the experts

    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    assert params == pytest.approx(PUBLISHED[name], rel=0.01), f"{name}: {params:,} parameters"


def test_fused_and_interleaved_families_split_into_their_roles():
    phi = discover_config(architecture("phi4_mini", True, dict(_spec("phi4_mini").arch)))
    q, k, v = (phi.projection(0, r) for r in ("q", "k", "v"))
    assert q.module == k.module == v.module == "model.layers.0.self_attn.qkv_proj"
    assert (q.out_features, k.out_features, v.out_features) == (24 * 128, 8 * 128, 8 * 128)
    neox = discover_config(architecture("pythia_6.9b", True, dict(_spec("pythia_6.9b").arch)))
    q = neox.projection(0, "q")
    assert q.module == "gpt_neox.layers.0.attention.query_key_value" and len(q.rows) == 32  # one block per head
    granite = discover_config(architecture("granite_3_8b", True, dict(_spec("granite_3_8b").arch)))
    assert granite.logit_value == 16.0  # logits_scaling: the logits are divided by it


@pytest.mark.parametrize("name", ["phi4_mini", "pythia_6.9b", "mixtral_8x7b", "gemma3_4b", "qwen3_8b", "olmo2_7b",
                                  "granite_3_8b"])
def test_predict_refuses_a_family_not_laid_out_as_llama(name, capsys):
    """The predictor's kernels are Llama's: a family with other kernels (fused weights, experts, Gemma's extra norms
    and GELU, q/k norms, Granite's multipliers) is refused, not predicted as if it were Llama."""
    from gac.cli import main

    assert main(["predict", "--gpu", "h100", "--model", name, "--seq-len", "512"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Llama-shaped decoder" in err and "Traceback" not in err
