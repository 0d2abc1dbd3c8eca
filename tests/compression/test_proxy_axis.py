"""The proxy axis changes what it claims to: under an allocation that reads it (Eq. 2's proportional rule) every
proxy gives its own d*; ASVD's sensitivity search never reads it (a proxy sweep under it is refused by the sweep
check, tests/jobs/test_proxy_sweep.py)."""

import pytest

PROXIES = ("magnitude", "activation", "random")


def _d_star(p, ratio=0.2):
    targets, _ = p.targets(ratio)
    return tuple(round(t.d_star, 6) for t in targets)


@pytest.mark.parametrize("compressor", ["asvd", "svd_llm"])
def test_each_proxy_gives_its_own_d_star_under_the_proportional_rule(prepared, compressor):
    stars = {px: _d_star(prepared(compressor, px, "proportional")) for px in PROXIES}
    assert len(set(stars.values())) == len(PROXIES), f"proxies with identical d*: {stars}"


def test_the_uniform_rule_gives_every_proxy_the_same_d_star(prepared):
    stars = {px: _d_star(prepared("asvd", px, "uniform")) for px in ("magnitude", "random")}
    assert len(set(stars.values())) == 1  # uniform: the same d* for every proxy (only the plans may differ)
