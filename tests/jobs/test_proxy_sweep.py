"""A sweep over the proxy must be able to change what it compares: refused before any work where it cannot."""

import pytest

from gac.errors import GacError
from gac.jobs.sweep.points import sweep_points


def test_a_proxy_sweep_under_asvds_sensitivity_search_is_refused():
    with pytest.raises(GacError, match="allocation=proportional"):
        sweep_points(["proxy=magnitude,random", "compressor=asvd"])

def test_proxy_compare_sweeps_an_allocation_that_reads_the_proxy():
    pts = sweep_points(["experiment=proxy_compare"])
    assert len(pts) == 10 and {p["spec"].allocation for p in pts} == {"proportional"}
    assert len({p["key"] for p in pts}) == 10


def test_a_proxy_sweep_under_the_stable_rank_allocation_is_refused():
    with pytest.raises(GacError, match="stable rank alone"):
        sweep_points(["proxy=magnitude,random", "compressor=stable_rank_svd"])
