"""Every model family gac has a layout for, compressed by every compressor that applies: random-weight models in each
family's real layout, built from transformers' own config classes (no download, a second or so each).

For each (family, compressor): the plan's parameter count is the model's, the fusion is respected (a fused module
becomes a split one, the roles it keeps dense hold the original rows exactly), the compressed model's logits are
finite, a gac checkpoint reloads to identical logits, and the audit reads the compressed model. Families gac cannot
compress are refused in one line from the config, before any weight exists.
"""

from __future__ import annotations

import math

import pytest
import torch

from gac.compression.layouts import FAMILIES, ROLES
from gac.errors import GacError

H, WIDTH, V, L = 64, 96, 128, 2  # hidden, MLP width, vocabulary, layers
COMMON = dict(hidden_size=H, intermediate_size=WIDTH, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, vocab_size=V, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)

#: model_type -> the config arguments that make a small model of the family's real layout
FAMILY_ARGS = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "smollm3": {}, "gemma": {}, "olmo": {}, "olmo2": {},
    "gemma2": dict(final_logit_softcapping=30.0, sliding_window=16),
    "gemma3_text": dict(final_logit_softcapping=30.0, sliding_window=16, num_key_value_heads=1),
    "granite": dict(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.25),
    "cohere": dict(logit_scale=0.5),
    "phi3": dict(pad_token_id=0),
    "phi": dict(num_key_value_heads=4, head_dim=None, partial_rotary_factor=0.5),
    "starcoder2": dict(),
    "gpt_neox": dict(num_key_value_heads=None, head_dim=None, rotary_pct=0.25),
    "gpt2": dict(n_embd=H, n_layer=L, n_head=4, n_positions=64, n_inner=WIDTH),
    "olmo3": dict(sliding_window=16), "ministral": dict(sliding_window=16), "ministral3": dict(sliding_window=16),
    "exaone4": dict(sliding_window=16), "seed_oss": dict(attention_bias=True),
    "internlm3": dict(bias=True, qkv_bias=True), "ernie4_5": dict(use_bias=True),
    "cohere2": dict(logit_scale=0.5, sliding_window=16),
    "stablelm": dict(use_qkv_bias=True, qk_layernorm=True, partial_rotary_factor=0.25),
    "glm": dict(partial_rotary_factor=0.5, attention_bias=True), "glm4": dict(partial_rotary_factor=0.5, attention_bias=True),
    "gptj": dict(n_embd=H, n_layer=L, n_head=4, n_positions=64, n_inner=WIDTH, rotary_dim=8),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1,
                      mlp_only_layers=[1]),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=96,
                      decoder_sparse_step=1, mlp_only_layers=[1]),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                     first_k_dense_replace=1, partial_rotary_factor=0.5, use_qk_norm=True, attention_bias=True),
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=48, moe_num_shared_experts=1,
                         moe_layer_start_index=1, use_bias=True),
}
SKIP_TYPES = {"gemma3"}  # the multimodal Gemma 3 is its text model's layout under model.language_model (tested below)
COMPRESSORS = ("asvd", "svd_llm", "llm_pruner", "palu", "stable_rank_svd")


def family_config(model_type: str):
    from transformers import AutoConfig

    kw = {**COMMON, **FAMILY_ARGS[model_type]}
    if model_type in ("gpt2", "gptj"):  # their own names for the sizes
        kw = {k: v for k, v in kw.items() if k in ("vocab_size", "tie_word_embeddings", "bos_token_id",
                                                   "eos_token_id", "pad_token_id")} | FAMILY_ARGS[model_type]
    kw = {k: v for k, v in kw.items() if v is not None}
    return AutoConfig.for_model(model_type, **kw)


def family_model(model_type: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(family_config(model_type)).eval()
    with torch.no_grad():  # norms at 1 and random projections of a scale that keeps the activations finite
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.05)
    return m


TYPES = [t for f in FAMILIES for t in f.model_types if t not in SKIP_TYPES]


def test_every_family_has_a_small_model_here():
    assert sorted(TYPES) == sorted(FAMILY_ARGS)


