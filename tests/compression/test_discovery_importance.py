"""Target discovery across architectures; calibration statistics; proxies; bad input."""

from __future__ import annotations

import math

import pytest
import torch

from gac.compression.compress import compress_model
from gac.compression.discovery import discover
from gac.compression.gradients import collect_gradient_stats
from gac.compression.importance import collect_activation_stats
from gac.compression.preparation import prepare
from gac.compression.proxies import PROXIES
from gac.errors import GacError, InfeasibleBudgetError
from tests.compression.conftest import small_model


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_discovery_supported_families(model_type):
    m = small_model(model_type, num_attention_heads=8, num_key_value_heads=2, head_dim=16)
    lay = discover(m)
    assert lay.model_type == model_type and lay.num_layers == 2
    assert (lay.num_heads, lay.num_kv_heads, lay.head_dim, lay.gqa_group) == (8, 2, 16, 4)
    names = lay.linear_names()
    assert len(names) == 14 and names[0] == "model.layers.0.self_attn.q_proj" and names[-1] == "model.layers.1.mlp.down_proj"
    assert m.get_submodule("model.layers.1.self_attn.k_proj").out_features == 2 * 16


def test_unsupported_architecture_lists_supported():
    from transformers import BloomConfig, BloomForCausalLM

    m = BloomForCausalLM(BloomConfig(n_layer=1, hidden_size=32, n_head=2, vocab_size=64))
    with pytest.raises(GacError, match="no layout for model_type 'bloom'.*gac supports .*gpt2.*llama.*phi3"):
        discover(m)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
def test_layerwise_stats_equal_full_forward(model_type):
    """Layer-by-layer calibration (one layer's activations held) sees exactly the inputs of a normal forward."""
    m = small_model(model_type, sliding_window=16) if model_type != "llama" else small_model()
    ids = torch.randint(0, 512, (3, 24), generator=torch.Generator().manual_seed(0))
    lay = discover(m)
    names = lay.linear_names()
    stats = collect_activation_stats(m, lay, ids, names, xtx=True)
    ref = {n: torch.zeros(m.get_submodule(n).in_features, dtype=torch.float64) for n in names}

    def hook(mod, a, _n):
        ref[_n].add_(a[0].detach().double().reshape(-1, a[0].shape[-1]).pow(2).sum(0))  # returns None: inputs untouched

    hs = [m.get_submodule(n).register_forward_pre_hook(lambda mod, a, _n=n: hook(mod, a, _n)) for n in names]
    with torch.no_grad():
        for s in range(3):
            m(ids[s : s + 1])
    for h in hs:
        h.remove()
    for n in names:
        torch.testing.assert_close(stats[n].act_sq, ref[n], rtol=1e-4, atol=1e-6)
        assert stats[n].tokens == 72
        torch.testing.assert_close(stats[n].xtx.diagonal(), stats[n].act_sq, rtol=1e-9, atol=1e-9)


def test_gradient_stats_hold_no_gradients():
    m = small_model()
    ids = torch.randint(0, 512, (2, 16))
    names = discover(m).linear_names()
    st = collect_gradient_stats(m, ids, names)
    assert all(p.grad is None for p in m.parameters())
    assert all(p.requires_grad for p in m.parameters())  # flags restored
    s = st["model.layers.0.mlp.down_proj"]
    assert s.samples == 2 and s.fisher_row.shape == (128,) and s.taylor_col.shape == (344,)
    assert float(s.fisher_row.sum()) == pytest.approx(float(s.fisher_col.sum()), rel=1e-6)


@pytest.mark.parametrize("proxy", sorted(PROXIES))
def test_every_proxy(base, prepared, proxy):
    p = prepared("llm_pruner", proxy)
    assert p.proxy == proxy
    assert all(math.isfinite(v) and v >= 0 for v in p.scores.values())
    plan, targets = p.plan(0.3, "gac")
    assert plan.aligned_fraction == 1.0 and plan.params <= plan.budget
    if proxy != "magnitude":  # scores actually differ from the magnitude proxy's
        other = prepared("llm_pruner", "magnitude")
        assert p.scores != other.scores


def test_random_proxy_is_seeded(base):
    model, tok, calib, _, _ = base
    a = prepare(model, tok, "llm_pruner", "random", calib_ids=calib, proxy_seed=3)
    b = prepare(model, tok, "llm_pruner", "random", calib_ids=calib, proxy_seed=3)
    c = prepare(model, tok, "llm_pruner", "random", calib_ids=calib, proxy_seed=4)
    assert a.scores == b.scores and a.scores != c.scores


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_bad_ratio(prepared, ratio):
    with pytest.raises(GacError, match="ratio"):
        prepared("llm_pruner").compress(ratio, "gac")


