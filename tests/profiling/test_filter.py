"""The profile-backed candidate filter drops cliff dims, per target kind, and plugs into align()."""

from __future__ import annotations

import pytest

from gac.align.candidates import candidate_set, rule_candidates
from gac.align.strategies import align
from gac.align.targets import Target
from gac.errors import GacError
from gac.profiling import ProfileFilter
from tests.profiling.synthetic import gemm_rows, profile_of, rows_for, sdpa_rows, tc_k16


def _t(name="w", d_star=107.3, kind="lowrank", **kw):
    return Target(name, d_star, score=1.0, params_per_dim=8192, kind=kind, **kw)


@pytest.fixture(scope="module")
def paper_like():
    """SDPA with the Math fallback, cuBLAS tiers on N/K, and Tensor Core K%16 near 4096."""
    rows = sdpa_rows() + gemm_rows("N", range(1024, 2049)) + gemm_rows("K", range(64, 129))
    rows += gemm_rows("K", range(4032, 4161), tc_k16, sweep="gemm_tput_K")
    return profile_of(rows)


def test_lowrank_keeps_multiples_of_16_from_tc_rule(paper_like):
    f = ProfileFilter(paper_like)
    # rule candidates 80..136 step 8; the K%16 rule measured near 4096 carries over to d* = 107.3
    assert rule_candidates(107.3, None, 8, 4) == (80, 88, 96, 104, 112, 120, 128, 136)
    assert candidate_set(_t(), unit=8, window=4, candidate_filter=f) == (80, 96, 112, 128)
    why = f.explain(_t(), [104])[104]
    assert any("K%16=0" in w for w in why)


def test_head_dim_consults_sdpa_only(paper_like):
    f = ProfileFilter(paper_like)
    dims = tuple(range(92, 121, 4))  # multiples of 4 (gac units are multiples of 8): the odd ones are SDPA cliffs
    assert tuple(f(_t(kind="head_dim"), dims)) == tuple(d for d in dims if d % 8 == 0)
    # head_dim is not a GEMM K: 104 (not a multiple of 16) stays
    assert 104 in f(_t(kind="head_dim"), [104, 112])


def test_generic_kind_keeps_everything(paper_like):
    f = ProfileFilter(paper_like)
    dims = list(range(100, 120))
    assert f(_t(kind="generic"), dims) == dims


def test_measured_isolated_cliff_is_dropped():
    def lat(n):
        return 0.001 * n * (1.5 if n == 1800 else 1.0)

    f = ProfileFilter(profile_of(rows_for("gemm_N", "gemm", "N", range(1024, 2049), lat)))
    assert f(_t(kind="width", d_star=1800.0), [1784, 1792, 1800, 1808]) == [1784, 1792, 1808]


def test_flat_profile_drops_nothing():
    f = ProfileFilter(
        profile_of(
            rows_for("gemm_N", "gemm", "N", range(64, 257), lambda d: 0.001 * d, noise=0.01, spread=0.01)
        )
    )
    dims = list(range(64, 257))
    assert f(_t(kind="width"), dims) == dims


def test_exact_target_context_decides_for_its_dims(paper_like):
    ctx = "lowrank:in=4096,out=4096"
    rows = rows_for(
        "target",
        "lowrank",
        "d",
        [96, 104, 112, 120, 128],
        lambda d: 0.001 * d * (1.4 if d == 120 else 1.0),
        context=ctx,
    )
    prof = profile_of(rows + gemm_rows("K", range(4032, 4161), tc_k16, sweep="gemm_tput_K"))
    f = ProfileFilter(prof)
    t = _t(meta={"in_features": 4096, "out_features": 4096})
    # measured at its own shapes: 104 is fine there (the K%16 sweep rule does not override), 120 is a cliff
    assert f(t, [96, 104, 112, 120, 128]) == [96, 104, 112, 128]
    # an unmeasured dim falls back to the sweeps' rules
    assert f(t, [136, 144]) == [144]
    # another shape has no exact measurements: the rules decide
    other = _t(meta={"in_features": 4096, "out_features": 1024})
    assert f(other, [104, 112]) == [112]


def test_everything_removed_is_a_clear_error():
    f = ProfileFilter(profile_of(gemm_rows("K", range(64, 129), tc_k16)))
    with pytest.raises(GacError, match="removed every candidate"):
        candidate_set(_t(d_star=104.0), unit=8, window=1, candidate_filter=f)  # only 104


def test_align_with_profile_avoids_cliffs(paper_like):
    f = ProfileFilter(paper_like)
    targets = [_t(f"l{i}.q", d_star=d, d_max=4096) for i, d in enumerate([107.3, 211.9, 150.2, 99.0])] + [
        Target("l0.head", 107.3, 2.0, 128, d_max=256, kind="head_dim")
    ]
    budget = sum(t.params_per_dim * round(t.d_star) for t in targets)
    plan = align(targets, budget, strategy="gac", unit=8, window=8, candidate_filter=f)
    assert plan.params <= budget
    for t in targets:
        d = plan.dims[t.name]
        assert f(t, [d]) == [d], f"{t.name}: {d} is a cliff"
        if t.kind == "lowrank":
            assert d % 16 == 0
