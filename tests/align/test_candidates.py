import pytest

from gac.align import candidate_set, rule_candidates
from gac.align.targets import Target
from gac.errors import GacError


def T(**kw):
    base = dict(name="w", d_star=107.3, score=1.0, params_per_dim=10, d_max=4096)
    base.update(kw)
    return Target(**base)


def test_rule_candidates_window_and_unit():
    # multiples of 8 strictly within 8 units (64) of 107.3
    assert rule_candidates(107.3, 4096, unit=8, window=8) == tuple(range(48, 171, 8))
    assert rule_candidates(107.3, 4096, unit=8, window=2) == (96, 104, 112, 120)
    assert rule_candidates(107.3, 4096, unit=32, window=2) == (64, 96, 128, 160)


def test_clipped_to_unit_and_d_max_with_d_max_allowed():
    assert rule_candidates(3.0, 100, unit=8, window=2) == (8, 16)
    assert rule_candidates(100.0, 107, unit=8, window=2) == (88, 96, 104, 107)
    # d_max below the unit: the only candidate is d_max
    assert rule_candidates(3.0, 5, unit=8, window=2) == (5,)


@pytest.mark.parametrize("unit", [8, 16, 32, 64])
def test_all_rule_candidates_are_aligned_or_d_max(unit):
    for d_star in [0.25, 1.5, 63.9, 107.3, 1000.2, 4090.0]:
        for c in rule_candidates(d_star, 4096, unit=unit, window=4):
            assert c % unit == 0 or c == 4096
            assert unit <= c <= 4096
            assert abs(c - d_star) < 4 * unit or c == 4096


def test_explicit_candidates_are_used_as_given():
    assert candidate_set(T(candidates=(112, 96, 104))) == (96, 104, 112)


def test_filter_removes_cliffs_and_errors_when_empty():
    t = T()
    assert candidate_set(t, window=2, candidate_filter=lambda tg, dims: [d for d in dims if d != 104]) == (96, 112, 120)
    with pytest.raises(GacError, match="removed every candidate"):
        candidate_set(t, window=2, candidate_filter=lambda tg, dims: [])
    with pytest.raises(GacError, match="may only remove"):
        candidate_set(t, window=2, candidate_filter=lambda tg, dims: [*dims, 107])


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(d_star=float("nan")), "d_star must be a finite"),
        (dict(d_star=0.0), "d_star must be a finite number > 0"),
        (dict(d_star=-1.0), "d_star must be a finite number > 0"),
        (dict(score=float("nan")), "score must be a finite"),
        (dict(score=float("inf")), "score must be a finite"),
        (dict(score=-1.0), "score must be >= 0"),
        (dict(d_star=5000.0), "exceeds d_max"),
        (dict(params_per_dim=0), "params_per_dim must be a positive integer"),
        (dict(params_per_dim=2.5), "params_per_dim must be a positive integer"),
        (dict(candidates=()), "candidate list is empty"),
        (dict(candidates=(8, 9000)), "exceeds d_max"),
        (dict(candidates=(0,)), "positive integers"),
        (dict(name=""), "empty or non-string name"),
        (dict(kind="attention"), "unknown kind"),
    ],
)
def test_bad_targets(kw, msg):
    with pytest.raises(GacError, match=msg):
        T(**kw)


def test_d_star_zero_is_refused_and_huge_windows_are_bounded():
    from gac.align.candidates import MAX_CANDIDATES

    with pytest.raises(GacError, match="d_star must be a finite number > 0"):
        rule_candidates(0.0, 4096, unit=8, window=1)
    with pytest.raises(GacError, match="give the target a d_max"):
        rule_candidates(10.0, None, unit=8, window=1_000_000)
    # with d_max the window is clipped before anything is enumerated: every multiple of 8 up to d_max, at once
    assert rule_candidates(10.0, 4096, unit=8, window=1_000_000) == tuple(range(8, 4097, 8))
    assert len(rule_candidates(10.0, 8 * MAX_CANDIDATES, unit=8, window=10**9)) == MAX_CANDIDATES
    # exact arithmetic: a d* of 1e17 keeps its window (floats lose it: (d* - 8) / 8 rounds to d* / 8)
    assert rule_candidates(1e17, None, unit=8, window=1) == (10**17,)
