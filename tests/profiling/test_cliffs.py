"""Cliff detection finds planted cliffs, rules and staircases in synthetic tables, and nothing in flat ones."""

from __future__ import annotations

import pytest

from gac.profiling.cliffs import analyze, sdpa_backend_table, summarize, tier_table
from tests.profiling.synthetic import cublas_tiers, gemm_rows, profile_of, rows_for, sdpa_rows, tc_k16


def test_sdpa_backend_fallback_and_fa2_staircase():
    prof = profile_of(sdpa_rows())
    a = analyze(prof.table, "sdpa_head_dim")
    assert a.cliffs == [d for d in range(64, 257) if d % 8]  # every misaligned dim, nothing else
    rule = a.constraint
    assert rule.period == 8 and rule.full
    assert rule.penalty == pytest.approx(0.9)
    assert a.steps["before"].tolist() == [64, 96, 128, 160, 192, 224]
    summary = summarize(prof.table)
    rows = {r.constraint: r for r in summary.itertuples()}
    assert rows["d%8=0"].mechanism == "SDPA backend (flash→math)"
    assert rows["d%8=0"].level == "Framework"
    assert rows["d%8=0"].penalty_pct == pytest.approx(90.0)
    assert rows["d%32=0 boundaries"].mechanism == "tile/template staircase"
    # jumps at template boundaries: 64->96 (+50%), 96->128 (+33%), ..., 224->256 (+14%); median of six is 22.5%
    assert rows["d%32=0 boundaries"].max_penalty_pct == pytest.approx(50.0)
    assert rows["d%32=0 boundaries"].penalty_pct == pytest.approx(22.5)
    backends = sdpa_backend_table(prof.table).set_index("backend")
    assert backends.loc["flash", "condition"] == "d%8=0"
    assert backends.loc["math", "condition"] == "any"


def test_cublas_tiers_give_mod8_rule_and_table3():
    prof = profile_of(gemm_rows("K"))
    a = analyze(prof.table, "gemm_K")
    assert set(a.cliffs) == {d for d in range(64, 128) if d % 8}  # 128 has no larger neighbour
    assert a.constraint.period == 8
    row = summarize(prof.table).iloc[0]
    assert (row.constraint, row.level) == ("K%8=0", "Library")
    assert row.mechanism.startswith("GEMM kernel tier (native→align")
    tiers = tier_table(prof.table).set_index("tier")
    assert tiers.loc["native", "condition"] == "d%8=0"
    assert tiers.loc["align2", "condition"] == "d%2=0"
    assert tiers.loc["align1", "condition"] == "odd"


def test_tensor_core_k16_rule_and_partial_residues():
    prof = profile_of(gemm_rows("K", range(4032, 4161), tc_k16, sweep="gemm_tput_K"))
    a = analyze(prof.table, "gemm_tput_K")
    assert a.constraint.period == 16
    assert 4040 in a.cliffs and 4048 not in a.cliffs
    assert summarize(prof.table).iloc[0].constraint == "K%16=0"


def test_kernel_switch_step_and_isolated_cliff():
    def lat(m):  # cuBLAS heuristic switch above 1728 (+30%), one bad shape at 1800 (+50%)
        return 0.001 * m * (1.3 if m > 1728 else 1.0) * (1.5 if m == 1800 else 1.0)

    prof = profile_of(rows_for("gemm_M", "gemm", "M", range(1024, 2049, 8), lat))
    a = analyze(prof.table, "gemm_M")
    assert a.cliffs == [1800]
    assert a.rules == []
    assert a.steps["before"].tolist() == [1728]
    summary = summarize(prof.table)
    assert "step M=1728→1736" in summary["constraint"].tolist()


@pytest.mark.parametrize("shape", ["linear", "constant"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_tables_have_no_cliffs(shape, seed):
    fn = (lambda d: 0.001 * d) if shape == "linear" else (lambda d: 0.02)
    prof = profile_of(
        rows_for("gemm_N", "gemm", "N", range(1024, 2049), fn, noise=0.01, spread=0.01, seed=seed)
    )
    a = analyze(prof.table, "gemm_N")
    assert a.cliffs == [] and a.rules == [] and a.steps.empty
    s = summarize(prof.table)
    assert s["constraint"].tolist() == ["none (flat)"]


def test_noise_does_not_make_rules():
    prof = profile_of(
        rows_for(
            "gemm_N", "gemm", "N", range(1024, 2049), lambda d: 0.001 * d, noise=0.04, spread=0.0, seed=3
        )
    )
    a = analyze(prof.table, "gemm_N", tolerance=0.05)
    assert a.rules == []  # a few noisy cliffs may appear, but no residue class is consistently slow


def test_cliffs_survive_noise():
    prof = profile_of(rows_for("gemm_K", "gemm", "K", range(64, 257), cublas_tiers, noise=0.02, spread=0.01))
    a = analyze(prof.table, "gemm_K")
    assert a.constraint is not None and a.constraint.period == 8
