"""The GAC authors' Table 5 procedures as gac options, checked against benchmarks/parity_refs/gac_authors.py.

The package side: the ``stable_rank_svd`` compressor and its allocation (:mod:`gac.compression.stable_rank`), the
``authors_dp`` and ``round_to`` strategies (:mod:`gac.align.authors_dp`) and the sliding-window perplexity
(:mod:`gac.evaluation.perplexity`). Scores, ideal ranks, budgets and DP ranks must be identical to the
re-implementation of the authors' script; perplexities equal to float rounding (gac's SVD is float64, theirs
float32). Stable-rank scores depend on LAPACK's threading in their last bits, so both sides run on one thread.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random

import pytest
import torch

from benchmarks.parity_refs import gac_authors as ref
from gac.align import align
from gac.align.authors_dp import (
    authors_dp,
    authors_dp_dims,
    authors_round_to_n,
    authors_window,
    round_to,
)
from gac.align.targets import Target
from gac.compression.compressors.stable_rank_svd import StableRankSVD
from gac.compression.stable_rank import linear_table, stable_rank_kept, stable_rank_targets
from gac.errors import GacError, InfeasibleBudgetError
from gac.evaluation.perplexity import sliding_perplexity_of_ids, sliding_windows

RATIOS = (0.15, 0.3, 0.45)


@contextlib.contextmanager
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def key(name: str):
    parts = name.split(".")
    return int(parts[2]), parts[-1]


@pytest.fixture(scope="module")
def authors(base):
    """The reference's sensitivity and plans, and gac's prepared stable_rank_svd (no calibration, no tokenizer)."""
    from gac.compression.preparation import prepare

    model = base[0]
    with one_thread():
        sens = ref.layer_sensitivity(model)
        plans = {}
        shapes = ref.projection_shapes(model)
        fisher = ref.fisher_from_sensitivity(sens)
        for r in RATIOS:
            ideal = ref.ideal_ranks(model, sens, 1 - r)
            budget = ref.param_cost(ideal, shapes)
            dp, info = ref.gac_dp(ideal, fisher, budget, shapes, ref.num_layers(model))
            plans[r] = {"ideal": ideal, "budget": budget, "gac_dp": dp, "dp_info": info,
                        "aligned_8": ref.round_to_n(ideal, fisher, budget, shapes, 8),
                        "kept": ref.kept_ratios(model, sens, 1 - r)}
        prepared = prepare(model, None, StableRankSVD())
        targets = {r: stable_rank_targets(prepared, r) for r in RATIOS}
    return {"sens": sens, "fisher": fisher, "shapes": shapes, "plans": plans, "prepared": prepared, "targets": targets}


def test_compressor_units_and_no_calibration(authors):
    p = authors["prepared"]
    assert p.compressor.name == "stable_rank_svd" and p.allocation == "stable_rank" and p.calibration == {}
    assert len(p.units) == len(authors["shapes"])
    for u in p.units:
        out, inp = authors["shapes"][key(u.name)]
        assert not u.dense_option and u.d_cap == u.d_full == min(out, inp) and u.params_per_dim == out + inp


def test_stable_rank_scores_identical(authors, base):
    with one_thread():
        table = linear_table(base[0])
    assert [n for n, _, _ in table] == list(authors["sens"])  # every Linear, lm_head included, in the same order
    assert any(n.endswith("lm_head") for n, _, _ in table)
    for n, _, sr in table:
        assert {p: sr * (1 - p) for p in ref.GRID} == authors["sens"][n]
    scores = authors["prepared"].scores
    assert {key(n): s for n, s in scores.items()} == authors["fisher"]


@pytest.mark.parametrize("ratio", RATIOS)
def test_ideal_ranks_and_budget_identical(authors, ratio):
    want = authors["plans"][ratio]
    targets, budget = authors["targets"][ratio]
    assert {key(t.name): int(t.d_star) for t in targets} == want["ideal"]
    assert all(t.d_star == int(t.d_star) for t in targets)
    assert budget == want["budget"]
    with one_thread():
        table = linear_table(authors["prepared"].model)
    assert stable_rank_kept(table, 1 - ratio) == want["kept"]
    assert {key(t.name): t.score for t in targets} == authors["fisher"]
    assert len(set(want["ideal"].values())) > 3  # the allocation is not uniform: the DP has choices to make


@pytest.mark.parametrize("ratio", RATIOS)
def test_authors_dp_ranks_identical(authors, ratio):
    want = authors["plans"][ratio]
    targets, budget = authors["targets"][ratio]
    assert want["dp_info"]["path"] == "dp" and not want["dp_info"]["over_budget"]
    plan = align(targets, budget, "authors_dp")
    assert {key(n): d for n, d in plan.dims.items()} == want["gac_dp"]
    assert plan.budget_met and plan.params <= budget and plan.stats["budget_repair_steps"] == 0
    assert plan.aligned_fraction == 1.0
    dims, info = authors_dp_dims(targets, budget)
    assert info == want["dp_info"]
    rounded = align(targets, budget, "authors_round")
    assert {key(n): d for n, d in rounded.dims.items()} == want["aligned_8"] and rounded.budget_met
    # the authors' unaligned row is their ideal ranks, which gac's unaligned strategy keeps as they are
    unaligned = align(targets, budget, "unaligned")
    assert {key(n): d for n, d in unaligned.dims.items()} == want["ideal"] and unaligned.params == budget
    # the exact knapsack on the same targets and budget is at least as good on Eq. 4's objective
    gac_plan = align(targets, budget, "gac", window=4)
    assert gac_plan.objective >= plan.objective - 1e-9 * abs(plan.objective)


def _synthetic(seed: int):
    """Random small problems in the reference's form and as gac targets (aligned shapes)."""
    rnd = random.Random(seed)
    n_layers = rnd.randint(1, 2)
    shapes, base_ranks, fisher = {}, {}, {}
    for layer in range(n_layers):
        for p in ref.ALL_PROJS:
            m, n = 8 * rnd.randint(1, 6), 8 * rnd.randint(1, 6)
            shapes[(layer, p)] = (m, n)
            base_ranks[(layer, p)] = rnd.randint(1, min(m, n))
            fisher[(layer, p)] = rnd.random()
    budget = int(ref.param_cost(base_ranks, shapes) * rnd.uniform(0.5, 1.2))
    targets = [Target(f"model.layers.{k[0]}.x.{k[1]}", float(base_ranks[k]), fisher[k], sum(shapes[k]),
                      d_max=min(shapes[k]), kind="lowrank") for k in shapes]
    return shapes, base_ranks, fisher, budget, n_layers, targets


