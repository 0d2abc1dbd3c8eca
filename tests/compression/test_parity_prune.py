"""PaLU and LLM-Pruner at their references' defaults (issue #13): whitening, fisher_uniform, head-group validation,
param_first Taylor importance, the layer range, the default allocations, and the docs that describe them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gac.compression.allocation import ALLOCATIONS, fisher_uniform_allocation, resolve_allocation
from gac.compression.compressors import COMPRESSORS, get_compressor
from gac.compression.compressors.llm_pruner import layer_range
from gac.compression.compressors.lowrank_math import svd_factors, whitened_factors, whitening
from gac.compression.discovery import discover
from gac.compression.gradients import collect_gradient_stats
from gac.compression.importance import WeightStats, collect_activation_stats
from gac.compression.preparation import prepare
from gac.compression.proxies import PROXIES, get_proxy
from gac.errors import GacError
from tests.compression.conftest import small_model

DOCS = Path(__file__).resolve().parents[2] / "docs" / "compressors.md"


def _out_err(W, A, B, xtx):
    D = W.double() - A.double() @ B.double()
    return float(torch.trace(D @ xtx @ D.T) / torch.trace(W.double() @ xtx @ W.double().T)) ** 0.5


# ------------------------------------------------------------------------------------------------ PaLU: whitening
def test_whitened_factors_minimise_output_error():
    """SVD of W L: at every rank the output error on X is the optimum (the tail of W L's spectrum) and below plain SVD."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(48, 96, generator=g, dtype=torch.float64)
    X = torch.randn(2000, 96, generator=g, dtype=torch.float64) * torch.logspace(0, -3, 96, dtype=torch.float64)
    xtx = X.T @ X
    L, how = whitening(xtx)
    assert how == "cholesky"
    Aw, Bw = whitened_factors(W, L)
    As, Bs = svd_factors(W)
    sig = torch.linalg.svdvals(W @ L)
    for r in (8, 16, 32):
        ew, es = _out_err(W, Aw[:, :r], Bw[:r], xtx), _out_err(W, As[:, :r], Bs[:r], xtx)
        optimum = float((sig[r:].pow(2).sum() / sig.pow(2).sum()).sqrt())
        assert ew == pytest.approx(optimum, rel=1e-4)
        assert ew < 0.75 * es  # anisotropic inputs: whitening is clearly better than plain SVD
    torch.testing.assert_close((Aw @ Bw).double(), W, rtol=1e-4, atol=1e-4)  # full rank reproduces W


def test_palu_defaults_to_whiten_and_svd_is_an_option(base, prepared):
    model, _, calib, _, _ = base
    assert get_compressor("palu").decomposition == "whiten" and get_compressor("palu").needs_xtx
    assert not get_compressor("palu", decomposition="svd").needs_xtx
    with pytest.raises(GacError, match="unknown PaLU decomposition 'svdd'.*did you mean 'svd'"):
        get_compressor("palu", decomposition="svdd")
    pw, ps = prepared("palu"), prepared("palu", decomposition="svd")
    layout = discover(model)
    names = layout.linear_names(("k_proj", "v_proj"))
    xtx = collect_activation_stats(model, layout, calib, names, xtx=True)
    for u in pw.units:
        W = model.get_submodule(u.meta["module"]).weight.detach()[slice(*u.meta["rows"])]
        for r in (16, 32, 64):
            fw, fs = pw.factors[u.name], ps.factors[u.name]
            ew = _out_err(W, fw["A"][:, :r], fw["B"][:r], xtx[u.meta["module"]].xtx)
            es = _out_err(W, fs["A"][:, :r], fs["B"][:r], xtx[u.meta["module"]].xtx)
            assert ew < es, (u.name, r, ew, es)
        assert pw.factors[u.name]["whitening"].startswith("cholesky")


# ------------------------------------------------------------------------------------------------ PaLU: fisher_uniform
def test_fisher_uniform_planted_scores():
    """Rank proportional to the projection's score, split evenly over its groups, budget held, caps and floor."""
    ppd, dense = [10] * 6, [1000] * 6
    proj = ["a", "a", "b", "b", "c", "c"]
    scores = [1.0, 3.0, 4.0, 4.0, 1.0, 1.0]  # projection means: a 2, b 4, c 1 (a's groups differ: still an even split)
    d = fisher_uniform_allocation(dense, ppd, [500] * 6, scores, proj, budget=5600, min_rank=1)
    assert d == pytest.approx([80, 80, 160, 160, 40, 40], rel=1e-9)
    assert sum(p * x for p, x in zip(ppd, d)) == pytest.approx(5600)
    # b capped at 100 per group: its surplus goes to a and c, still 2 : 0.5
    d = fisher_uniform_allocation(dense, ppd, [500, 500, 100, 100, 500, 500], scores, proj, budget=5600, min_rank=1)
    assert d == pytest.approx([120, 120, 100, 100, 60, 60], rel=1e-9)
    # PaLU's floor: no group below 32 ranks (its rounding never keeps fewer); the rest stays proportional
    d = fisher_uniform_allocation(dense, ppd, [500] * 6, [1.0, 3.0, 4.0, 4.0, 0.01, 0.01], proj, budget=5600)
    assert d[4] == d[5] == pytest.approx(32)
    assert d[2] / d[0] == pytest.approx(2.0) and sum(p * x for p, x in zip(ppd, d)) == pytest.approx(5600)
    # a budget below the floor everywhere: the largest uniform floor it affords
    d = fisher_uniform_allocation(dense, ppd, [500] * 6, scores, proj, budget=1200)
    assert d == pytest.approx([20] * 6)
    # a budget above every cap: everything at d_max
    assert fisher_uniform_allocation(dense, ppd, [50] * 6, scores, proj, budget=10**6) == [50.0] * 6


def test_palu_default_allocation_splits_evenly(base):
    model, tok, calib, _, _ = base
    p = prepare(model, tok, "palu", calib_ids=calib, compressor_options={"group_size": 1})  # 2 groups per projection
    assert (p.proxy, p.allocation) == ("fisher_rms", "fisher_uniform")
    targets, budget = p.targets(0.4)
    by_proj: dict = {}
    for t, u in zip(targets, p.units):
        by_proj.setdefault(u.meta["module"], []).append(t.d_star)
    assert all(len(v) == 2 and v[0] == v[1] for v in by_proj.values())
    assert sum(t.d_star * t.params_per_dim for t in targets) == pytest.approx(budget, rel=1e-9)
    score = {m: sum(p.scores[u.name] for u in p.units if u.meta["module"] == m) for m in by_proj}
    free = [m for m, v in by_proj.items() if 32 < v[0] < 64]  # neither at the floor nor at full rank
    for a in free:
        for b in free:
            assert by_proj[a][0] / by_proj[b][0] == pytest.approx(score[a] / score[b], rel=1e-6)


# ------------------------------------------------------------------------------------------------ PaLU: head groups
def test_palu_group_size_must_divide_the_kv_heads(monkeypatch):
    m = small_model(num_attention_heads=8, num_key_value_heads=4, head_dim=16)
    import gac.compression.preparation as cc

    for f in ("iter_activation_stats", "collect_gradient_stats"):
        monkeypatch.setattr(cc, f, lambda *a, **k: pytest.fail("calibrated before validating"))
    ids = torch.randint(0, 512, (2, 16))
    with pytest.raises(GacError, match=r"PaLU group_size 3 does not divide the model's 4 KV heads; pass a group_size "
                                       r"that does \(one of \[1, 2, 4\]\), e\.g\. compressor option group_size=2"):
        prepare(m, None, "palu", calib_ids=ids, compressor_options={"group_size": 3})
    with pytest.raises(GacError, match="does not divide the model's 4 KV heads"):
        prepare(m, None, "palu", calib_ids=ids, compressor_options={"group_size": 8})
    assert get_compressor("palu").heads_per_group(4) == 4 and get_compressor("palu").heads_per_group(2) == 2
    with pytest.raises(GacError, match="positive number of KV heads"):
        get_compressor("palu", group_size=0)


def test_cli_bad_group_size_exits_2(capsys, base):
    from gac.cli import main

    assert main(["compress", "tiny", "--compressor", "palu", "--ratio", "0.2", "--option", "group_size=3",
                 "-o", "/nonexistent/never-written"]) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("Loading weights")]
    assert len(err) == 1 and "group_size 3 does not divide the model's 2 KV heads" in err[0]