@pytest.mark.parametrize("model_type", TYPES)
def test_layout_matches_the_model_and_its_tp_plan(model_type):
    from gac.compression.discovery import discover

    m = family_model(model_type)
    lay = discover(m)
    assert lay.num_layers == L and lay.hidden_size == H
    roles = {p.role for p in lay.projections}
    assert {"q", "k", "v", "o"} <= roles and roles <= set(ROLES)
    for p in lay.projections:  # each projection's rows are a real part of its module's output
        w = m.get_submodule(p.module).weight
        out_f = w.shape[1] if p.conv1d else w.shape[0]
        assert p.out_features == len(p.row_index()) and max(p.row_index()) < out_f
    # every module the family's tensor-parallel plan splits is one the layout names (the table cannot drift from
    # what transformers says about the family)
    plan = getattr(m.config, "base_model_tp_plan", None) or {}
    named = {p.module.split(".", 3)[-1] for p in lay.projections} | {e.module.split(".", 3)[-1] for e in lay.experts}
    each = lay.layers_path.rsplit(".", 1)[-1] + ".*."  # "layers.*." ("h.*." for GPT-J)
    for key, style in plan.items():
        if key.startswith(each) and style in ("colwise", "rowwise", "colwise_gather_output",
                                              "rowwise_split_input", "packed_colwise"):
            sub = key.removeprefix(each)
            if ".experts." in sub:
                sub = sub.rsplit(".", 1)[0]
            if lay.experts and sub.startswith("mlp.") and not sub.startswith("mlp.experts"):
                continue  # a MoE family's dense MLP exists only in its mlp_only layers
            assert sub in named or any(n.startswith(sub) for n in named), (key, sorted(named))


def _calib(seed=0):
    return torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(seed))


#: families whose layout differs from Llama's beyond names (fused, interleaved, transposed, experts, a logit
#: transform, a plain MLP): every compressor in the default tier; the other families with ASVD and LLM-Pruner (the
#: full matrix is the `slow` tier)
DISTINCT = {"llama", "phi3", "gpt_neox", "gpt2", "mixtral", "qwen3_moe", "gemma3_text", "granite", "phi"}
#: families whose layout entry is another's exactly (Llama's, Cohere's, GLM-4's): the whole matrix is `slow`
SAME_LAYOUT = {"olmo3", "ministral", "ministral3", "exaone4", "seed_oss", "internlm3", "ernie4_5", "cohere2", "glm"}
MATRIX = [pytest.param(t, c, marks=() if t in DISTINCT or (c in ("asvd", "llm_pruner") and t not in SAME_LAYOUT)
                       else pytest.mark.slow)
          for t in TYPES for c in COMPRESSORS]


@pytest.mark.parametrize("model_type,compressor", MATRIX)
def test_every_compressor_on_every_family(model_type, compressor, tmp_path):
    from gac.compression.audit import audit_model
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_load import load_checkpoint
    from gac.compression.compress import compress_model
    from gac.compression.discovery import discover
    from gac.compression.prepared import compressed_weight_params

    m = family_model(model_type)
    lay = discover(m)
    if compressor == "palu" and lay.num_kv_heads % 2 and lay.num_kv_heads != 1:
        pytest.fail("the small models have 1, 2 or 4 KV heads")
    alloc = "proportional" if compressor == "asvd" else None
    ids = _calib(1)
    with torch.no_grad():
        dense_logits = m(ids).logits
    import copy

    cm, plan, rep = compress_model(copy.deepcopy(m), None, compressor, ratio=0.3, calib_ids=_calib(), allocation=alloc,
                                   unit=8)
    assert rep["params_counted"] == plan.params <= plan.budget
    assert plan.aligned_fraction == 1.0
    with torch.no_grad():
        logits = cm(ids).logits
    assert torch.isfinite(logits).all() and logits.shape == dense_logits.shape
    assert not torch.equal(logits, dense_logits)  # something was compressed
    # the fusion is respected: a fused module that was split keeps its other roles' rows exactly
    from gac.compression.modules import SplitLinear
    from gac.compression.parts import module_weight

    for name in {p.module for p in lay.projections if not p.whole}:
        new = cm.get_submodule(name)
        if isinstance(new, SplitLinear):
            old = module_weight(m.get_submodule(name))
            for p in (p for p in lay.projections if p.module == name):
                part = new.part(p.role)
                if isinstance(part, torch.nn.Linear):
                    torch.testing.assert_close(part.weight, old[p.row_index()], rtol=0, atol=0)
    save_checkpoint(cm, None, tmp_path / "ck")
    back, _ = load_checkpoint(tmp_path / "ck")
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, logits, rtol=0, atol=0)
    rep = audit_model(back)
    assert rep["n_weights"] > 0 and rep["heads"]["gqa_ok"]
    assert compressed_weight_params(back, _units(back, compressor)) == plan.params


