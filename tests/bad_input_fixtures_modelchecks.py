"""The files the "Fifth catalogue: models as they are on disk" rows of docs/bad-input.md name: copies of tiny's
Hugging Face directory whose config.json holds a value no model runs with, random-weight models of other families
(Mixtral, Gemma 3, Phi-3, GPT-2; a few hundred KB each) whose config.json is not their weights', and gac checkpoints
whose base config or expert modules disagree with the model. Every name starts with ``mc_``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: the tiny sizes of the random-weight models (tiny's tokenizer: 4096 ids)
SMALL = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "bos_token_id": 0,
         "eos_token_id": 0, "pad_token_id": 0}


def _tiny(T: Path, case: str, edit) -> Path:
    """A copy of tiny's HF directory (weights hard-linked where possible), ``edit(config)`` applied."""
    from gac.fixtures.tiny import tiny_dir
    from tests.bad_store_fixtures import copy_tiny_hf

    d = T / f"mc_{case}"
    d.mkdir()
    copy_tiny_hf(tiny_dir(), d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def random_model(d: Path, config) -> Path:
    """A random-weight causal LM of ``config`` saved in ``d`` with tiny's tokenizer (seeded: the same files each
    time)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gac.fixtures.tiny import tiny_dir

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(d))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir() / f, d / f)
    return d


def _variant(src: Path, d: Path, edit=None, drop: tuple[str, ...] = ()) -> Path:
    """A copy of model directory ``src``: ``edit(config)`` applied, the tensors whose names contain one of ``drop``
    removed from its weights."""
    shutil.copytree(src, d)
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
    if drop:
        from safetensors.torch import load_file, save_file

        sd = {k: v for k, v in load_file(str(d / "model.safetensors")).items() if not any(x in k for x in drop)}
        (d / "model.safetensors").unlink()
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _config_values(T: Path) -> None:
    """tiny's directory with one value no model runs with (the family named where the field is its own)."""
    _tiny(T, "swin0", lambda c: c.update(sliding_window=0))
    _tiny(T, "swin_neg", lambda c: c.update(sliding_window=-4))
    _tiny(T, "granite_neg", lambda c: c.update(model_type="granite", architectures=["GraniteForCausalLM"],
                                               logits_scaling=-8.0))
    _tiny(T, "cohere0", lambda c: c.update(model_type="cohere", architectures=["CohereForCausalLM"], logit_scale=0))
    _tiny(T, "softcap0", lambda c: c.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"],
                                            final_logit_softcapping=0))
    _tiny(T, "softcap_tiny", lambda c: c.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"],
                                                final_logit_softcapping=1e-30))
    _tiny(T, "qpas_neg", lambda c: c.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"],
                                            query_pre_attn_scalar=-64))
    _tiny(T, "rot15", lambda c: c["rope_parameters"].update(partial_rotary_factor=1.5))
    _tiny(T, "rotpct2", lambda c: c.update(rotary_pct=2.0))
    _tiny(T, "rot_odd", lambda c: c["rope_parameters"].update(partial_rotary_factor=0.515625))  # 33 of 64 dims
    _tiny(T, "kv0", lambda c: c.update(num_key_value_heads=0))


def _mixtral(T: Path) -> None:
    """A random Mixtral of 4 experts, and copies with experts per token out of range or an expert missing."""
    from transformers import MixtralConfig

    src = random_model(T / "mc_mixtral", MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2))
    _variant(src, T / "mc_mixtral_top0", lambda c: c.update(num_experts_per_tok=0))
    _variant(src, T / "mc_mixtral_top9", lambda c: c.update(num_experts_per_tok=9))
    _variant(src, T / "mc_mixtral_gap", drop=(".experts.1.",))  # expert 1 of 4 gone
    _variant(src, T / "mc_mixtral_short", drop=(".experts.3.",))  # the last expert gone


def _disagreeing(T: Path) -> None:
    """Random Gemma 3, Phi-3 and GPT-2 models whose config.json was changed after they were saved."""
    from transformers import Gemma3TextConfig, GPT2Config, Phi3Config

    g = random_model(T / "mc_gemma3", Gemma3TextConfig(**SMALL, head_dim=16, query_pre_attn_scalar=16,
                                                       sliding_window=64))
    _variant(g, T / "mc_gemma3_hd", lambda c: c.update(head_dim=32, query_pre_attn_scalar=32))
    p = random_model(T / "mc_phi3", Phi3Config(**SMALL))
    _variant(p, T / "mc_phi3_rows", lambda c: c.update(num_key_value_heads=4))  # qkv_proj rows of 2 KV heads
    gpt2 = random_model(T / "mc_gpt2_llama", GPT2Config(vocab_size=4096, n_embd=64, n_layer=1, n_head=4,
                                                        n_positions=256, bos_token_id=0, eos_token_id=0))
    # GPT-2's weights under a config that says only llama (transformers' defaults fill in a Llama-7B)
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))


def _checkpoints(T: Path) -> None:
    """Copies of the catalogue's tiny checkpoint ``T/ck`` whose base config holds a value no model runs with, the
    config's hash recomputed (a deliberate edit, not damage); and a Mixtral checkpoint whose ``ExpertMLPs`` holds 3
    experts where its router picks among 4."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_format import META_FILE, meta_sha256
    from gac.compression.modules import ExpertMLPs
    from gac.compression.swap import replace_module
    from gac.fixtures.tiny import tiny_dir
    from tests.bad_store_fixtures import _edit_json, _link_copy

    def rehashed(case: str, edit) -> None:
        def apply(m):
            edit(m["base_config"])
            m["meta_sha256"] = meta_sha256(m)

        _edit_json(_link_copy(T / "ck", T / f"mc_ck_{case}") / META_FILE, apply)

    rehashed("swin0", lambda b: b.update(sliding_window=0))
    rehashed("rot15", lambda b: b["rope_parameters"].update(partial_rotary_factor=1.5))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2))
    replace_module(model, "model.layers.0.mlp.experts", ExpertMLPs(64, [16, 16, 16], "silu"))
    save_checkpoint(model, AutoTokenizer.from_pretrained(str(tiny_dir())), T / "mc_ck_router")


def modelchecks_files(T: Path) -> None:
    """Every input of the "Fifth catalogue: models as they are on disk" rows, under ``T`` (``T/ck`` made first)."""
    _config_values(T)
    _mixtral(T)
    _disagreeing(T)
    _checkpoints(T)