# ------------------------------------------------------------------------------------------------ LLM-Pruner
def test_taylor_is_param_first_on_one_batch_mean_gradient():
    """gac's taylor statistics equal LLM-Pruner's: |W * G| summed, G from one backward of the batch-mean loss."""
    import copy

    m = small_model()
    ids = torch.randint(0, 512, (3, 16), generator=torch.Generator().manual_seed(1))
    names = ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj"]
    st = collect_gradient_stats(m, ids, names, elementwise=("taylor_mean", "fisher_rms"))
    ref = copy.deepcopy(m)
    ref(input_ids=ids, labels=ids).loss.backward()  # the reference: one batch, one backward
    for n in names:
        W = ref.get_submodule(n).weight
        t = (W * W.grad).abs().double()
        torch.testing.assert_close(st[n].taylor_mean_row, t.sum(1), rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(st[n].taylor_mean_col, t.sum(0), rtol=1e-4, atol=1e-9)
        assert not torch.allclose(st[n].taylor_row / 3, t.sum(1), rtol=1e-2)  # the old |sum w g| per sample differs
    # the pruner's channel energy: gate row + up row + down column (group reduction "sum")
    p = prepare(m, None, "llm_pruner", calib_ids=ids, compressor_options={"layers": [1]})
    f = p.factors["model.layers.1.mlp"]
    e = torch.empty_like(f["energy"])
    e[f["order"]] = f["energy"]
    g, u, d = (ref.get_submodule(n).weight for n in names)
    want = ((g * g.grad).abs().sum(1) + (u * u.grad).abs().sum(1) + (d * d.grad).abs().sum(0)).double()
    torch.testing.assert_close(e, want, rtol=1e-4, atol=1e-9)


def test_taylor_and_fisher_rms_by_hand():
    """A hand-computed example: two samples with known gradients; the proxies read sum |w g_bar| and sqrt(mean g^2)."""
    W = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    g1, g2 = torch.tensor([[1.0, 0.0], [-2.0, 2.0]]), torch.tensor([[0.0, 1.0], [0.0, 2.0]])
    gbar = (g1 + g2) / 2  # [[0.5, 0.5], [-1, 2]] -> |w gbar| = [[0.5, 1], [3, 8]]
    st = WeightStats(taylor_mean_row=(W * gbar).abs().sum(1).double(), taylor_mean_col=(W * gbar).abs().sum(0).double(),
                     fisher_rms_row=((g1**2 + g2**2) / 2).sqrt().sum(1).double())
    taylor, frms = get_proxy("taylor"), get_proxy("fisher_rms")
    assert taylor.row_energy("w", W, st).tolist() == [1.5, 11.0]
    assert taylor.col_energy("w", W, st).tolist() == [3.5, 9.0]
    assert taylor.weight_score("w", W, st) == pytest.approx(12.5 / 4)
    # sqrt(mean g^2) = [[sqrt(.5), sqrt(.5)], [sqrt(2), 2]]: the mean over the weight
    assert frms.weight_score("w", W, st) == pytest.approx((2 * 0.5**0.5 + 2**0.5 + 2) / 4)
    with pytest.raises(GacError, match="element-wise gradient statistic 'taylr'"):
        collect_gradient_stats(small_model(), torch.zeros(1, 4, dtype=torch.long), [], elementwise=("taylr",))


def test_layer_range_presets():
    assert list(layer_range("reference", 32)) == list(range(3, 31))
    assert list(layer_range("paper", 32)) == list(range(3, 32))
    assert list(layer_range("reference", 4)) == [0, 1, 2] and list(layer_range("reference", 80)) == list(range(7, 77))
    m = small_model(num_hidden_layers=4)
    assert [u.meta["layer"] for u in get_compressor("llm_pruner").units(m, discover(m))] == [0, 1, 2]
    assert [u.meta["layer"] for u in get_compressor("llm_pruner", layers="1:3").units(m, discover(m))] == [1, 2]
    with pytest.raises(GacError, match="unknown LLM-Pruner layers.*'papr'.*did you mean 'paper'"):
        get_compressor("llm_pruner", layers="papr")


def test_llm_pruner_unaligned_is_the_reference_uniform_width(prepared):
    p = prepared("llm_pruner")
    assert (p.proxy, p.allocation) == ("taylor", "uniform")
    width, ppd, n = p.units[0].d_full, p.units[0].params_per_dim, len(p.units)
    for rho in (0.15, 0.3):
        kept = n * ppd * int(width * (1 - rho))  # the reference: int(width * (1 - ratio)) channels in every layer
        plan, _ = p.plan(1 - (kept + 0.5) / p.dense_params, "unaligned")
        assert plan.budget == kept and set(plan.dims.values()) == {int(width * (1 - rho))}


# ------------------------------------------------------------------------------------------------ defaults and docs
def test_default_allocation_resolves_per_compressor():
    assert resolve_allocation(None, get_compressor("palu")) == "fisher_uniform"
    assert resolve_allocation("default", get_compressor("llm_pruner")) == "uniform"
    assert resolve_allocation("proportional", get_compressor("palu")) == "proportional"
    with pytest.raises(GacError, match="unknown allocation 'fisher_unifrm'.*did you mean 'fisher_uniform'"):
        resolve_allocation("fisher_unifrm", get_compressor("palu"))


def test_docs_name_every_default_and_option():
    text = DOCS.read_text()
    for name in (*PROXIES, *ALLOCATIONS, "whiten", "rank_cap", "break_even", "param_first", "range(3, 31)"):
        assert re.search(rf"`[^`]*{re.escape(name)}[^`]*`", text), name  # named in code font
    for name in ("palu", "llm_pruner"):
        cls = COMPRESSORS[name]
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"`{cls.default_proxy}`" in row and f"`{cls.default_allocation}`" in row, (name, row)
    assert "0.0030" in text and "0.0069" in text  # the measured output errors of PaLU's decompositions


# ------------------------------------------------------------------------------------------------ PaLU: fisher_loss
@pytest.mark.parametrize(("fisher_loss", "double_shift"), [("next_token", False), ("two_ahead", True)])
def test_palu_fisher_loss_matches_the_reference_code(fisher_loss, double_shift):
    """PaLU's per-projection Fisher, gac against benchmarks/parity_refs/palu.py: the ordinary loss by default, the
    reference code's doubly shifted (two tokens ahead) loss with fisher_loss="two_ahead"; and the two differ."""
    import copy

    from benchmarks.parity_refs.palu import fisher_info

    m = small_model()
    ids = torch.randint(0, 512, (3, 16), generator=torch.Generator().manual_seed(2))
    p = prepare(m, None, "palu", calib_ids=ids, compressor_options={"fisher_loss": fisher_loss})
    assert p.compressor.options()["fisher_loss"] == fisher_loss
    per_proj: dict = {}
    for u in p.units:
        per_proj.setdefault(u.meta["module"], []).append(p.scores[u.name])
    ref = {k: float(v.mean()) for k, v in fisher_info(copy.deepcopy(m), ids, double_shift=double_shift).items()}
    other = {k: float(v.mean()) for k, v in fisher_info(copy.deepcopy(m), ids, double_shift=not double_shift).items()}
    assert sorted(per_proj) == sorted(ref)
    for k, v in per_proj.items():
        assert sum(v) / len(v) == pytest.approx(ref[k], rel=1e-5)
    assert max(abs(ref[k] / other[k] - 1) for k in ref) > 1e-3  # the two losses give different Fisher


def test_palu_fisher_loss_is_checked():
    with pytest.raises(GacError, match="fisher_loss"):
        get_compressor("palu", fisher_loss="two")
    m = small_model()
    with pytest.raises(GacError, match="at least 3 tokens"):
        collect_gradient_stats(m, torch.zeros(1, 2, dtype=torch.long), ["model.layers.0.self_attn.k_proj"],
                               tokens_ahead=2)


def test_palu_fisher_loss_without_gradients_says_it_does_nothing(caplog):
    """fisher_loss shapes the gradient pass; with a proxy that takes no gradients it changes nothing, and the
    prepared result says so (a note in the record, a warning in the log) instead of accepting it silently."""
    m = small_model()
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(3))
    with caplog.at_level("WARNING", logger="gac.compression.preparation"):
        p = prepare(m, None, "palu", proxy="magnitude", calib_ids=ids, compressor_options={"fisher_loss": "two_ahead"})
    assert any("has no effect with proxy 'magnitude'" in n for n in p.notes)
    assert "takes no gradients" in caplog.text
    q = prepare(m, None, "palu", proxy="magnitude", calib_ids=ids)  # the default loss: nothing to say
    assert not any("no effect" in n for n in q.notes)
