"""A plan's shapes -> the compressed model: equal, module by module, to what the job itself compressed."""

import pytest
import torch
from safetensors import safe_open

from gac.compression.checkpoint import projection_specs
from gac.compression.checkpoint_format import WEIGHTS_FILE, read_meta
from gac.compression.modules import GroupedLowRankLinear, LowRankLinear, get_module
from gac.compression.structure import Structure, architecture
from gac.errors import GacError
from gac.jobs.bench.variants import build_variants
from gac.results import ResultsStore
from tests.bench_store import COMPRESSORS, STRATEGIES

KIND = {"asvd": LowRankLinear, "svd_llm": LowRankLinear, "palu": GroupedLowRankLinear, "llm_pruner": torch.nn.Linear}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_structure_from_a_record_equals_the_model_the_job_compressed(tiny_store, compressor, strategy):
    rec = tiny_store["records"][(compressor, strategy)]
    ckpt = tiny_store["checkpoints"][(compressor, strategy)]
    all_records = list(ResultsStore(tiny_store["results"]).iter_records())
    variants, ident, dtype = build_variants([rec], all_records)
    assert [v.label for v in variants][0] == "Baseline" and variants[0].structure.is_baseline
    assert variants[0].key == tiny_store["records"][("none", "baseline")]["key"]  # the store's baseline, linked
    s = variants[1].structure
    assert (ident["spec"], dtype, s.compressor) == ("tiny", "float32", compressor)
    model = s.build("cpu")
    # every projection: same module class and the same spec (shapes, ranks, widths, biases) as the job's model
    job_specs = read_meta(ckpt)["modules"]
    assert projection_specs(model) == job_specs
    for name in s.specs:
        assert type(get_module(model, name)) is KIND[compressor]
    # every tensor the job saved exists here with the same shape (tied tensors are saved once)
    built = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    with safe_open(str(ckpt / WEIGHTS_FILE), "pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert set(saved) <= set(built) and {k: built[k] for k in saved} == saved
    # the compressed modules hold exactly the plan's parameters
    assert s.compressed_params() == rec["plan"]["params"] == rec["params"]
    assert len(s.dims) == s.targets == len(rec["plan"]["dims"])


def test_variants_share_what_the_plan_leaves_alone_and_live_on_the_device(tiny_store):
    rec = tiny_store["records"][("llm_pruner", "gac")]
    variants, _, _ = build_variants([rec], [rec])
    base = variants[0].structure.build("cpu")
    v = variants[1].structure.build("cpu", share_from=base)
    assert v.model.embed_tokens.weight is base.model.embed_tokens.weight
    assert v.lm_head.weight is v.model.embed_tokens.weight  # tied, as in tiny
    assert v.model.norm.weight is base.model.norm.weight
    assert v.model.layers[0].self_attn.q_proj.weight is base.model.layers[0].self_attn.q_proj.weight
    i, width = min(((int(n.split(".")[2]), d) for n, d in rec["plan"]["dims"].items()), key=lambda x: x[1])
    gate = v.model.layers[i].mlp.gate_proj
    assert gate.out_features == width < base.model.layers[i].mlp.gate_proj.out_features
    assert gate.weight is not base.model.layers[i].mlp.gate_proj.weight
    assert not any(t.is_meta for t in [*v.parameters(), *v.buffers()])
    assert float(gate.weight.std()) == pytest.approx(0.02, rel=0.2)  # random, not uninitialised memory
    out = v(input_ids=torch.randint(0, 4096, (1, 16))).logits
    assert out.shape == (1, 16, 4096) and torch.isfinite(out).all()


def test_a_plan_that_does_not_fit_the_architecture_is_an_error():
    config = architecture("tiny")
    with pytest.raises(GacError, match=r"do not exist in this architecture"):
        Structure(config, "float32", "asvd", {}, {"model.layers.9.self_attn.q_proj": 64})
    # q_proj 256x256: rank 128 costs as much as the dense weight (the dense candidate, dim 256), so ranks stop at 127
    with pytest.raises(GacError, match=r"outside its valid range 1\.\.127"):
        Structure(config, "float32", "asvd", {}, {"model.layers.0.self_attn.q_proj": 128})
    with pytest.raises(GacError, match=r"outside its valid range"):
        Structure(config, "float32", "llm_pruner", {}, {"model.layers.0.mlp": 0})
    with pytest.raises(GacError, match=r"needs a rank for each of its"):
        Structure(config, "float32", "palu", {"group_size": 1}, {"model.layers.0.self_attn.k_proj.group0": 8})


def test_an_8b_architecture_is_laid_out_on_meta_without_memory():
    arch = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
    config = architecture("meta-llama/Meta-Llama-3-8B", random_weights=True, arch=arch)
    dims = {f"model.layers.{i}.mlp": 12288 for i in range(3, 31)}  # LLM-Pruner's default layers 3..30 of 32 (its range(3, 31))
    s = Structure(config, "float16", "llm_pruner", {"layers": None}, dims)
    sk = s.skeleton()
    assert all(p.is_meta for p in sk.parameters())
    assert sk.model.layers[5].mlp.down_proj.in_features == 12288
    assert s.compressed_params() == 28 * 12288 * 3 * 4096
    assert sk.model.layers[0].mlp.down_proj.in_features == 14336
    assert s.max_length == 8192


def test_a_low_rank_target_at_its_full_rank_stays_a_dense_linear():
    """How plans write an ASVD target left unfactorised (the dense candidate): its dim is min(out, in)."""
    config = architecture("tiny")
    dims = {"model.layers.0.self_attn.q_proj": 256, "model.layers.0.self_attn.k_proj": 64}
    s = Structure(config, "float32", "asvd", {}, dims)
    assert set(s.specs) == {"model.layers.0.self_attn.k_proj"}
    sk = s.skeleton()
    assert type(sk.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert s.compressed_params() == 256 * 256 + 64 * (128 + 256)
