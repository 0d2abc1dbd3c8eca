"""Head counts of a compressed model against kernels and engines: GQA, vLLM's tensor-parallel sizes, the audit's
head line."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("heads,kv,tp", [(9, 3, [1]), (32, 8, [1, 2, 4, 8]), (4, 2, [1, 2, 4]), (32, 32, [1, 2, 4, 8]),
                                         (28, 4, [1, 2, 4]), (14, 2, [1, 2])])
def test_vllm_tensor_parallel_sizes(heads, kv, tp):
    from gac.compression.audit import head_checks

    h = head_checks({}, 64, heads, kv)
    assert h["vllm_tp_sizes"] == tp and h["gqa_ok"]


def test_head_counts_from_the_weights():
    from gac.compression.audit import format_heads, head_checks

    rows = {0: {"q": 576, "k": 192}, 1: {"q": 400, "k": 192}}  # layer 1's q rows: not whole heads of 64
    h = head_checks(rows, 64, 9, 3)
    assert not h["gqa_ok"] and "not whole heads of 64" in h["problems"][0]
    assert "NOT accepted" in format_heads(h)
    rows[1]["q"] = 256  # 4 query heads over 3 KV heads
    h = head_checks(rows, 64, 9, 3)
    assert h["query_heads"] == [4, 9] and "4 query heads are not a multiple of 3 KV heads" in h["problems"][0]


def test_audit_prints_the_head_line(capsys):
    from gac.cli import main

    assert main(["audit", "smollm2"]) == 0
    out = capsys.readouterr().out
    assert "heads 9 query / 3 KV: GQA ok; vLLM tensor parallel TP=1 only (not 2, 4, 8" in out
    assert main(["audit", "tiny", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["heads"]["vllm_tp_sizes"] == [1, 2, 4] and rep["heads"]["query_heads"] == [4]
