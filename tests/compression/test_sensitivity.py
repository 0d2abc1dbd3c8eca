"""ASVD's sensitivity search (its default allocation) and dense targets on the compressor side."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch
from torch import nn

from gac.compression.allocation import (
    SENSITIVITY_GRID,
    check_sensitivity_grid,
    proportional_allocation,
    reference_rank,
    sensitivity_allocation,
)
from gac.compression.compressors import get_compressor
from gac.compression.modules import LowRankLinear, get_module
from gac.compression.preparation import prepare
from gac.compression.prepared import Prepared, compressed_weight_params
from gac.errors import GacError, InfeasibleBudgetError

# ----------------------------------------------------------------------------------- the search on planted tables

# three weights: out x in = 64 x 64, 32 x 96, 48 x 80
SHAPES = [(64, 64), (32, 96), (48, 80)]
DENSE = [o * i for o, i in SHAPES]
PPD = [o + i for o, i in SHAPES]
CAP = [(d - 1) // p for d, p in zip(DENSE, PPD)]
DDIM = [min(s) for s in SHAPES]
GRID = (0.4, 0.6, 0.8)


def _cost(i, g):
    return DENSE[i] if g >= 1 else PPD[i] * reference_rank(DENSE[i], PPD[i], g)


def test_planted_table_gives_the_expected_allocation():
    base = 10.0
    # weight 0 is very sensitive (its every ratio costs more than any other entry), weight 2 insensitive
    table = [[30.0, 20.0, 15.0], [12.0, 11.0, 10.5], [10.3, 10.2, 10.1]]
    # sorted by ppl: 30 20 15 12 11 10.5 10.3 10.2 10.1 -> the cut at 3 accepts everything from 12 down
    budget = DENSE[0] + _cost(1, 0.4) + _cost(2, 0.4)
    d, scores, info = sensitivity_allocation(DENSE, PPD, CAP, table, GRID, base, budget, DDIM)
    assert d == [64.0, float(reference_rank(DENSE[1], PPD[1], 0.4)), float(reference_rank(DENSE[2], PPD[2], 0.4))]
    assert info["kept_ratio"] == [1.0, 0.4, 0.4] and info["threshold_ppl"] == 12.0
    assert info["params"] == budget
    # one parameter less: weight 0 can no longer stay dense; the next cut accepts its 0.8 entry (ppl 15)
    d, _, info = sensitivity_allocation(DENSE, PPD, CAP, table, GRID, base, budget - 1, DDIM)
    assert info["kept_ratio"] == [0.8, 0.4, 0.4] and d[0] == reference_rank(DENSE[0], PPD[0], 0.8)
    assert info["params"] <= budget - 1
    # the more sensitive a weight, the more it keeps; the per-parameter scores order the same way
    assert scores[0] > scores[1] > scores[2]


def _reference_loop(table, grid, target_ratio):
    """The reference's binary search (ASVD4LLM binary_search.py), written out: nominal ratios, last probed mid."""
    entries = sorted(((i, g, v) for i, row in enumerate(table) for g, v in zip(grid, row) if g < 1), key=lambda e: -e[2])

    def ratios(mid):
        r = [1] * len(table)
        for i, g, _ in entries[mid:]:
            r[i] = min(r[i], g)
        return r

    low, high, mid = 0, len(entries) - 1, 0
    while low < high:
        mid = (low + high) // 2
        r = ratios(mid)
        if sum(DENSE[i] * r[i] for i in range(len(r))) / sum(DENSE) > target_ratio:
            high = mid
        else:
            low = mid + 1
    return ratios(mid)


def test_reproduces_the_reference_rule_on_random_small_problems():
    rng = random.Random(5)
    grid = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    for _ in range(300):
        table = [sorted((rng.uniform(10, 40) for _ in grid), reverse=True) for _ in SHAPES]
        ref = _reference_loop(table, grid, rng.uniform(0.45, 0.95))
        exact = sum(_cost(i, g) for i, g in enumerate(ref))
        # at the reference's own parameter count gac chooses the reference's ratios
        d, _, info = sensitivity_allocation(DENSE, PPD, CAP, table, grid, 9.0, exact, DDIM)
        assert info["kept_ratio"] == [float(g) for g in ref]
        assert info["params"] == exact
        for i, g in enumerate(ref):
            assert d[i] == (DDIM[i] if g == 1 else reference_rank(DENSE[i], PPD[i], g))


def test_the_budget_always_holds_and_no_larger_cut_fits():
    rng = random.Random(11)
    for _ in range(200):
        table = [[rng.uniform(10, 40) for _ in GRID] for _ in SHAPES]
        lo = sum(_cost(i, 0.4) for i in range(3))
        budget = rng.randint(lo, sum(DENSE) - 1)
        d, _, info = sensitivity_allocation(DENSE, PPD, CAP, table, GRID, 9.0, budget, DDIM)
        spent = sum(DENSE[i] if d[i] == DDIM[i] else PPD[i] * int(d[i]) for i in range(3))
        assert spent == info["params"] <= budget
        # the next cut (one more entry refused) would not fit: the search keeps as much as the budget allows
        if info["cut"] + 1 <= info["entries"]:
            nxt = sensitivity_allocation(DENSE, PPD, CAP, table, GRID, 9.0, sum(DENSE) - 1, DDIM)[2]
            assert nxt["params"] >= info["params"]


