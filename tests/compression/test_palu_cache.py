"""PaLU's latent KV cache (gac.compression.latent_cache): a PaLU model caches its K/V codes, not the rebuilt K/V.

Exactness: greedy generation with the latent cache equals generation without any cache and the parameter-only PaLU
(the same weights, the rebuilt K/V cached), and every decode step's logits equal a full forward's to float
tolerance; on tiny and on families whose attention differs (biases, a per-head key norm with sliding windows and two
rotary kinds, a full-width key norm, a fused qkv with partial rotary, no RoPE). The cache holds exactly the codes
(bytes per token read from the cache's tensors), a checkpoint keeps the mode, and ``rank_cap`` never lets a head group
hold more than its dense weight.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from gac.errors import GacError

PROMPT, NEW = 10, 12  # 22 tokens: past the random models' 16-token sliding window


def _compress(model, calib, **opts):
    from gac.compression.compress import compress_model

    return compress_model(copy.deepcopy(model), None, "palu", ratio=0.3, calib_ids=calib, unit=8,
                          compressor_options=opts or None)


@torch.no_grad()
def _step_errors(model, ids, steps=4) -> float:
    """Largest relative difference of a cached decode step's logits from a full forward's (no cache)."""
    out = model(ids, use_cache=True)
    cache, seq, worst = out.past_key_values, ids, 0.0
    for _ in range(steps):
        tok = out.logits[:, -1:].argmax(-1)
        seq = torch.cat([seq, tok], 1)
        out = model(tok, past_key_values=cache, use_cache=True)
        full = model(seq, use_cache=False).logits[:, -1]
        worst = max(worst, float((out.logits[:, -1] - full).abs().max() / full.abs().max()))
    return worst


@torch.no_grad()
def _generate(model, ids, use_cache=True, **kw):
    return model.generate(ids, max_new_tokens=NEW, do_sample=False, use_cache=use_cache, pad_token_id=0, **kw)


@torch.no_grad()
def _bytes_per_token(model, ids) -> float:
    from transformers import DynamicCache

    from gac.compression.latent_cache import cache_bytes

    c = DynamicCache(config=model.config)
    model(ids, use_cache=True, past_key_values=c)
    return cache_bytes(c) / ids.numel()


def _expected_latent_bytes(model, plan) -> int:
    """Per token: every compressed layer's K and V codes, plus one cos and one sin per rotary kind."""
    from gac.compression.discovery import discover, text_config

    lay = discover(model)
    assert len(plan.dims) == 2 * lay.num_layers * (lay.num_kv_heads // min(4, lay.num_kv_heads))  # every group
    cfg = text_config(model.config)
    kinds = len(set((getattr(cfg, "layer_types", None) or [""] * lay.num_layers)[: lay.num_layers]))
    factor = (getattr(cfg, "rope_parameters", None) or {}).get("partial_rotary_factor") or 1.0
    rot = 0 if model.config.model_type == "gpt2" else kinds * 2 * int(lay.head_dim * factor)
    return (sum(plan.dims.values()) + rot) * next(model.parameters()).element_size()


@pytest.fixture(scope="module")
def tiny_palu(base, prepared):
    """tiny and its PaLU model at ratio 0.3 with the default options (compressed once: tests copy it to change it)."""
    cm, plan, rep = prepared("palu").compress(0.3, unit=8)
    return base[0], cm, plan, rep


def _check_exact(model, cm, plan, ids, smaller=True):
    from gac.compression.latent_cache import has_latent_cache, remove

    assert has_latent_cache(cm)
    latent = _generate(cm, ids)
    assert torch.equal(latent, _generate(cm, ids, use_cache=False))
    assert _step_errors(cm, ids) < 1e-5
    b_latent = _bytes_per_token(cm, ids)
    assert b_latent == _expected_latent_bytes(cm, plan)  # the codes and nothing else
    params_only = copy.deepcopy(cm)
    remove(params_only)
    assert not has_latent_cache(params_only)
    assert torch.equal(latent, _generate(params_only, ids))
    b_full = _bytes_per_token(params_only, ids)
    assert b_full == _bytes_per_token(model, ids)  # parameter-only PaLU caches what the dense model does
    if smaller:  # a toy model with one KV head of 16 may spend what its codes save on the cached rotary positions
        assert b_latent < b_full
    return b_latent, b_full


def test_latent_cache_on_tiny_is_exact_and_holds_the_codes(base, tiny_palu):
    model, cm, plan, rep = tiny_palu  # the default: cache=auto, latent for a Llama model
    assert rep["kv_cache"] == {"mode": "latent", "latent_layers": 4}
    assert rep["recipe"]["options"]["cache"] == "auto"  # the option as given; kv_cache says what it became
    ids = base[3][:1, :PROMPT]
    b_latent, b_full = _check_exact(model, cm, plan, ids)
    # tiny: 4 layers x 2 KV heads x 64 x (K, V) float32 dense; the codes are the plan's ranks (<= break-even 85 per
    # group of 128 rows), one cos/sin pair of 64 each
    assert b_full == 4 * 2 * 128 * 4
    assert b_latent / b_full == pytest.approx((sum(plan.dims.values()) + 128) / 1024)
    assert b_latent / b_full < 0.75


def test_latent_cache_is_exact_with_left_padding_and_a_batch(base, tiny_palu):
    """Rows of different lengths: each row's rotary positions are its own (cached per row)."""
    from gac.compression.latent_cache import remove

    cm = copy.deepcopy(tiny_palu[1])
    ids = base[3][:2, :PROMPT].clone()
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    latent = _generate(cm, ids, attention_mask=mask)
    remove(cm)
    assert torch.equal(latent, _generate(cm, ids, attention_mask=mask))


#: biases (Qwen2); per-head key norm, sliding window, local and global rotary (Gemma 3); full-width key norm (OLMo 2);
#: slow: fused qkv (Phi-3), partial rotary (GLM), no RoPE and a fused Conv1D (GPT-2), a LayerNorm key norm (Cohere),
#: experts
FAST = ("qwen2", "gemma3_text", "olmo2")
SLOW = ("phi3", "glm", "gpt2", "cohere", "qwen3_moe", "mixtral", "gpt_neox")


@pytest.mark.parametrize("model_type", [*FAST, *(pytest.param(t, marks=pytest.mark.slow) for t in SLOW)])
def test_latent_cache_is_exact_on_other_families(model_type):
    from tests.compression.test_families import _calib, exact_model

    m = exact_model(model_type)
    cm, plan, rep = _compress(m, _calib())
    assert rep["kv_cache"]["mode"] == "latent"
    _check_exact(m, cm, plan, _calib(3)[:, :PROMPT], smaller=model_type != "gemma3_text")


def test_a_family_the_latent_cache_cannot_rebuild_is_refused_or_keeps_the_full_cache():
    from gac.compression.latent_cache import has_latent_cache
    from tests.compression.test_families import _calib, family_model

    m = family_model("phi")  # partial rotary split inside the attention
    with pytest.raises(GacError, match=r"not available for 'phi' models.*cache=full") as e:
        _compress(m, _calib(), cache="latent")
    assert "\n" not in str(e.value)
    cm, _, rep = _compress(m, _calib())  # auto: the rebuilt K/V, as before
    assert rep["kv_cache"]["mode"] == "full" and rep["recipe"]["options"]["cache"] == "auto"
    assert not has_latent_cache(cm)


def test_an_attention_the_cache_does_not_rebuild_fails_at_the_first_step(monkeypatch):
    """Installed by hand on an unsupported attention: the first step's own keys are checked, never silently wrong."""
    import gac.compression.latent_cache as lc
    from tests.compression.test_families import _calib, family_model

    cm, _, _ = _compress(family_model("phi"), _calib(), cache="full")
    monkeypatch.setattr(lc, "LATENT_FAMILIES", lc.LATENT_FAMILIES | {"phi"})
    lc.install(cm)
    with pytest.raises(GacError, match="does not rebuild the keys of PhiAttention.*cache=full"):
        _generate(cm, _calib(3)[:, :PROMPT])


def test_a_static_cache_is_refused_in_one_line(base, tiny_palu):
    from transformers import StaticCache

    cm = tiny_palu[1]
    cache = StaticCache(config=cm.config, max_cache_len=32)
    with pytest.raises(GacError, match="dynamic cache layers, not StaticLayer.*cache=full"):
        cm(base[3][:1, :PROMPT], past_key_values=cache, use_cache=True)


def test_an_offloaded_cache_is_refused_in_one_line(base, tiny_palu):
    """transformers 5 offloads a cache of plain dynamic layers (a flag on the cache): the latent layers' rotary views
    would keep the keys on the device, so it is refused before anything is cached."""
    from transformers import DynamicCache

    cm = tiny_palu[1]
    cache = DynamicCache(config=cm.config, offloading=True)
    with pytest.raises(GacError, match=r"cannot be offloaded.*generate without cache offloading or compress with "
                                       r"the PaLU option cache=full") as e:
        cm(base[3][:1, :PROMPT], past_key_values=cache, use_cache=True)
    assert "\n" not in str(e.value)
    assert not any(getattr(layer, "palu_latent", False) or layer.is_initialized for layer in cache.layers)


def test_cache_full_is_the_parameter_only_palu():
    from gac.compression.latent_cache import has_latent_cache
    from tests.compression.test_families import _calib, family_model

    m = family_model("qwen2")
    cm, _, rep = _compress(m, _calib(), cache="full")
    assert rep["kv_cache"] == {"mode": "full", "latent_layers": 0} and not has_latent_cache(cm)
    ids = _calib(3)[:, :PROMPT]
    assert _bytes_per_token(cm, ids) == _bytes_per_token(m, ids)
    with pytest.raises(GacError, match="unknown PaLU cache 'latnt'.*did you mean 'latent'"):
        _compress(m, _calib(), cache="latnt")


def test_a_checkpoint_keeps_the_latent_cache_and_old_ones_load_as_they_ran(base, tiny_palu, tmp_path):
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_format import META_FILE, meta_sha256
    from gac.compression.checkpoint_load import load_checkpoint
    from gac.compression.latent_cache import has_latent_cache, remove

    cm = tiny_palu[1]
    ids = base[3][:1, :PROMPT]
    want = _generate(cm, ids)
    save_checkpoint(cm, None, tmp_path / "ck")
    meta = json.loads((tmp_path / "ck" / META_FILE).read_text())
    assert meta["kv_cache"] == "latent" and meta["recipe"]["options"]["cache"] == "auto"
    back, _ = load_checkpoint(tmp_path / "ck")
    assert has_latent_cache(back)
    assert torch.equal(_generate(back, ids), want)
    # a checkpoint saved before the latent cache (no kv_cache field): loads, caching the rebuilt K/V as it ran
    del meta["kv_cache"]
    meta["meta_sha256"] = meta_sha256(meta)
    (tmp_path / "ck" / META_FILE).write_text(json.dumps(meta))
    old, _ = load_checkpoint(tmp_path / "ck")
    assert not has_latent_cache(old)
    assert torch.equal(_generate(old, ids), want)
    # a parameter-only PaLU model saves as one
    full = copy.deepcopy(cm)
    remove(full)
    save_checkpoint(full, None, tmp_path / "full")
    assert json.loads((tmp_path / "full" / META_FILE).read_text())["kv_cache"] == "full"
    assert not has_latent_cache(load_checkpoint(tmp_path / "full")[0])


def test_a_deep_copy_keeps_its_own_latent_cache(base, tiny_palu):
    """The hooks hold names, not modules: a copy rebuilds from its own weights."""
    cm = copy.deepcopy(tiny_palu[1])
    twin = copy.deepcopy(cm)
    with torch.no_grad():
        for p in cm.parameters():
            p.zero_()
    assert _step_errors(twin, base[3][:1, :PROMPT], steps=3) < 1e-5


# ------------------------------------------------------------------------------------------------ rank_cap
def test_no_head_group_holds_more_than_its_dense_weight_by_default(base, tiny_palu):
    """rank_cap=break_even by default: a group's factors never outweigh its dense rows (with the latent cache its
    codes are then fewer than its K/V too); rank_cap=full still reaches the full rank, past break-even."""
    from gac.compression.compressors import get_compressor
    from gac.compression.discovery import discover

    model = base[0]
    lay = discover(model)
    units = get_compressor("palu").units(model, lay)
    assert all(u.d_cap * u.params_per_dim <= u.dense_params for u in units)
    assert all(u.d_cap < u.d_full for u in units)  # fewer codes than the group's K/V width
    by = {u.name: u for u in units}
    assert all(d * by[n].params_per_dim <= by[n].dense_params for n, d in tiny_palu[2].dims.items())
    full = get_compressor("palu", rank_cap="full").units(model, lay)
    assert all(u.d_cap == u.d_full and u.d_cap * u.params_per_dim > u.dense_params for u in full)


@pytest.mark.slow
def test_the_benchmark_measures_what_the_cache_holds(tmp_path):
    """benchmarks/palu_cache.py on tiny: the bytes it reports are the codes' (and dense's K/V), greedy tokens equal."""
    from benchmarks.palu_cache import main

    out, doc = tmp_path / "p.json", tmp_path / "p.md"
    assert main(["--model", "tiny", "--text", "tiny", "--calib", "4x64", "--prompt", "32", "--new", "4", "--rounds",
                 "2", "--iters", "1", "--out", str(out), "--doc", str(doc)]) == 0
    res = json.loads(out.read_text())
    rows = {r["label"]: r for r in res["rows"]}
    assert rows["dense"]["cache_bytes_per_token"] == 4 * 2 * 128 * 4
    for s in ("unaligned", "gac"):
        latent, full = rows[f"PaLU {s}, latent cache"], rows[f"PaLU {s}, parameters only"]
        assert full["cache_bytes_per_token"] == rows["dense"]["cache_bytes_per_token"]
        assert latent["cache_bytes_per_token"] == (latent["codes_per_token"] + 128) * 4 and latent["exact"]
    assert "| PaLU gac, latent cache |" in doc.read_text()
    with pytest.raises(SystemExit):  # a result is never overwritten
        main(["--model", "tiny", "--out", str(out)])


def test_decode_latency_decodes_with_the_latent_cache_and_says_so(base, tiny_palu):
    from gac.compression.latent_cache import remove
    from gac.evaluation.latency import decode_latency

    kw = dict(prompt_len=8, new_tokens=2, warmup=0, iters=1, trials=1, detect_backend=False)
    assert decode_latency(base[0], **kw)["kv_cache"] == "full"
    assert decode_latency(tiny_palu[1], **kw)["kv_cache"] == "latent"
    twin = copy.deepcopy(tiny_palu[1])
    remove(twin)
    assert decode_latency(twin, **kw)["kv_cache"] == "full"
