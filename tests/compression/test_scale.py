"""Scale: streamed statistics equal a plain forward's, fast factorisations against the exact SVD, per-stage
resources, in-place apply one layer at a time, gradient checkpointing, and the memory estimate."""

from __future__ import annotations

import pytest
import torch

from gac.compression.compressors.lowrank_math import (
    asvd_factors,
    asvd_scaling,
    compact_factors,
    rank_factors,
    svd_factors,
    svdllm_factors,
    whitened_factors,
    whitening,
)
from gac.compression.discovery import discover
from gac.compression.gradients import collect_gradient_stats
from gac.compression.importance import ELEMENTWISE, GRADIENT_STATS, WeightStats, iter_activation_stats
from gac.compression.preparation import prepare
from gac.compression.resources import ResourceMeter, current_rss
from gac.errors import GacError
from tests.compression.conftest import small_model


# ---------------------------------------------------------------------------------------------------- streaming
def _reference_stats(model, ids, names):
    """X^T X, sum x^2, sum |x| and Y^T Y of every projection from one plain forward of the whole model."""
    acc = {n: {"xtx": 0, "sq": 0, "abs": 0, "yty": 0, "tokens": 0} for n in names}
    hs = []
    for n in names:
        def hook(m, args, out, _n=n):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            y = out.reshape(-1, out.shape[-1]).double()
            a = acc[_n]
            a["xtx"] = a["xtx"] + x.T @ x
            a["sq"] = a["sq"] + (x * x).sum(0)
            a["abs"] = a["abs"] + x.abs().sum(0)
            a["yty"] = a["yty"] + y.T @ y
            a["tokens"] += x.shape[0]
        hs.append(model.get_submodule(n).register_forward_hook(hook))
    with torch.no_grad():
        for s in range(ids.shape[0]):
            model(input_ids=ids[s : s + 1], use_cache=False)
    for h in hs:
        h.remove()
    return acc


@pytest.fixture(scope="module")
def small():
    """A 2-layer random Llama (hidden 128, GQA) and 3 x 32 calibration tokens: what these checks need, quickly."""
    model = small_model(num_hidden_layers=2)
    calib = torch.randint(0, 512, (3, 32), generator=torch.Generator().manual_seed(0))
    return model, calib


def test_streamed_statistics_equal_a_plain_forward(small):
    model, calib = small
    lay = discover(model)
    names = lay.linear_names()
    ref = _reference_stats(model, calib, names)
    seen_layers = []
    for li, st in iter_activation_stats(model, lay, calib, names, xtx=True, yty=names):
        seen_layers.append(li)
        assert set(st) == set(lay.linear_names(layers=[li]))  # one layer's statistics at a time
        for n, w in st.items():
            r = ref[n]
            assert w.tokens == r["tokens"]
            for mine, theirs in ((w.xtx, r["xtx"]), (w.act_sq, r["sq"]), (w.act_abs, r["abs"]), (w.yty, r["yty"])):
                torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6 * float(theirs.abs().max()))
        # projections fed the same input share one set of sums (computed once)
        q, k = st[lay.projection(li, "q_proj").name], st[lay.projection(li, "k_proj").name]
        assert q.xtx is k.xtx and q.act_sq is k.act_sq
    assert seen_layers == list(range(lay.num_layers))


def test_only_needed_layers_run_and_selected_grams():
    model = small_model(num_hidden_layers=3)
    lay = discover(model)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    name = lay.projection(1, "down_proj").name
    got = list(iter_activation_stats(model, lay, ids, [name], xtx=False, yty=[name]))
    assert [li for li, _ in got] == [1]
    st = got[0][1][name]
    assert st.xtx is None and st.yty.shape == (128, 128) and st.act_abs.shape == (344,)