@pytest.mark.parametrize("seed", range(40))
def test_authors_dp_matches_reference_on_random_problems(seed):
    shapes, base_ranks, fisher, budget, n_layers, targets = _synthetic(seed)
    want, info = ref.gac_dp(base_ranks, fisher, budget, shapes, n_layers)
    dims, got = authors_dp_dims(targets, budget)
    assert {key(t.name): d for t, d in zip(targets, dims)} == want and got == info
    assert authors_round_to_n(targets, budget) == [ref.round_to_n(base_ranks, fisher, budget, shapes)[k] for k in shapes]


def test_authors_dp_over_budget_is_repaired_and_said():
    """Seed 140: the authors' single down pass leaves the plan over a feasible budget; gac holds it."""
    shapes, base_ranks, fisher, budget, n_layers, targets = _synthetic(140)
    want, info = ref.gac_dp(base_ranks, fisher, budget, shapes, n_layers)
    assert info["path"] == "dp" and info["over_budget"] and ref.param_cost(want, shapes) > budget
    dims, notes, stats = authors_dp(targets, None, budget)
    cost = sum(t.params(d) for t, d in zip(targets, dims))
    assert cost <= budget and stats["over_budget"] and stats["budget_repair_steps"] >= 1
    assert any("over budget" in n for n in notes)
    plan = align(targets, budget, "gac", window=4)  # the exact knapsack, for scale: it always holds the budget
    assert plan.budget_met


def test_authors_dp_infeasible_and_greedy_fallback():
    shapes, base_ranks, fisher, budget, n_layers, targets = _synthetic(1)
    _, info = ref.gac_dp(base_ranks, fisher, budget, shapes, n_layers)
    assert info["over_budget"]  # the authors' greedy cannot reach it either: every rank at 8 costs more
    with pytest.raises(InfeasibleBudgetError):
        authors_dp(targets, None, budget)
    # above 500,000 cells the authors switch to round_to_n: a 1-parameter-per-rank unit makes the cells tiny
    t = [Target("a", 4000.0, 1.0, 1, d_max=4096), Target("b", 100.0, 2.0, 1, d_max=4096)]
    dims, info = authors_dp_dims(t, 600_000 * 8)
    assert info["path"] == "greedy" and dims == authors_round_to_n(t, 600_000 * 8)


def test_authors_window():
    t = Target("w", 517.0, 1.0, 10, d_max=520)
    assert authors_window(t) == [496, 504, 512, 520]  # round(517 / 8) * 8 = 520, +-3 units, at most d_max
    assert authors_window(Target("h", 20.0, 1.0, 10, d_max=64)) == [8, 16, 24, 32, 40]  # round(2.5) = 2
    assert authors_window(Target("s", 3.0, 1.0, 10, d_max=64)) == [8, 16, 24]