def _units(model, compressor):
    """The compressor's units as laid out on the reloaded (compressed) model, for the parameter count."""
    from gac.compression.compressors import get_compressor
    from gac.compression.discovery import discover

    lay = discover(model)
    comp = get_compressor(compressor)
    from gac.compression.compressors.base import Unit

    if compressor == "llm_pruner":
        units = []
        for i in sorted(_pruned_layers(comp, lay)):
            if lay.experts_of(i) is not None:
                b = lay.experts_of(i)
                units += [Unit(f"{b.module}.{e}", "width", 1, 1, 1, 1, (b.module,), parts=((b.module, f"expert{e}"),))
                          for e in range(b.num_experts)]
            mlp = lay.mlp_of(i)  # a dense MLP, or a shared expert beside the experts
            if mlp:
                units.append(Unit("m", "width", 1, 1, 1, 1, (), parts=tuple(dict.fromkeys(
                    (p.module, None if p.whole else p.role) for p in mlp.values()))))
        return units
    roles = ("k", "v") if compressor == "palu" else ROLES
    return [Unit(p.name, "lowrank", 1, 1, 1, 1, (p.module,), parts=((p.module, None if p.whole else p.role),))
            for p in lay.projections_of(roles)]


def _pruned_layers(comp, lay):
    from gac.compression.compressors.llm_pruner import layer_range

    return set(layer_range("reference", lay.num_layers))


def test_a_split_module_with_dense_parts_is_the_fused_module():
    """A fused projection split into its roles (all dense) computes exactly what the fused one did, interleaved
    rows (GPT-NeoX) and a Conv1D (GPT-2) included."""
    from gac.compression.discovery import discover
    from gac.compression.parts import _split

    for t in ("phi3", "gpt_neox", "gpt2"):
        m = family_model(t)
        lay = discover(m)
        x = torch.randn(3, 5, H, generator=torch.Generator().manual_seed(0))
        for name in {p.module for p in lay.projections if not p.whole}:
            fused = m.get_submodule(name)
            split = _split(m, lay, name)
            with torch.no_grad():
                torch.testing.assert_close(split(x), fused(x), rtol=1e-6, atol=1e-6)


def gemma3_multimodal(seed: int = 0, **text):
    """A small Gemma3ForConditionalGeneration (the multimodal Gemma 3: its language model under
    model.language_model); ``text``: more text-config arguments. Its text vocabulary is 300 (ids below 290 are
    text)."""
    from transformers import AutoModelForCausalLM, Gemma3Config

    cfg = Gemma3Config(
        text_config=dict(hidden_size=H, intermediate_size=WIDTH, num_hidden_layers=L, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=16, vocab_size=300, max_position_embeddings=64,
                         sliding_window=16, **text),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


#: every family whose config can ask for a logit transform, built with it set; the multimodal Gemma 3's class does
#: not apply the soft-cap its text config names (transformers' Gemma3ForConditionalGeneration), its text model does
TAIL_MODELS = {"granite": lambda: family_model("granite"), "cohere": lambda: family_model("cohere"),
               "cohere2": lambda: family_model("cohere2"), "gemma2": lambda: family_model("gemma2"),
               "gemma3_text": lambda: family_model("gemma3_text"),
               "gemma3": lambda: gemma3_multimodal(final_logit_softcapping=3.0)}


@pytest.mark.parametrize("name", TAIL_MODELS)
def test_the_sensitivity_tail_is_the_model_s_own(name):
    """ASVD's sensitivity search scores probes with the family's tail (norm -> head -> logit transform): its layer-
    cached perplexity equals the model's own forward on Granite (logits_scaling), Cohere (logit_scale), Gemma 2 and
    Gemma 3's text model (soft-capping) and the multimodal Gemma 3 (no soft-cap, though its config sets one)."""
    from gac.compression.discovery import discover
    from gac.compression.sensitivity import LayerCache, calibration_perplexity

    m = TAIL_MODELS[name]()
    ids = _calib(2)
    cache = LayerCache(m, discover(m), ids)
    assert cache.perplexity() == pytest.approx(calibration_perplexity(m, ids), rel=1e-6)


@pytest.mark.parametrize("name", TAIL_MODELS)
def test_perplexity_applies_the_model_s_own_tail(name):
    from gac.evaluation.perplexity import _plain_head, window_nll

    m = TAIL_MODELS[name]()
    assert _plain_head(m) is not None  # scored through the family's tail, not the model's forward
    x = _calib(3)
    with torch.no_grad():
        logits = m(x).logits[:, :-1].float()
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                reduction="sum")
        assert float(window_nll(m, x)) == pytest.approx(float(ref), rel=1e-6)