@pytest.mark.parametrize("compressor", ["asvd", "svd_llm", "llm_pruner", "palu"])
def test_streaming_prepare_equals_collect_then_factorise(small, compressor):
    model, calib = small
    a = prepare(model, None, compressor, calib_ids=calib, stream=True)
    b = prepare(model, None, compressor, calib_ids=calib, stream=False)
    assert a.scores == pytest.approx(b.scores, rel=1e-12)
    for n, f in a.factors.items():
        for k, v in f.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, b.factors[n][k]), (n, k)
    for stage in ("gradients" if compressor == "llm_pruner" else "calibration", "score", "factorize"):
        assert a.memory[stage]["peak_rss_mb"] > 0 and a.timings[f"{stage}_s"] >= 0


# ---------------------------------------------------------------------------------------------- factorisations
def _planted(m, n, seed=0, decades=3.0):
    g = torch.Generator().manual_seed(seed)
    lo = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(m, lo, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, lo, generator=g, dtype=torch.float64))
    s = torch.logspace(0, -decades, lo, dtype=torch.float64)
    X = torch.randn(4 * n, n, generator=g, dtype=torch.float64) * torch.logspace(0, -1, n, dtype=torch.float64)
    return ((U * s) @ V.T).float(), X, U


TOL = {"gram64": 1e-9, "gram32": 2e-3, "randomized": 5e-2}


@pytest.mark.parametrize("shape", [(48, 96), (96, 48), (64, 64)])
@pytest.mark.parametrize("method", ["gram64", "gram32", "randomized"])
def test_fast_factorisations_match_the_exact_svd(shape, method):
    """Top-k at the break-even rank: each method's error in its compressor's metric is within TOL of the exact
    float64 SVD's, the plain SVD's top-k subspace matches, and S holds the singular values."""
    m, n = shape
    W, X, U = _planted(m, n)
    k = m * n // (m + n)
    act = X.abs().mean(0).float()
    C = X.T @ X
    Y = X @ W.double().T
    cases = {
        "svd": (lambda meth: svd_factors(W, k, method=meth, return_sigma=True),
                lambda A, B: torch.linalg.norm(W.double() - A.double() @ B.double())),
        "asvd": (lambda meth: asvd_factors(W, act, max_rank=k, method=meth, return_sigma=True),
                 lambda A, B: torch.linalg.norm((W.double() - A.double() @ B.double()) * act.double().sqrt())),
        "svd_llm": (lambda meth: svdllm_factors(W, C, max_rank=k, method=meth, yty=Y.T @ Y, return_sigma=True),
                    lambda A, B: torch.linalg.norm(X @ (W.double() - A.double() @ B.double()).T)),
    }
    for name, (fact, err) in cases.items():
        ex = fact("exact")
        got = fact(method)
        A, B, S = got[0], got[1], got[-1]
        assert A.shape == (m, k) and B.shape == (k, n) and S.shape == (k,)
        e0, e1 = float(err(ex[0], ex[1])), float(err(A, B))
        assert e1 <= e0 * (1 + TOL[method]) + 1e-7, (name, e0, e1)
        torch.testing.assert_close(S, ex[-1], rtol=50 * TOL[method], atol=1e-6)
        if name == "svd":  # the top-k left subspace itself (a gap of ~1% between consecutive singular values)
            Q, _ = torch.linalg.qr(A.double())
            P = U[:, :k] @ U[:, :k].T
            assert float(torch.linalg.norm(P - Q @ Q.T, 2)) < (1e-6 if method == "gram64" else 0.2)


@pytest.mark.parametrize("method", ["gram64", "gram32"])
def test_gram_methods_reproduce_the_weight_at_full_rank(method):
    for m, n in ((40, 24), (24, 40)):
        W, X, _ = _planted(m, n, seed=1, decades=1.0)
        atol = 1e-5 if method == "gram64" else 2e-3
        A, B = svd_factors(W, method=method)
        torch.testing.assert_close(A @ B, W, atol=atol, rtol=atol)
        A, B = asvd_factors(W, X.abs().mean(0).float(), method=method)
        torch.testing.assert_close(A @ B, W, atol=atol, rtol=atol)
        A, B, how = svdllm_factors(W, X.T @ X, method=method)
        torch.testing.assert_close(A @ B, W, atol=atol, rtol=atol)
        assert how == ("gram" if m <= n else "cholesky")


