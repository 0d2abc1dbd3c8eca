"""The bench's statistics (interleaving order, paired bootstrap), checked by hand; its FLOPs: test_flops.py."""

import numpy as np
import pytest

from gac.errors import GacError
from gac.evaluation.bench_stats import round_orders
from gac.stats import paired_ratio_ci


def test_every_round_visits_every_variant_once_in_a_fresh_seeded_shuffle():
    orders = round_orders(5, 40, seed=3)
    assert len(orders) == 40
    assert all(sorted(o) == [0, 1, 2, 3, 4] for o in orders)
    assert len({tuple(o) for o in orders}) > 20  # shuffled afresh, not one order repeated
    assert len({o[0] for o in orders}) == 5  # every variant gets to go first
    assert round_orders(5, 40, seed=3) == orders  # deterministic with a seed
    assert round_orders(5, 40, seed=4) != orders


def _rounds(ratio, n=20, seed=0, drift=0.3, noise=0.03):
    """Paired samples with a planted ratio: a drift common to both sides of a round, plus independent noise."""
    rng = np.random.default_rng(seed)
    common = 100.0 * (1 + drift * rng.random(n))
    den = common * (1 + noise * rng.standard_normal(n))
    num = ratio * common * (1 + noise * rng.standard_normal(n))
    return num, den


@pytest.mark.parametrize("planted", [0.8, 1.0, 1.25])
def test_the_paired_bootstrap_interval_covers_the_planted_ratio(planted):
    covered = 0
    for seed in range(20):
        num, den = _rounds(planted, seed=seed)
        r, lo, hi = paired_ratio_ci(num, den, resamples=2000, seed=seed)
        assert lo <= r <= hi
        covered += lo <= planted <= hi
    assert covered >= 17  # a 95% interval: 19 of 20 expected, 17 allowed for bootstrap noise
    num, den = _rounds(planted, seed=99)
    _, lo, hi = paired_ratio_ci(num, den)
    assert hi - lo < 0.1 * planted  # pairing removes the 30% drift: the interval is narrow


def test_pairing_matters():
    num, den = _rounds(1.1, seed=5)
    _, lo, hi = paired_ratio_ci(num, den, seed=0)
    _, ulo, uhi = paired_ratio_ci(num, np.random.default_rng(1).permutation(den), seed=0)  # pairs broken
    assert hi - lo < uhi - ulo


def test_the_bootstrap_refuses_unpaired_input():
    with pytest.raises(GacError, match="equally long"):
        paired_ratio_ci([1.0, 2.0, 3.0], [1.0, 2.0])