def test_a_logit_transform_names_the_classes_that_apply_it():
    """Each class a family names as applying its logit transform exists in transformers and is its causal LM."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from gac.compression.layouts import FAMILIES

    for f in FAMILIES:
        for c in f.logits_classes:
            assert hasattr(transformers, c), (f.name, c)
            assert c in {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(t) for t in f.model_types}, (f.name, c)


def test_moe_experts_are_targets_of_their_own_with_per_expert_widths():
    from gac.compression.compress import compress_model
    from gac.compression.modules import ExpertMLPs

    m = family_model("mixtral")
    cm, plan, _ = compress_model(m, None, "llm_pruner", ratio=0.3, calib_ids=_calib(), unit=8,
                                 compressor_options={"layers": "0:", "expert_width": "per_expert"})
    blocks = [mod for mod in cm.modules() if isinstance(mod, ExpertMLPs)]
    assert len(blocks) == L and all(len(b.widths) == 4 for b in blocks)
    assert all(w % 8 == 0 for b in blocks for w in b.widths)
    assert len({k for k in plan.dims if ".experts." in k}) == 4 * L
    assert any(len(set(b.widths)) > 1 for b in blocks) or all(w < 96 for b in blocks for w in b.widths)


@pytest.mark.parametrize("compressor", ["llm_pruner", "asvd"])
def test_a_shared_expert_is_a_dense_mlp_target_and_its_gate_is_untouched(compressor):
    """Qwen2-MoE's shared expert (beside the routed experts) is compressed as a dense MLP is: LLM-Pruner prunes its
    width, the low-rank compressors factorise its projections; the router and the shared expert's gate keep their
    weights."""
    import copy

    from gac.compression.compress import compress_model
    from gac.compression.discovery import discover

    m = family_model("qwen2_moe")
    lay = discover(m)
    shared = {p.role: p for p in lay.projections if ".shared_expert." in p.module}
    assert set(shared) == {"gate", "up", "down"} and all(p.layer == 0 for p in shared.values())
    opts = {"layers": "0:"} if compressor == "llm_pruner" else {}
    cm, plan, _ = compress_model(copy.deepcopy(m), None, compressor, ratio=0.3, calib_ids=_calib(), unit=8,
                                 compressor_options=opts, allocation=None if compressor == "llm_pruner" else "uniform")
    if compressor == "llm_pruner":
        assert plan.dims["model.layers.0.mlp.shared_expert"] < 96
    else:
        assert any(n in plan.dims and n not in plan.dense for n in (p.name for p in shared.values()))
    for n in ("model.layers.0.mlp.gate.weight", "model.layers.0.mlp.shared_expert_gate.weight"):
        assert torch.equal(cm.get_parameter(n), m.get_parameter(n))


def test_an_unknown_family_is_refused_from_its_config_before_any_weight():
    from transformers import AutoConfig

    from gac.compression.discovery import discover_config

    for t, why in (("bloom", "gac has no layout for model_type 'bloom'"),
                   ("falcon", "gac does not compress falcon models")):
        with pytest.raises(GacError, match=why):
            discover_config(AutoConfig.for_model(t))


def test_roles_accept_llama_names_and_refuse_others():
    from gac.compression.compressors import get_compressor

    assert get_compressor("asvd", projections=["q_proj", "fc_in"]).roles() == ("q", "fc_in")
    with pytest.raises(GacError, match="unknown projection 'qkv'"):
        get_compressor("asvd", projections=["qkv"])


def test_svd_llm_update_refuses_fused_parts():
    from gac.compression.compress import compress_model

    m = family_model("phi3")
    with pytest.raises(GacError, match="update"):
        compress_model(m, None, "svd_llm", ratio=0.3, calib_ids=_calib(), compressor_options={"update": True})


def test_compressed_family_models_keep_their_params_exact():
    """A random plan on Phi-3's fused weights: the plan's count is the model's, whatever rows each role keeps."""
    from gac.compression.compress import compress_model

    for comp in ("asvd", "palu", "llm_pruner"):
        cm, plan, rep = compress_model(family_model("phi3"), None, comp, ratio=0.4, calib_ids=_calib(), allocation=None if comp != "asvd"
                                       else "proportional", strategy="unaligned")
        with torch.no_grad():
            assert rep["params_counted"] == plan.params and math.isfinite(float(cm(_calib(4)).logits.sum()))


