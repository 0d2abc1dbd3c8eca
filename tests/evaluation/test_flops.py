"""FLOPs of one prefill forward from the module shapes (gac.evaluation.flops), checked by hand."""

from torch import nn

from gac.compression.modules import GroupedLowRankLinear, LowRankLinear
from gac.compression.structure import Structure, architecture
from gac.evaluation.flops import attention_flops, linear_flops, prefill_flops

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