def test_dense_targets_stay_dense():
    t = [Target("d", 64.0, 1.0, 128, dense_params=64 * 64, shape=(64, 64), kind="lowrank"),
         Target("f", 30.0, 1.0, 128, d_max=64)]
    dims, notes, stats = authors_dp(t, None, 64 * 64 + 128 * 32)
    assert dims[0] == 64 and dims[1] % 8 == 0 and 64 * 64 + 128 * dims[1] <= 64 * 64 + 128 * 32


def test_round_to_is_llm_pruners_rounding():
    """LLM-Pruner's round_to: n_pruned = width - int(width * keep), n_pruned -= n_pruned % 8, kept = width - n."""
    for width, keep in ((688, 0.75), (688, 0.85), (1536, 0.7), (690, 0.75), (14336, 0.75), (688, 0.7)):
        d_star = width * keep
        n = width - int(width * keep)
        want = width - (n - n % 8)
        t = Target("mlp", d_star, 1.0, 3 * 256, d_max=width, kind="width")
        dims, notes, _ = round_to([t], None, 10**12)
        assert dims == [want] and want >= int(d_star) and "budget is not enforced" in notes[0]
        if width % 8:
            continue
        assert want % 8 == 0
        up = align([t], 10**12, "round_up").dims["mlp"]
        down = align([t], 10**12, "round_down").dims["mlp"]
        # gac's round_up is the same rounding except where floor(d*) is already aligned and d* is not whole
        assert up == (want + 8 if int(d_star) % 8 == 0 and d_star != int(d_star) else want)
        assert down <= want and (down < want or int(d_star) % 8 == 0)


# ------------------------------------------------------------------------------------------------ perplexity
SEQ, STRIDE = 64, 32


def _stream(base):
    return base[3].reshape(-1)[:256]  # 7 windows of 64 tokens


def test_sliding_windows_score_each_token_once():
    for n, L, s in ((512, 128, 64), (500, 128, 64), (300, 128, 128), (129, 128, 64), (1000, 128, 32)):
        w = sliding_windows(n, L, s)
        assert w[0] == (0, min(L, n), min(L, n) - 1) and w[-1][1] == n
        scored = [t for _, end, k in w for t in range(end - k, end)]
        assert len(scored) == len(set(scored))
        if s < L:  # every token but the first, once
            assert sorted(scored) == list(range(1, n))
        else:  # stride = seq_len: each window's first token has no context in it (the authors' loss too)
            assert sorted(scored) == [t for t in range(1, n) if t % L]


def test_sliding_perplexity_matches_reference(base):
    model = base[0]
    ids = _stream(base)
    with one_thread():
        want = ref.sliding_ppl(model, ids[None], seq_len=SEQ, stride=STRIDE)
        got = sliding_perplexity_of_ids(model, ids, seq_len=SEQ, stride=STRIDE)
        weighted = sliding_perplexity_of_ids(model, ids, seq_len=SEQ, stride=STRIDE, token_weighted=True)
    assert got["stride"] == STRIDE and got["n_windows"] == 7 and got["dropped_tokens"] == 0
    assert got["ppl"] == pytest.approx(want, rel=1e-5)
    assert weighted["ppl"] != got["ppl"] and math.isfinite(weighted["ppl"])
    with pytest.raises(GacError):
        sliding_perplexity_of_ids(model, ids, seq_len=SEQ, stride=0)


def test_perplexity_stride_option(base):
    model, tok = base[0], base[1]
    if tok is None:
        pytest.skip("the tiny fixture is not shipped here (random stand-in without a tokenizer)")
    from gac.evaluation.perplexity import perplexity
    from gac.text import load_text, tokenize_text

    with one_thread():
        got = perplexity(model, tok, "tiny", seq_len=SEQ, stride=STRIDE, max_windows=2)
        ids = tokenize_text(tok, load_text("tiny", "test"))
        want = sliding_perplexity_of_ids(model, ids, SEQ, STRIDE, max_windows=2)
        plain = perplexity(model, tok, "tiny", seq_len=SEQ, max_windows=2)
    assert got["ppl"] == want["ppl"] and got["stride"] == STRIDE and got["n_windows"] == 2
    assert "stride" not in plain and plain["ppl"] != got["ppl"]