def test_unknown_method_and_missing_gram_fail_clearly():
    W = torch.randn(8, 4)
    with pytest.raises(GacError, match="did you mean 'gram32'"):
        svd_factors(W, method="gram23")
    with pytest.raises(GacError, match="needs X\\^T X"):
        svdllm_factors(W, None, method="gram32", yty=torch.eye(8, dtype=torch.float64))
    with pytest.raises(GacError, match="svd="):
        prepare(small_model(), None, "asvd", calib_ids=torch.zeros(1, 4, dtype=torch.long),
                compressor_options={"svd": "fast"})


def test_svd_llm_default_uses_output_grams_and_matches_exact(small):
    model, calib = small
    fast = prepare(model, None, "svd_llm", calib_ids=calib, compressor_options={"svd": "gram64"})
    exact = prepare(model, None, "svd_llm", calib_ids=calib, compressor_options={"svd": "exact"})
    hows = {f["whitening"] for f in fast.factors.values()}
    assert "gram" in hows  # q/k/v/o/down from Y^T Y
    for n, f in fast.factors.items():
        k = min(f["S"].numel(), 16)
        ref = exact.factors[n]
        A, B = rank_factors(f, model.get_submodule(n).weight, k)
        torch.testing.assert_close(A @ B, ref["A"][:, :k] @ ref["B"][:k], rtol=2e-3, atol=2e-4)
        # Y^T Y is accumulated from the model's float32 outputs: small singular values differ at ~1e-7 of the top one
        torch.testing.assert_close(f["S"], ref["S"], rtol=1e-5, atol=1e-6 * float(ref["S"].max()))


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
def test_compact_factors_rebuild_the_dropped_factor(shape):
    """Only the smaller factor is stored; the other comes back from W (plain, ASVD, SVD-LLM's output-Gram path)."""
    m, n = shape
    W, X, _ = _planted(m, n, seed=2, decades=2.0)
    act = X.abs().mean(0).float()
    Y = X @ W.double().T
    runs = [asvd_factors(W, act, max_rank=12, method="gram64", return_sigma=True) + (asvd_scaling(act),),
            svd_factors(W, 12, method="gram64", return_sigma=True) + (None,)]
    if m <= n:
        A, B, _, S = svdllm_factors(W, None, max_rank=12, method="gram64", yty=Y.T @ Y, trace=1.0, return_sigma=True)
        runs.append((A, B, S, None))
    for A, B, S, scale in runs:
        f = compact_factors(A, B, S, scale)
        assert set(f) - {"col_scale2"} == ({"A", "S"} if m <= n else {"B", "S"})
        for r in (1, 5, 12):
            A2, B2 = rank_factors(f, W, r)
            torch.testing.assert_close(A2 @ B2, A[:, :r] @ B[:r], rtol=1e-4, atol=1e-5)


def test_error_curve_reads_the_singular_values(small, prepared):
    model, calib = small
    p = prepare(model, None, "asvd", calib_ids=calib, compressor_options={"svd": "exact"})  # keeps both factors
    comp, u = p.compressor, p.units[0]
    from_s = comp.error_curve(u, p.factors)
    from_a = comp.error_curve(u, {u.name: {"A": p.factors[u.name]["A"]}})
    torch.testing.assert_close(from_s, from_a, rtol=1e-4, atol=1e-9)
    q = prepared("asvd")  # the default stores one factor per weight: about a quarter of the dense weights on tiny
    stored = sum(v.numel() for f in q.factors.values() for v in f.values() if isinstance(v, torch.Tensor))
    assert stored < 0.35 * q.dense_params