def test_bad_ratio_fails_before_calibration(base):
    model, tok, calib, _, _ = base
    with pytest.raises(GacError, match="ratio"):
        compress_model(model, tok, "asvd", 1.0, calib_ids=calib)


def test_budget_no_candidate_plan_meets(prepared):
    p = prepared("asvd")
    with pytest.raises(InfeasibleBudgetError) as e:
        p.compress(0.99, "gac")
    assert e.value.min_budget > e.value.budget


def test_unknown_names_suggest(base):
    model, tok, calib, _, _ = base
    with pytest.raises(GacError, match="did you mean 'fisher'"):
        prepare(model, tok, "palu", "fishr", calib_ids=calib)
    with pytest.raises(GacError, match="did you mean 'asvd'"):
        prepare(model, tok, "asdv", calib_ids=calib)
    with pytest.raises(GacError, match="did you mean 'gac'"):
        compress_model(model, tok, "asvd", 0.2, "gca", calib_ids=calib)
    with pytest.raises(GacError, match="alpha"):
        prepare(model, tok, "asvd", calib_ids=calib, compressor_options={"alpah": 0.5})


def test_nan_activations_name_the_layer():
    m = small_model()
    with torch.no_grad():
        m.model.layers[1].self_attn.o_proj.weight[0, 0] = float("inf")
    ids = torch.randint(0, 512, (2, 16))
    with pytest.raises(GacError, match=r"model\.layers\.1"):
        prepare(m, None, "asvd", calib_ids=ids)
    with pytest.raises(GacError, match="non-finite"):
        prepare(m, None, "palu", "fisher", calib_ids=ids)


def test_nan_weight_names_the_weight():
    m = small_model()
    with torch.no_grad():
        m.model.layers[0].mlp.up_proj.weight[1, 1] = float("nan")
    with pytest.raises(GacError, match=r"model\.layers\.0\.mlp\.up_proj"):
        prepare(m, None, "svd_llm", "magnitude", calib_ids=torch.randint(0, 512, (1, 8)))


def test_nan_score_rejected():
    from gac.compression.proxies import check_score

    with pytest.raises(GacError, match="layers.3.q_proj"):
        check_score(float("nan"), "layers.3.q_proj", "gradient")


def test_sensitivity_allocation_asvd():
    m = small_model()
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    p = prepare(m, None, "asvd", calib_ids=ids, allocation="sensitivity", sensitivity_grid=(0.3, 0.6, 0.9))
    tab = p.sensitivity
    assert len(tab["table"]) == len(p.units) and all(len(r) == 3 for r in tab["table"])
    for strategy in ("unaligned", "gac"):
        plan, targets = p.plan(0.3, strategy)
        assert plan.params <= plan.budget
    assert p.plan(0.3, "gac")[0].aligned_fraction == 1.0
    with pytest.raises(GacError, match="sensitivity"):
        prepare(m, None, "palu", calib_ids=ids, allocation="sensitivity")


def test_pruner_default_layer_range_is_the_reference():
    from gac.compression.compressors import get_compressor

    m = small_model(num_hidden_layers=32, hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1)
    units = get_compressor("llm_pruner").units(m, discover(m))
    assert [u.meta["layer"] for u in units] == list(range(3, 31))  # the reference's range(3, 31): layers 3-30
    paper = get_compressor("llm_pruner", layers="paper").units(m, discover(m))
    assert [u.meta["layer"] for u in paper] == list(range(3, 32))  # the GAC paper's layers 3-31


def test_calibration_runs_each_layer_once_per_sample_and_never_the_head():
    m = small_model(num_hidden_layers=3)
    ids = torch.randint(0, 512, (3, 16))
    calls = {"head": 0, "layers": [0, 0, 0]}
    hs = [m.lm_head.register_forward_hook(lambda *a: calls.__setitem__("head", calls["head"] + 1))]
    for i, layer in enumerate(m.model.layers):
        # count the samples of real layer computations (the MLP), not the identity short-circuit used to capture
        # layer kwargs (short samples go through a layer together: CALIB_CHUNK_TOKENS)
        hs.append(layer.mlp.register_forward_hook(
            lambda mod, args, out, _i=i: calls["layers"].__setitem__(_i, calls["layers"][_i] + args[0].shape[0])))
    lay = discover(m)
    collect_activation_stats(m, lay, ids, lay.linear_names())
    for h in hs:
        h.remove()
    assert calls["head"] == 0  # no [n, seq, vocab] logits are ever materialised
    assert calls["layers"] == [3, 3, 3]
