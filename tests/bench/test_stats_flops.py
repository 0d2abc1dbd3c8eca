"""The bench's statistics (interleaving order, paired bootstrap) and FLOPs, checked by hand."""

import numpy as np
import pytest
from torch import nn

from gac.compression.modules import GroupedLowRankLinear, LowRankLinear
from gac.compression.structure import Structure, architecture
from gac.errors import GacError
from gac.evaluation.bench_stats import round_orders
from gac.evaluation.flops import attention_flops, linear_flops, prefill_flops
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


T = 3 * 5  # batch 3, S = 5


def test_flops_of_one_layer_of_each_kind():
    assert linear_flops(nn.Linear(16, 8), T) == 2 * 15 * 16 * 8
    assert linear_flops(LowRankLinear(16, 8, 4), T) == 2 * 15 * 4 * (16 + 8)
    assert linear_flops(GroupedLowRankLinear(16, [8, 8], [2, 3]), T) == 2 * 15 * (16 * 5 + 2 * 8 + 3 * 8)
    # a pruned MLP (hidden 16, width 6 of 40): gate and up 16 -> 6, down 6 -> 16
    pruned = [nn.Linear(16, 6), nn.Linear(16, 6), nn.Linear(6, 16)]
    assert sum(linear_flops(m, T) for m in pruned) == 2 * 15 * 3 * 16 * 6
    # attention: QK^T and PV over the full S x S square, per head
    assert attention_flops(batch=3, seq_len=5, heads=4, head_dim=8) == 2 * (2 * 3 * 4 * 5 * 5 * 8)


def test_prefill_flops_of_tiny_by_hand():
    config = architecture("tiny")  # hidden 256, 4 heads of 64, 2 KV heads, MLP 688, 4 layers, vocab 4096
    f = prefill_flops(Structure(config, "float32").skeleton(), batch=2, seq_len=64)
    t = 2 * 64
    per_layer = 2 * t * (256 * 256 + 256 * 128 + 256 * 128 + 256 * 256 + 3 * 256 * 688)
    assert f["linear"] == 4 * per_layer
    assert f["attention"] == 4 * (2 * 2 * 2 * 4 * 64 * 64 * 64)
    assert f["lm_head"] == 2 * t * 256 * 4096
    assert f["total"] == f["linear"] + f["attention"] + f["lm_head"]
    # an ASVD plan: the low-rank q_proj of layer 0 at rank 40 replaces 256 x 256 by 40 x (256 + 256)
    g = prefill_flops(Structure(config, "float32", "asvd", {}, {"model.layers.0.self_attn.q_proj": 40}).skeleton(),
                      batch=2, seq_len=64)
    assert f["total"] - g["total"] == 2 * t * (256 * 256 - 40 * 512)