def test_a_budget_below_the_grid_is_an_error():
    table = [[20.0, 15.0, 12.0]] * 3
    need = sum(_cost(i, 0.4) for i in range(3))
    with pytest.raises(InfeasibleBudgetError, match="smallest kept ratio 0.4") as e:
        sensitivity_allocation(DENSE, PPD, CAP, table, GRID, 10.0, need - 1, DDIM)
    assert e.value.min_budget == need and e.value.budget == need - 1


@pytest.mark.parametrize("grid,msg", [
    ((0.0, 0.5), "outside \\(0, 1\\]"),
    ((0.5, 1.5), "outside \\(0, 1\\]"),
    ((-0.1,), "outside"),
    ((), "non-empty"),
    ("a,b", "not a list of numbers"),
    ((1.0,), "no ratio below 1"),
    ((float("nan"), 0.5), "outside"),
])
def test_grid_validation(grid, msg):
    with pytest.raises(GacError, match=msg):
        check_sensitivity_grid(grid)
    with pytest.raises(GacError, match=msg):
        get_compressor("asvd", sensitivity_grid=grid)


def test_grid_is_normalised_and_accepts_text():
    assert check_sensitivity_grid("0.9, 0.4 0.6") == (0.4, 0.6, 0.9)
    assert check_sensitivity_grid([0.5, 0.5, 1]) == (0.5, 1.0)
    assert SENSITIVITY_GRID == (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # the reference's param_ratio_candidates


def test_proportional_rule_keeps_a_target_at_its_cap_dense():
    dense, ppd = [64 * 64, 64 * 64], [128, 128]
    dmax = [24, 24]  # the largest factorised fraction is 24 * 128 / 4096 = 0.75
    d = proportional_allocation(dense, ppd, dmax, [100.0, 1.0], 4096 + 1000, power=1.0, dense_dims=[64, 64])
    assert d[0] == 64.0 and d[1] <= 1000 / 128 + 1e-9
    d2 = proportional_allocation(dense, ppd, dmax, [100.0, 1.0], 4096 + 1000, power=1.0)
    assert d2[0] == 24.0  # without the dense option the target stops at d_max


# ----------------------------------------------------------------------------------- on the model (tiny)


def test_asvd_defaults_to_the_sensitivity_search_and_unaligned_reproduces_it(prepared):
    p = prepared("asvd")
    assert p.allocation == "sensitivity" and p.sensitivity["grid"] == list(SENSITIVITY_GRID)
    assert len(p.sensitivity["table"]) == len(p.units) and all(len(r) == 6 for r in p.sensitivity["table"])
    model, plan, report = p.compress(0.3, "unaligned")
    kept = report["allocation_search"]["kept_ratio"]
    for u in p.units:
        g = kept[u.name]
        want = u.d_full if g == 1 else reference_rank(u.dense_params, u.params_per_dim, g)
        assert plan.dims[u.name] == want, u.name  # exactly the reference's rank (or dense)
        mod = get_module(model, u.name)
        assert isinstance(mod, nn.Linear if g == 1 else LowRankLinear)
    assert report["params_counted"] == plan.params <= plan.budget
    assert set(plan.dense) == {u.name for u in p.units if kept[u.name] == 1}


def test_gac_aligns_the_sensitivity_allocation_under_the_same_budget(prepared, base, base_ppl):
    from tests.compression.conftest import ppl

    p = prepared("asvd")
    un_model, un, _ = p.compress(0.3, "unaligned")
    al_model, al, _ = p.compress(0.3, "gac")
    assert al.budget == un.budget and al.budget_met and al.aligned_fraction == 1.0
    assert set(al.dense) == set(un.dense)  # window 1: the search's dense weights stay dense
    assert ppl(al_model, base[3]) < 2 * base_ppl


def test_dense_targets_apply_checkpoint_and_audit(prepared, base, tmp_path):
    from gac.compression.audit import audit_model
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_format import read_meta
    from gac.compression.checkpoint_load import load_checkpoint

    model, tok, _, held, _ = base
    p = prepared("asvd")
    cm, plan, report = p.compress(0.15, "gac")
    assert plan.dense, "the sensitivity search keeps some weights dense at rho = 0.15"
    assert compressed_weight_params(cm, p.units) == plan.params
    d = tmp_path / "ckpt"
    save_checkpoint(cm, tok, d)
    meta = read_meta(d)
    for name in plan.dense:
        assert meta["modules"][name]["type"] == "linear"
    assert meta["plan"]["dense"] == plan.dense
    m2, _ = load_checkpoint(d)
    with torch.no_grad():
        assert torch.equal(m2(held[:1]).logits, cm(held[:1]).logits)
    rep = audit_model(m2)
    rows = {r["name"]: r for r in rep["weights"]}
    for name in plan.dense:
        assert rows[name]["type"] == "linear" and "rank" not in rows[name]["dims"]


def test_sensitivity_table_round_trips_and_a_damaged_one_is_refused(prepared, base, tmp_path):
    from safetensors.torch import load_file, save_file

    from gac.compression.prepared_io import _META_KEY

    p = prepared("asvd")
    path = tmp_path / "state.safetensors"
    p.save(path)
    q = Prepared.load(path, base[0], "asvd")
    assert q.sensitivity == p.sensitivity and q.allocation == "sensitivity"
    assert q.plan(0.3, "unaligned")[0].dims == p.plan(0.3, "unaligned")[0].dims
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()[_META_KEY])
    meta["sensitivity"]["table"] = meta["sensitivity"]["table"][:-1]
    bad = tmp_path / "bad.safetensors"
    save_file(load_file(str(path)), str(bad), metadata={_META_KEY: json.dumps(meta)})
    with pytest.raises(GacError, match="sensitivity table does not fit"):
        Prepared.load(bad, base[0], "asvd")