# ------------------------------------------------------------------------------------------------ apply and plan
def test_in_place_apply_one_layer_at_a_time_equals_copy(small):
    model, calib = small
    held = calib[:1]
    import copy

    p1 = prepare(copy.deepcopy(model), None, "asvd", calib_ids=calib)
    m1, plan1, rep = p1.compress(0.3, "gac", copy_model=True)
    m2, plan2, _ = p1.compress(0.3, "gac", copy_model=False)
    assert plan1.dims == plan2.dims and p1.factors == {}  # the in-place path drops factors as it goes
    with torch.no_grad():
        torch.testing.assert_close(m1(held).logits, m2(held).logits, rtol=0, atol=0)
    assert {"plan", "apply", "calibration", "factorize"} <= set(rep["memory"])


# ------------------------------------------------------------------------------------------------ gradients
def test_gradient_checkpointing_gives_the_same_statistics():
    model = small_model(num_hidden_layers=3)
    lay = discover(model)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    names = [lay.projection(i, p).name for i in range(3) for p in ("gate_proj", "down_proj")]
    a = collect_gradient_stats(model, ids, names, elementwise=ELEMENTWISE)
    b = collect_gradient_stats(model, ids, names, elementwise=ELEMENTWISE, checkpoint=True, layout=lay)
    for n in names:
        for what in GRADIENT_STATS:  # the element-wise statistics (taylor_mean, fisher_rms) too
            torch.testing.assert_close(getattr(a[n], what), getattr(b[n], what), rtol=1e-5, atol=1e-12)
    assert all(not hasattr(layer, "forward") or "forward" not in vars(layer) for layer in model.model.layers)
    with pytest.raises(GacError, match="layout"):
        collect_gradient_stats(model, ids, names, checkpoint=True)


def test_merge_keeps_output_grams_and_every_gradient_statistic(small):
    model, calib = small
    lay = discover(model)
    n = lay.projection(0, "gate_proj").name
    (_, act), *_ = iter_activation_stats(model, lay, calib, [n], xtx=False, yty=[n])
    grad = collect_gradient_stats(model, calib, [n], elementwise=ELEMENTWISE)[n]
    st = WeightStats()
    st.merge(act[n])
    st.merge(grad)
    assert st.yty is act[n].yty and st.act_abs is act[n].act_abs
    for what in GRADIENT_STATS:
        assert getattr(st, what) is getattr(grad, what) is not None, what


@pytest.mark.parametrize("compressor, proxy", [("llm_pruner", "taylor"), ("palu", "fisher_rms")])
def test_streamed_prepare_scores_with_the_elementwise_proxies(small, compressor, proxy):
    """The compressors' own element-wise proxies survive the streamed, checkpointed gradient pass unchanged."""
    model, calib = small
    opts = {"layers": "0:2"} if compressor == "llm_pruner" else {"group_size": 1}  # more than one unit
    a = prepare(model, None, compressor, calib_ids=calib, grad_checkpoint=True, compressor_options=opts)
    b = prepare(model, None, compressor, calib_ids=calib, grad_checkpoint=False, stream=False, compressor_options=opts)
    assert a.proxy == proxy and a.scores == pytest.approx(b.scores, rel=1e-5)
    assert len(set(a.scores.values())) > 1  # real scores, not a constant


@pytest.mark.parametrize("method", ["gram64", "gram32", "randomized"])
@pytest.mark.parametrize("shape", [(64, 256), (256, 64)])
def test_palu_whitened_factors_fast_methods_match_exact(shape, method):
    m, n = shape
    g = torch.Generator().manual_seed(3)
    W = torch.randn(m, n, generator=g) @ torch.diag(torch.logspace(0, -2, n))
    X = torch.randn(4 * n, n, generator=g) * torch.logspace(0, -1, n)
    L, how = whitening(X.double().T @ X.double())
    k = min(m, n) // 2

    def err(A, B):
        return float(torch.linalg.norm(X.double() @ (W.double() - A.double() @ B.double()).T))

    A0, B0, S0 = whitened_factors(W, L, max_rank=k, method="exact", how=how, return_sigma=True)
    A1, B1, S1 = whitened_factors(W, L, max_rank=k, method=method, how=how, return_sigma=True)
    tol = 1e-2 if method == "randomized" else 1e-4
    assert err(A1, B1) <= err(A0, B0) * (1 + tol)
    torch.testing.assert_close(S1, S0, rtol=tol, atol=tol * float(S0[0]))
    Af, Bf = whitened_factors(W, L, method=method, how=how)  # full rank: the weight back
    if method != "randomized":
        torch.testing.assert_close(Af @ Bf, W, rtol=0, atol=2e-3 * float(W.abs().max()))