def test_compressed_perplexity_matches_reference(authors, base):
    """The authors' "GAC DP" model (their truncated SVD of their ranks) against gac's apply of the same plan."""
    from gac.compression.prepared import compressed_weight_params

    model, ids, ratio = base[0], _stream(base), 0.3
    ranks = authors["plans"][ratio]["gac_dp"]
    p = authors["prepared"]
    dims = {u.name: ranks[key(u.name)] for u in p.units}
    with one_thread():
        theirs = copy.deepcopy(model)
        ref.svd_compress(theirs, ranks)
        want = ref.sliding_ppl(theirs, ids[None], seq_len=SEQ, stride=STRIDE)
        ours = copy.deepcopy(p.model)
        p.compressor.apply(ours, p.units, dims, p.factors)
        got = sliding_perplexity_of_ids(ours, ids, seq_len=SEQ, stride=STRIDE)["ppl"]
        dense = sliding_perplexity_of_ids(model, ids, seq_len=SEQ, stride=STRIDE)["ppl"]
    assert compressed_weight_params(ours, p.units) == ref.param_cost(ranks, authors["shapes"])
    assert got == pytest.approx(want, rel=1e-4) and got != dense  # the model did change


@pytest.mark.slow
def test_smollm2_ranks_identical():
    from gac.fixtures import smollm2

    if not smollm2.is_complete(smollm2.default_dir()):
        pytest.skip("smollm2 is not built here (gac fixtures build smollm2)")
    from gac.compression.preparation import prepare

    model, _ = smollm2.load_smollm2()
    with one_thread():
        want = ref.plan(model, 0.85)
        p = prepare(model, None, StableRankSVD(svd="gram64"))
        targets, budget = stable_rank_targets(p, 0.15)
    assert {key(t.name): int(t.d_star) for t in targets} == want["ideal"] and budget == want["budget"]
    plan = align(targets, budget, "authors_dp")
    assert {key(n): d for n, d in plan.dims.items()} == want["gac_dp"] and plan.budget_met
    # the same through the registry's wiring (Prepared's stable_rank allocation, the config's knapsack_score)
    wired, _ = p.plan(0.15, "authors_dp", knapsack_score="proxy")
    assert wired.dims == plan.dims and wired.budget == want["budget"]
    rounded = align(targets, budget, "authors_round")
    assert {key(n): d for n, d in rounded.dims.items()} == want["aligned_8"]


def test_prepared_compress_stable_rank_authors_dp(authors):
    """Prepared.compress end to end through the registry (allocation stable_rank, strategy authors_dp): the
    authors' ranks, and the plan's accounting holds on the compressed model."""
    with one_thread():
        model, plan, report = authors["prepared"].compress(0.3, "authors_dp", knapsack_score="proxy")
    assert {key(n): d for n, d in plan.dims.items()} == authors["plans"][0.3]["gac_dp"]
    assert report["budget_met"] and report["params_counted"] == plan.params <= authors["plans"][0.3]["budget"]
    assert report["budget"] == authors["plans"][0.3]["budget"]
    assert report["recipe"]["compressor"] == "stable_rank_svd" and report["recipe"]["allocation"] == "stable_rank"
    rounded, _ = authors["prepared"].plan(0.3, "authors_round", knapsack_score="proxy")
    assert {key(n): d for n, d in rounded.dims.items()} == authors["plans"][0.3]["aligned_8"]
    marginal, _ = authors["prepared"].plan(0.3, "gac")  # the default knapsack score works on these targets too
    assert marginal.budget_met and marginal.budget == authors["plans"][0.3]["budget"]


def test_alignment_unit_reaches_the_authors_strategies(authors):
    targets, budget = authors["targets"][0.15]
    for strategy in ("authors_dp", "authors_round"):
        plan = align(targets, budget, strategy, unit=16)
        assert plan.budget_met and all(d % 16 == 0 for d in plan.dims.values()), strategy
    dims, notes, _ = authors_dp(targets, None, budget, unit=16)
    assert dims == list(align(targets, budget, "authors_dp", unit=16).dims.values()) and "units of 16" in notes[0]


def test_stable_rank_allocation_goes_with_its_compressor_only(authors):
    from gac.compression.allocation import resolve_allocation
    from gac.compression.compressors import get_compressor

    with pytest.raises(GacError, match="stable_rank_svd compressor's own"):
        resolve_allocation("stable_rank", get_compressor("asvd"))
    with pytest.raises(GacError, match="allocation=default"):
        resolve_allocation("proportional", get_compressor("stable_rank_svd"))
    assert resolve_allocation("default", get_compressor("stable_rank_svd")) == "stable_rank"
    with pytest.raises(GacError, match="sets its own budget"):
        authors["prepared"].targets(0.3, budget=1000)