def test_sensitivity_logs_progress_with_eta(base, caplog):
    from tests.compression.conftest import small_model

    m = small_model(num_hidden_layers=1)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.INFO, logger="gac.compression.sensitivity"):
        prepare(m, None, "asvd", calib_ids=ids, compressor_options={"sensitivity_grid": (0.5, 0.9)})
    # the search's own lines (the cost line before it comes from gac.compression.preparation)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "gac.compression.sensitivity" and r.getMessage().startswith("sensitivity ")]
    assert len(lines) == 7 and lines[0].startswith("sensitivity 1/7 ") and "ETA" in lines[0]


def test_ratio_beyond_the_grid_fails_before_any_work(monkeypatch):
    from gac.compression import compress as C

    called = []
    monkeypatch.setattr(C, "prepare", lambda *a, **k: called.append(1))
    with pytest.raises(GacError, match="smallest kept ratio is 0.4"):
        C.compress_model(nn.Linear(2, 2), None, "asvd", ratio=0.7)
    assert not called


def test_svd_llm_defaults_to_the_uniform_ratio_of_its_reference(prepared):
    p = prepared("svd_llm")
    assert p.allocation == "uniform"
    plan, _ = p.plan(0.3, "unaligned")
    for u in p.units:
        # every weight at the same kept fraction: the reference's int(out * in * (1 - rho) / (out + in)), +-1
        want = int(u.dense_params * 0.7 / u.params_per_dim)
        assert abs(plan.dims[u.name] - want) <= 1, u.name


def test_low_rank_units_cap_below_break_even_and_apply_dense():
    from gac.compression.compressors.base import lowrank_unit

    u = lowrank_unit("w", 64, 64, ("w",), dense=True)
    assert u.d_cap == 31 and u.dense_dim == 64  # rank 32 would cost 32 * 128 = 64 * 64: dense is exact instead
    v = lowrank_unit("w", 64, 64, ("w",))
    assert v.d_cap == 32 and v.dense_dim is None  # no dense option (PaLU groups): the break-even rank stays


def test_a_plan_with_dense_targets_is_a_bench_structure_of_the_same_size(prepared, base):
    """Plans write a dense candidate as dim min(out, in); the bench's Structure keeps those Linears as they are."""
    from gac.compression.structure import Structure

    p = prepared("asvd")
    for strategy in ("unaligned", "gac"):
        plan, _ = p.plan(0.3, strategy)
        assert plan.dense, "the sensitivity search keeps some weights dense on this model"
        s = Structure(base[0].config, "float32", "asvd", p.compressor.options(), dict(plan.dims))
        assert not set(plan.dense) & set(s.specs)  # no low-rank module for a dense target
        assert s.compressed_params() == plan.params


@pytest.mark.parametrize("option,msg", [
    ("sensitivity_grid=[0.5,1.5]", "outside (0, 1]"),
    ("sensitivity_grid=0,0.5", "outside (0, 1]"),
    ("sensitivity_grid=[1.0]", "no ratio below 1"),
])
def test_cli_rejects_a_bad_sensitivity_grid_with_one_line(tmp_path, capsys, option, msg):
    from gac.cli import main

    rc = main(["compress", "tiny", "--compressor", "asvd", "--ratio", "0.15", "--option", option,
               "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_cli_and_config_reject_a_ratio_the_grid_cannot_reach(tmp_path, capsys):
    from gac.cli import main

    rc = main(["compress", "tiny", "--compressor", "asvd", "--ratio", "0.7", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "smallest kept ratio is 0.4" in err and err.count("\n") == 1
    assert main(["compress", "tiny", "--compressor", "asvd", "--ratio", "0.7", "--allocation", "proportional",
                 "--calib-samples", "0", "-o", str(tmp_path / "o2")]) == 2
    assert "--calib-samples" in capsys.readouterr().err  # proportional: the grid does not limit the ratio
