"""`gac evaluate` scores any causal LM transformers can load (perplexity, tasks, latency need no layout): a
random-weight Bloom and DeepSeek-V3 (families gac has no layout for, or refuses to compress) are evaluated, and only
compressing them is refused."""

from __future__ import annotations

import json
import math

import pytest

from gac.cli import main
from tests.bad_input_fixtures_modelchecks import random_model


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    from transformers import BloomConfig, DeepseekV3Config

    root = tmp_path_factory.mktemp("families")
    bloom = BloomConfig(vocab_size=4096, hidden_size=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0)
    dsv3 = DeepseekV3Config(vocab_size=4096, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                            num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                            topk_group=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                            v_head_dim=16, max_position_embeddings=256, bos_token_id=0, eos_token_id=0,
                            pad_token_id=0)
    out = {}
    for name, cfg in (("bloom", bloom), ("deepseek_v3", dsv3)):
        (root / name).mkdir()
        out[name] = random_model(root / name, cfg)
    return out


@pytest.mark.parametrize("family,extra", [
    ("bloom", ["--latency", "--seq-len", "32", "--decode-tokens", "2", "--warmup", "0", "--iters", "1",
               "--trials", "1"]),
    ("deepseek_v3", ["--seq-len", "32"]),
])
def test_a_family_without_a_layout_is_evaluated(families, family, extra, tmp_path, capsys):
    out = tmp_path / "e.json"
    rc = main(["evaluate", str(families[family]), "--ppl", "--ppl-data", "tiny", "--ppl-windows", "2", *extra,
               "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    m = json.loads(out.read_text())["metrics"]
    assert math.isfinite(m["ppl_tiny"]) and m["ppl_tiny"] > 1
    if "--latency" in extra:
        assert m["prefill_ms"] > 0 and m["decode_ms_per_token"] > 0


@pytest.mark.parametrize("family,why", [("bloom", "gac has no layout for model_type 'bloom'"),
                                        ("deepseek_v3", "gac does not compress deepseek_v3 models")])
def test_compressing_or_auditing_it_is_still_refused_in_one_line(families, family, why, tmp_path, capsys):
    assert main(["compress", str(families[family]), "--compressor", "asvd", "--ratio", "0.2", "--calib", "tiny",
                 "--calib-seq-len", "32", "-o", str(tmp_path / "out")]) == 2
    assert main(["audit", str(families[family])]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 2 and all(why in ln for ln in err), err
    assert not (tmp_path / "out").exists()
