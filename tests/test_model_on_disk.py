"""A model is checked as it is on disk before its weights load: the config values no model runs with
(:func:`gac.untrusted.config_field_problem`), never one a real model has; the weights' shapes after transformers'
expert stacking (:func:`gac.models.checks.check_hf_dir`); an ``ExpertMLPs`` never silently drops the tokens routed
past its experts. The catalogue rows (docs/bad-input.md, "Fifth catalogue") run the commands."""

from __future__ import annotations

import shutil

import pytest

from gac.errors import GacError
from gac.untrusted import config_field_problem

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


@pytest.mark.parametrize("edit,field", [
    ({"sliding_window": 0}, "sliding_window is 0"),
    ({"sliding_window": -1}, "sliding_window is -1"),
    ({"sliding_window": 4.5}, "sliding_window is 4.5"),
    ({"logits_scaling": -8.0}, "logits_scaling is -8.0"),
    ({"logit_scale": 0}, "logit_scale is 0"),
    ({"logit_scale": float("nan")}, "logit_scale is nan"),
    ({"final_logit_softcapping": 0}, "final_logit_softcapping is 0"),
    ({"attn_logit_softcapping": 1e-30}, "attn_logit_softcapping is 1e-30"),
    ({"query_pre_attn_scalar": -1}, "query_pre_attn_scalar is -1"),
    ({"num_experts_per_tok": 0, "num_local_experts": 8}, "num_experts_per_tok is 0, not a whole number from 1 to "
                                                          "num_local_experts 8"),
    ({"num_experts_per_tok": 9, "num_experts": 8}, "num_experts_per_tok is 9"),
    ({"num_experts_per_tok": -2, "n_routed_experts": 8}, "num_experts_per_tok is -2"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok is 0"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor is 1.5, not a number in (0, 1]"),
    ({"rotary_pct": 0}, "rotary_pct is 0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 2}},
     "rope_parameters.partial_rotary_factor is 2"),
    ({"head_dim": 15}, "the rotary dimension (head dimension 15) is 15, an odd number"),
    ({"partial_rotary_factor": 0.3, "head_dim": 10}, "is 3, an odd number"),
    ({"num_key_value_heads": 0}, "num_key_value_heads is 0, not a whole number >= 1"),
    ({"hidden_size": "64"}, "hidden_size is '64'"),
    ({"num_hidden_layers": -1}, "num_hidden_layers is -1"),
    ({"text_config": {"sliding_window": 0}}, "text_config.sliding_window is 0"),
])
def test_a_config_value_no_model_runs_with_is_named(edit, field):
    why = config_field_problem({**LLAMA, **edit})
    assert why is not None and field in why


@pytest.mark.parametrize("edit", [
    {"sliding_window": None}, {"sliding_window": 0, "use_sliding_window": False}, {"sliding_window": 4096},
    {"final_logit_softcapping": None, "attn_logit_softcapping": 50.0}, {"logits_scaling": 8.0},
    {"num_experts_per_tok": 8, "num_local_experts": 8}, {"partial_rotary_factor": 0.5}, {"rotary_pct": 0.25},
    {"intermediate_size": [128, 128]},  # Gemma 3n: one width per layer
])
def test_the_values_real_models_have_pass(edit):
    assert config_field_problem({**LLAMA, **edit}) is None


def test_no_default_config_of_a_causal_lm_transformers_ships_is_refused():
    """Every causal LM config class transformers ships, at its defaults (its reference model's values), passes: the
    check refuses values no model runs with, never a family's own."""
    import warnings

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    refused, checked = {}, 0
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg = CONFIG_MAPPING[model_type]().to_dict()
        except Exception:  # noqa: BLE001 - a config class that needs arguments: nothing to check
            continue
        checked += 1
        why = config_field_problem(cfg)
        if why:
            refused[model_type] = why
    assert checked > 100 and not refused, refused


def test_a_hub_config_is_checked_as_a_directory_config_is():
    from transformers import MixtralConfig

    from gac.untrusted import check_config_values

    check_config_values(MixtralConfig(num_experts_per_tok=2), "'org/ok'")
    with pytest.raises(GacError, match=r"the config of 'org/m': num_experts_per_tok is 0"):
        check_config_values(MixtralConfig(num_experts_per_tok=0), "'org/m'")


def test_expert_mlps_refuse_a_router_index_past_their_experts():
    import torch

    from gac.compression.modules import ExpertMLPs

    m = ExpertMLPs(8, [4, 4, 4], "silu")
    x, w = torch.randn(5, 8), torch.full((5, 2), 0.5)
    assert m(x, torch.tensor([[0, 2]] * 5), w).abs().sum() > 0
    for top in (3, 7):  # 3: the index transformers' own loop skips; 7: past it
        with pytest.raises(GacError, match=f"the router picked expert {top}, but this ExpertMLPs holds 3 experts"):
            m(x, torch.tensor([[0, top]] * 5), w)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    from transformers import MixtralConfig

    from tests.bad_input_fixtures_modelchecks import SMALL, random_model

    d = tmp_path_factory.mktemp("mixtral") / "m"
    d.mkdir()
    return random_model(d, MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2))


def test_a_mixtral_directory_passes_with_its_experts_stacked_as_transformers_loads_them(mixtral):
    from gac.models.checks import check_hf_dir

    assert check_hf_dir(mixtral).num_local_experts == 4


def test_experts_of_unequal_shapes_are_refused_before_loading(mixtral, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from gac.models.checks import check_hf_dir

    d = tmp_path / "m"
    shutil.copytree(mixtral, d)
    sd = load_file(str(d / "model.safetensors"))
    name = next(k for k in sd if ".experts.2.w1." in k)
    sd[name] = torch.zeros(sd[name].shape[0] + 8, sd[name].shape[1])
    (d / "model.safetensors").unlink()
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(GacError, match=r"the experts' '.experts.N.w1.weight' for "
                                       r"'model.layers.0.mlp.experts.gate_up_proj' have different shapes"):
        check_hf_dir(d)