def test_the_multimodal_gemma3_compresses_its_language_model():
    """Gemma-3-4B and larger are multimodal (Gemma3ForConditionalGeneration): the layout is the text model's under
    model.language_model; the vision tower is left alone."""
    from gac.compression.compress import compress_model

    ids = torch.randint(0, 290, (2, 16), generator=torch.Generator().manual_seed(0))
    for comp, opts in (("asvd", {}), ("llm_pruner", {"layers": "0:"})):
        m = gemma3_multimodal()
        vision = {n: p.clone() for n, p in m.named_parameters() if "vision" in n}
        cm, plan, rep = compress_model(m, None, comp, ratio=0.3, calib_ids=ids, compressor_options=opts,
                                       allocation="proportional" if comp == "asvd" else None)
        assert rep["params_counted"] == plan.params and all(k.startswith("model.language_model.") for k in plan.dims)
        assert all(torch.equal(p, vision[n]) for n, p in cm.named_parameters() if n in vision)


@pytest.mark.parametrize("model_type", ["gpt2", "phi3", "mixtral", "gpt_neox", "qwen2_moe", "gptj"])
def test_flops_count_every_family_weight(model_type):
    """Prefill FLOPs count a Conv1D, a split fused module and expert blocks (top_k of E experts per token): the dense
    model's linear FLOPs are 2 T times its decoder weights (experts weighted by top_k / E)."""
    from gac.compression.discovery import discover
    from gac.evaluation.flops import prefill_flops

    m = family_model(model_type)
    lay = discover(m)
    T = 2 * 32
    f = prefill_flops(m, 2, 32)
    layer_weights = sum(p.numel() for n, p in m.named_parameters()
                        if n.startswith(lay.layers_path + ".") and p.dim() >= 2 and ".experts." not in n)
    k, E = int(getattr(m.config, "num_experts_per_tok", 0) or 0), 0
    expert_weights = sum(p.numel() for n, p in m.named_parameters() if ".experts." in n)
    if lay.experts:
        E = lay.experts[0].num_experts
    router = sum(p.numel() for n, p in m.named_parameters() if n.endswith("mlp.gate.weight")) if lay.experts else 0
    want = 2 * T * (layer_weights - router) + (2 * T * k * expert_weights // E if E else 0)
    assert f["linear"] == pytest.approx(want, rel=1e-6) and f["lm_head"] == 2 * T * H * V


@pytest.mark.parametrize("model_type,compressor", [("phi3", "asvd"), ("phi3", "palu"), ("phi3", "llm_pruner"),
                                                   ("gpt2", "asvd"), ("gpt_neox", "palu"), ("mixtral", "llm_pruner"),
                                                   ("qwen2_moe", "llm_pruner"), ("qwen2_moe", "asvd")])
def test_a_plan_builds_its_structure_without_weights(model_type, compressor):
    """What the bench and the predictor build from a plan's shapes alone (gac.compression.structure): the same
    modules, with the plan's parameter count, as the compressed model itself."""
    import copy

    from gac.compression.compress import compress_model
    from gac.compression.modules import module_spec
    from gac.compression.structure import Structure

    m = family_model(model_type)
    opts = {"layers": "0:"} if compressor == "llm_pruner" else {}
    cm, plan, _ = compress_model(copy.deepcopy(m), None, compressor, ratio=0.3, calib_ids=_calib(), unit=8,
                                 allocation="proportional" if compressor == "asvd" else None, compressor_options=opts)
    s = Structure(m.config, torch.float32, compressor, opts, dict(plan.dims))
    assert s.compressed_params() == plan.params
    built = s.build("cpu")
    for name, spec in s.specs.items():
        assert module_spec(built.get_submodule(name)) == module_spec(cm.get_submodule(name)) == spec
    with torch.no_grad():
        assert torch.isfinite(built(_calib(5)).logits).all()



def _big_biases(m):
    """Projection biases of std 3 (Qwen2's q/k/v, GPT-2's every Conv1D): large against the outputs' own scale."""
    with torch.no_grad():
        biases = [p for n, p in m.named_parameters() if n.endswith(".bias") and "ln" not in n and "norm" not in n]
        for p in biases:
            p.normal_(0.0, 3.0)
    return len(biases)


@pytest.mark.parametrize("model_type", ["qwen2", "gpt2"])
def test_the_output_gram_is_the_weight_s_not_the_bias_s(model_type):
    """The output Gram SVD-LLM's Gram methods read for ``out <= in`` is ``W X^T X W^T`` (the module's output less its
    bias), on a Linear (Qwen2's biased q/k/v) and a Conv1D (GPT-2's c_proj)."""
    from gac.compression.discovery import discover
    from gac.compression.importance import collect_activation_stats
    from gac.compression.parts import module_weight

    m = family_model(model_type)
    assert _big_biases(m)
    lay = discover(m)
    mods = sorted({p.module for p in lay.projections})
    biased = [n for n in mods if getattr(m.get_submodule(n), "bias", None) is not None]
    assert biased
    st = collect_activation_stats(m, lay, _calib(), mods, xtx=True, yty=set(mods))
    for n in mods:
        W = module_weight(m.get_submodule(n)).detach().double()
        want = W @ st[n].xtx @ W.T  # the outputs are float32: agreement to float32 rounding of the largest entry
        torch.testing.assert_close(st[n].yty, want, rtol=0, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("model_type", ["qwen2", "gpt2"])
def test_svd_llm_gram_methods_factorise_a_biased_weight_as_exact_does(model_type):
    """With large biases, SVD-LLM's Gram method compresses exactly as ``svd=exact`` does (the same ranks, the same
    logits)."""
    import copy

    from gac.compression.compress import compress_model

    m = family_model(model_type)
    assert _big_biases(m)
    ids = _calib(1)
    with torch.no_grad():
        dense = m(ids).logits
    err, params = {}, {}
    for svd in ("exact", "gram64"):
        cm, plan, _ = compress_model(copy.deepcopy(m), None, "svd_llm", ratio=0.3, calib_ids=_calib(), unit=8,
                                     compressor_options={"svd": svd})
        with torch.no_grad():
            err[svd] = float((cm(ids).logits - dense).norm() / dense.norm())
        params[svd] = plan.params
    assert params["gram64"] == params["exact"]
    assert err["gram64"] == pytest.approx(err["exact"], rel=1e-6)


# ------------------------------------------------------------------------------------------------------ exactness
# A layout error (a wrong row block, a lost bias, a transposed weight, the wrong tail) that still gives finite logits
# is invisible to the checks above. On weights whose information a compressor can keep whole, its result must equal
# the dense model: every projection of true rank TRUE_RANK (the low-rank compressors, at a ratio whose ranks stay
# >= TRUE_RANK, reproduce the dense logits), and MLPs (each expert included) with DEAD_FRACTION of their channels
# writing nothing (LLM-Pruner, pruning fewer channels than are dead, removes only those). Biases and norm weights are
# non-zero and not one, so a bias or norm the split or the factors drop shows. Every compressor runs with its default
# allocation.
TRUE_RANK, DEAD_FRACTION, EXACT_RATIO = 8, 0.4, 0.2
#: the default tier: each compressor on a layout unlike Llama's (biased q/k/v, fused Conv1D, per-head interleave,
#: fused qkv and gate_up, plain MLP, experts with a shared expert and a dense layer, soft-capped logits); every
#: family with every compressor is `slow`
EXACT_FAST = {("qwen2", "svd_llm"), ("gpt2", "asvd"), ("gpt_neox", "palu"), ("phi3", "svd_llm"),
              ("phi3", "llm_pruner"), ("phi", "llm_pruner"), ("qwen2_moe", "llm_pruner"),
              ("gemma3_text", "stable_rank_svd")}
EXACT = [pytest.param(t, c, marks=() if (t, c) in EXACT_FAST else pytest.mark.slow)
         for t in TYPES for c in COMPRESSORS]


def exact_model(model_type: str, dead: bool = False, seed: int = 0):
    """A family model whose every projection weight has rank :data:`TRUE_RANK` (a fused weight as a whole, so each
    role's rows too), with random non-zero biases and norm weights; ``dead``: :data:`DEAD_FRACTION` of each MLP's channels
    (each expert's, per expert) have zero output columns."""
    from gac.compression.discovery import discover
    from gac.compression.parts import module_weight

    m = family_model(model_type, seed)
    lay = discover(m)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in sorted({p.module for p in lay.projections}):
            w = m.get_submodule(name).weight
            a, b = torch.randn(w.shape[0], TRUE_RANK, generator=g), torch.randn(TRUE_RANK, w.shape[1], generator=g)
            w.copy_(a @ b * (0.05 / TRUE_RANK**0.5))
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=g) * (0.02 if n.endswith("bias") else 0.2))
        # every expert must see calibration tokens (one that sees none has no importance to rank its channels by):
        # biases small against the tokens' differences, and routers that read the token
        for b in lay.experts:
            router = m.get_submodule(b.module.rpartition(".")[0] + ".gate")
            router.weight.normal_(0.0, 1.0, generator=g)
            for n, p in router.named_parameters():  # ERNIE's score correction (zero as initialised)
                if "correction" in n:
                    p.zero_()
        if dead:
            for li in range(lay.num_layers):
                block, mlp = lay.experts_of(li), lay.mlp_of(li)
                if block is not None:  # down [E, H, I]: each expert its own dead channels
                    down = getattr(m.get_submodule(block.module), block.down)
                    for e in range(down.shape[0]):
                        down[e][:, _dead(down.shape[2], g)] = 0
                if mlp:  # a dense MLP, or a shared expert
                    out = module_weight(m.get_submodule((mlp.get("down") or mlp["fc_out"]).module))
                    out[:, _dead(out.shape[1], g)] = 0
    return m


