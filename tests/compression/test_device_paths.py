"""The CUDA-only paths of compression, checked on CPU through the same code (issue 21): the activation proxy's
device handling, the gradient statistics kept on the model's device, SVD-LLM's update solved on the model's device,
and a checkpoint reloaded in fp16/bf16 keeping its rotary inv_freq in float32."""

from __future__ import annotations

import copy

import pytest
import torch

from gac.compression.discovery import discover
from gac.compression.gradients import collect_gradient_stats
from gac.compression.importance import collect_activation_stats
from gac.compression.modules import get_module
from gac.compression.preparation import prepare
from gac.compression.proxies import get_proxy
from tests.compression.conftest import small_model

IDS = torch.randint(0, 512, (3, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def small():
    m = small_model()
    lay = discover(m)
    names = [n for n in lay.linear_names(("gate_proj", "up_proj", "down_proj"))]
    return m, lay, names


def test_activation_proxy_energies_are_host_float64_and_match_the_wanda_formula(small):
    m, lay, names = small
    stats = collect_activation_stats(m, lay, IDS, names)
    proxy = get_proxy("activation")
    for n in names:
        W, st = get_module(m, n).weight, stats[n]
        xn = (st.act_sq / st.tokens).sqrt()
        ref_rows = (W.detach().double().abs() * xn[None, :]).sum(1)
        ref_cols = W.detach().double().abs().sum(0) * xn
        rows, cols = proxy.row_energy(n, W, st), proxy.col_energy(n, W, st)
        assert rows.device.type == cols.device.type == "cpu" and rows.dtype == cols.dtype == torch.float64
        torch.testing.assert_close(rows, ref_rows, rtol=0, atol=0)
        torch.testing.assert_close(cols, ref_cols, rtol=0, atol=0)


def test_llm_pruner_and_palu_run_with_the_activation_proxy(small):
    """The two compressors whose row/column energies issue 21 found mixing devices (on a GPU): they run and score."""
    m, _, _ = small
    for comp in ("llm_pruner", "palu"):
        p = prepare(m, None, comp, "activation", calib_ids=IDS)
        assert p.scores and all(v >= 0 for v in p.scores.values())


def _reference_gradient_stats(model, ids, names):
    """The pre-issue-21 accumulation (a host copy per statistic per sample), for comparison."""
    params = {n: model.get_submodule(n).weight for n in names}
    sums = {n: {} for n in names}
    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)
    try:
        for s in range(ids.shape[0]):
            x = ids[s : s + 1]
            model(input_ids=x, labels=x, use_cache=False).loss.backward()
            for n, p in params.items():
                g, w = p.grad.detach().float(), p.detach().float()
                wg = w * g
                for what, v in (("taylor_row", wg.sum(1).abs()), ("taylor_col", wg.abs().sum(0)),
                                ("fisher_row", (g * g).sum(1)), ("fisher_col", (g * g).sum(0))):
                    v = v.double().cpu()
                    sums[n][what] = v if what not in sums[n] else sums[n][what] + v
                p.grad = None
    finally:
        for p, f in flags.items():
            p.requires_grad_(f)
            p.grad = None
    return sums


def test_gradient_statistics_accumulate_on_the_device_and_equal_the_host_copies(small):
    m, lay, names = small
    got = collect_gradient_stats(m, IDS, names)
    ref = _reference_gradient_stats(m, IDS, names)
    for n in names:
        for what, v in ref[n].items():
            t = getattr(got[n], what)
            assert t.device.type == "cpu" and t.dtype == torch.float64  # moved to the host once, at the end
            torch.testing.assert_close(t, v, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------------ SVD-LLM's update


def _old_local_update(model, units, dims, originals, calib_ids, layout, ridge=1e-8):
    """local_update as it was before issue 21 (X^T X accumulated and solved on the host), for comparison."""
    from gac.compression.compressors.local_update import LowRankLinear
    from gac.compression.sensitivity import LayerCache
    from gac.compression.swap import replace_module

    by_layer = {}
    for u in units:
        if u.name in dims and u.name in originals and isinstance(get_module(model, u.name), LowRankLinear):
            by_layer.setdefault(u.meta["layer"], []).append(u)
    errors = {}
    cache = LayerCache(model, layout, calib_ids)
    for layer in sorted(by_layer):
        cache.advance_to(layer)
        group = by_layer[layer]
        compressed = {u.name: get_module(model, u.name) for u in group}
        grams = {u.name: torch.zeros(u.meta["shape"][1], u.meta["shape"][1], dtype=torch.float64) for u in group}
        hooks = []
        for u in group:
            replace_module(model, u.name, originals[u.name])

            def hook(mod, inp, out, name=u.name, grams=grams):
                x = inp[0].detach().reshape(-1, inp[0].shape[-1]).double().cpu()
                grams[name] += x.T @ x

            hooks.append(originals[u.name].register_forward_hook(hook))
        for a in range(0, cache.hidden.shape[0], cache.chunk):
            cache.layers[layer](cache.hidden[a : a + cache.chunk], **cache.kwargs[layer])
        for h in hooks:
            h.remove()
        for u in group:
            replace_module(model, u.name, compressed[u.name])
        for u in group:
            mod, G = compressed[u.name], grams[u.name]
            W64, B = originals[u.name].weight.detach().double().cpu(), mod.down.weight.detach().double().cpu()
            BG = B @ G
            lhs = BG @ B.T
            lhs = lhs + ridge * (torch.trace(lhs) / lhs.shape[0] + 1e-30) * torch.eye(lhs.shape[0], dtype=lhs.dtype)
            A_new = torch.linalg.solve(lhs, BG @ W64.T).T
            D = W64 - A_new @ B
            errors[u.name] = float(torch.einsum("ij,jk,ik->", D, G, D))
            mod.up.weight.copy_(A_new.to(mod.up.weight.dtype))
    return errors


def test_svd_llm_update_on_the_model_device_equals_the_host_path(monkeypatch):
    import gac.compression.compressors.local_update as lu

    m = small_model()
    ids = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(0))
    prep = prepare(m, None, "svd_llm", calib_ids=ids, compressor_options={"update": True})
    new, plan, _ = prep.compress(0.3, "unaligned")
    with torch.no_grad():
        monkeypatch.setattr(lu, "local_update", lambda *a, **k: {n: (1.0, 0.0) for n in _old_local_update(*a, **k)})
        old, plan_old, _ = prep.compress(0.3, "unaligned")
    assert plan.dims == plan_old.dims
    from gac.compression.modules import LowRankLinear

    lowrank = [n for n in plan.dims if isinstance(get_module(new, n), LowRankLinear)]
    assert lowrank
    for n in lowrank:
        a, b = get_module(new, n).up.weight, get_module(old, n).up.weight
        if not torch.equal(a, b):  # the refit keeps the old A when it would not lower the error: same rule both
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------- fp16 / bf16 reload


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_reload_keeps_inv_freq_float32_and_the_saved_logits(tmp_path, dtype):
    from transformers import LlamaForCausalLM

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_load import load_checkpoint
    from gac.fixtures.tiny import tiny_dir

    saved = LlamaForCausalLM.from_pretrained(str(tiny_dir()), dtype=dtype).eval()  # inv_freq float32, as HF does
    assert saved.model.rotary_emb.inv_freq.dtype == torch.float32
    save_checkpoint(saved, None, tmp_path / "ck")
    back, _ = load_checkpoint(tmp_path / "ck", dtype=str(dtype).removeprefix("torch."))
    assert back.model.rotary_emb.inv_freq.dtype == torch.float32
    assert back.model.layers[0].mlp.up_proj.weight.dtype == dtype
    x = torch.randint(0, saved.config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(back(input_ids=x).logits, saved(input_ids=x).logits)


def test_a_cast_reload_matches_from_pretrained_in_that_dtype(tmp_path):
    """An fp32 checkpoint reloaded as bf16 is the model from_pretrained(dtype=bf16) builds (same logits)."""
    from transformers import LlamaForCausalLM

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_load import load_checkpoint
    from gac.fixtures.tiny import tiny_dir

    fp32 = LlamaForCausalLM.from_pretrained(str(tiny_dir()), dtype=torch.float32).eval()
    save_checkpoint(fp32, None, tmp_path / "ck")
    back, _ = load_checkpoint(tmp_path / "ck", dtype="bfloat16")
    ref = LlamaForCausalLM.from_pretrained(str(tiny_dir()), dtype=torch.bfloat16).eval()
    x = torch.randint(0, fp32.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(back(input_ids=x).logits, ref(input_ids=x).logits)


def test_tiny_untrained_in_fp16_keeps_inv_freq_float32():
    from gac.models import load_model

    m, _ = load_model("tiny-untrained", dtype="fp16")
    assert m.model.rotary_emb.inv_freq.dtype == torch.float32
    assert m.model.layers[0].self_attn.q_proj.weight.dtype == torch.float16
    ref = copy.deepcopy(load_model("tiny-untrained", dtype="fp32")[0].model.rotary_emb.inv_freq)
    assert torch.equal(m.model.rotary_emb.inv_freq, ref)


# ------------------------------------------------------------------------------------------ resource meter


def test_a_timing_stage_pauses_the_sampler_thread_of_every_open_stage():
    import threading

    from gac.compression.resources import ResourceMeter

    def sampler_alive():
        return any(t.name == "gac-rss-sampler" and t.is_alive() for t in threading.enumerate())

    meter = ResourceMeter("cpu")
    with meter.stage("evaluate"):
        assert meter.sampling and sampler_alive()
        with meter.stage("latency", sample=False):
            assert not meter.sampling and not sampler_alive()
            with meter.stage("inner"):  # a sampled stage inside a paused one stays unsampled
                assert not meter.sampling
        assert meter.sampling and sampler_alive()  # the outer stage samples again
    assert not meter.sampling and not sampler_alive()
    mem = meter.memory()
    assert mem["latency"]["peak_rss_mb"] > 0 and mem["evaluate"]["peak_rss_mb"] >= mem["latency"]["peak_rss_mb"]


def test_gpu_free_memory_counts_this_process_cached_blocks(monkeypatch):
    """mem_get_info's free excludes what this process's caching allocator holds unused; its next allocations get
    that first, so the available memory is free + reserved - allocated (on the job's cuda:N)."""
    import gac.compression.resources as resources

    GiB = 2**30
    asked = []
    monkeypatch.setattr(resources, "_cuda", lambda device: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: asked.append(i) or (10 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 6 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 2 * GiB)
    got = resources.device_memory("cuda:1")
    assert got == {"device": "cuda:1", "total_mb": 80 * 1024, "available_mb": 14 * 1024} and asked == [1]


# ------------------------------------------------------------------------------------ benchmarks/scale.py on cuda


def _scale_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"
    spec = importlib.util.spec_from_file_location("scale_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scale_benchmark_on_cuda_passes_the_device_and_reports_the_gpu_peak(tmp_path, monkeypatch, capsys):
    import json
    import subprocess

    scale = _scale_module()
    cmds = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: cmds.append(cmd) or subprocess.CompletedProcess(cmd, 1, "",
                                                                                                            "no"))
    scale.main(["jobs", "--device", "cuda", "--shapes", "tiny", "--compressors", "asvd", "--out", str(tmp_path / "x")])
    scale.main(["grads", "--device", "cuda", "--shapes", "tiny", "--out", str(tmp_path / "x")])
    assert cmds and all("--device" in c and c[c.index("--device") + 1] == "cuda" for c in cmds)
    row = {"kind": "job", "shape": "l8bx2", "compressor": "asvd", "device": "cuda", "threads": 2, "params": 10**9,
           "timings": {"load_s": 1.0, "compress_prepare_s": 5.0}, "loadavg": [1.0], "arch": {},
           "memory": {"device": "cuda", "peak_rss_mb": 3 * 1024, "gpu_peak_mb": 20 * 1024,
                      "stages": {"load": {"peak_rss_mb": 3 * 1024, "gpu_peak_mb": 16 * 1024}}},
           "estimate": {"device_bytes": 21 * 2**30, "host_bytes": 2 * 2**30}}
    (tmp_path / "s.json").write_text(json.dumps([row]))
    capsys.readouterr()
    scale.main(["report", "--out", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("| l8bx2"))
    assert "| 20.00 (GPU) |" in line and "| 21.00 |" in line and "1.0 / 16.00" in line  # not the host's 3 GiB