# ------------------------------------------------------------------------------------------------ resources
def test_resource_meter_sees_a_peak_inside_a_stage():
    meter = ResourceMeter("cpu", interval=0.002)
    n = 64 * 1024 * 1024 // 8  # 64 MiB of float64
    with meter.stage("outer"):
        with meter.stage("big"):
            x = torch.ones(n, dtype=torch.float64)
            x += 1
            del x
        with meter.stage("small"):
            y = torch.ones(1024)
            del y
        with meter.stage("big"):  # a second entry: time adds up, peak is the max
            pass
    mem, t = meter.memory(), meter.timings()
    assert mem["big"]["peak_rss_mb"] - mem["big"]["start_rss_mb"] > 50
    assert mem["outer"]["peak_rss_mb"] >= mem["big"]["peak_rss_mb"]
    assert mem["small"]["peak_rss_mb"] < mem["big"]["peak_rss_mb"]
    assert set(t) == {"outer_s", "big_s", "small_s"} and t["outer_s"] >= t["big_s"]
    assert meter.peak_mb() >= mem["big"]["peak_rss_mb"] and current_rss() > 0


def test_memory_estimate_will_not_fit():
    from transformers import AutoConfig

    from gac.compression.footprint import check_fits, estimate_footprint

    cfg = AutoConfig.for_model("llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    fp = estimate_footprint(cfg, "svd_llm", dtype="float32", device="cpu", n_samples=32, seq_len=2048)
    assert fp.params == 8_030_261_248 and fp.weights == fp.params * 4
    assert fp.device_bytes > fp.weights + fp.factors
    with pytest.raises(GacError, match=r"will not fit: host memory: needs about \d+\.\d GiB, 16\.0 GiB") as e:
        check_fits(fp, {"device": "cpu", "available_mb": 16 * 1024})
    assert "bfloat16" in str(e.value) and "GPU" in str(e.value)
    gpu = estimate_footprint(cfg, "llm_pruner", dtype="bfloat16", device="cuda", n_samples=32, seq_len=2048,
                             grad_checkpoint=False)
    ck = estimate_footprint(cfg, "llm_pruner", dtype="bfloat16", device="cuda", n_samples=32, seq_len=2048,
                            grad_checkpoint=True)
    assert ck.gradients < gpu.gradients < 80 * 2**30 - gpu.weights  # the 8B gradient plan fits one 80 GB GPU
    check_fits(gpu, {"device": "cuda:0", "available_mb": 80 * 1024})
    with pytest.raises(GacError, match="calibration.seq_len"):
        check_fits(gpu, {"device": "cuda:0", "available_mb": 20 * 1024})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_statistics_and_factorisations_run_there(base):
    import copy

    model, tok, calib, _, _ = base
    gpu_model = copy.deepcopy(model).to("cuda")
    for comp in ("asvd", "svd_llm"):
        cpu = prepare(model, tok, comp, calib_ids=calib)
        gpu = prepare(gpu_model, tok, comp, calib_ids=calib)
        assert gpu.memory["factorize"]["gpu_peak_mb"] > 0 and gpu.memory["calibration"]["gpu_peak_mb"] > 0
        for n, f in gpu.factors.items():
            assert f["S"].device.type == "cpu"  # factors are kept on the host
            k = min(8, f["S"].numel())
            W = model.get_submodule(n).weight
            A, B = rank_factors(f, W.cuda(), k)
            A0, B0 = rank_factors(cpu.factors[n], W, k)
            torch.testing.assert_close((A @ B).cpu(), A0 @ B0, rtol=1e-2, atol=1e-3)