def _dead(width: int, g) -> torch.Tensor:
    return torch.randperm(width, generator=g)[: int(DEAD_FRACTION * width)]


@pytest.mark.parametrize("model_type,compressor", EXACT)
def test_a_compressor_that_drops_nothing_the_model_uses_is_exact(model_type, compressor):
    import copy

    from gac.compression.compress import compress_model

    pruner = compressor == "llm_pruner"
    m = exact_model(model_type, dead=pruner)
    ids = _calib(1)
    with torch.no_grad():
        dense = m(ids).logits
    opts = {"layers": "0:"} if pruner else {}  # every layer (the default range leaves out the last of two)
    cm, plan, _ = compress_model(copy.deepcopy(m), None, compressor, ratio=EXACT_RATIO, calib_ids=_calib(), unit=8,
                                 compressor_options=opts)
    assert sum(p.numel() for p in cm.parameters()) < sum(p.numel() for p in m.parameters())
    if pruner:  # fewer channels pruned than are dead, in every MLP and expert
        from gac.compression.discovery import discover

        lay = discover(m)
        full = {b.module: b.width for b in lay.experts}  # one width for all the experts of a layer (the default)
        full |= {p.module.rpartition(".")[0]: p.in_features for p in lay.projections if p.role in ("down", "fc_out")}
        assert all(d >= full[n] - int(DEAD_FRACTION * full[n]) for n, d in plan.dims.items()), plan.dims
    else:
        assert min(plan.dims.values()) >= TRUE_RANK
    with torch.no_grad():
        logits = cm(ids).logits
    err = float((logits - dense).norm() / dense.norm())
    assert err < 1e-4, err
