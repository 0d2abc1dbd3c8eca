"""Aligning for a serving engine: ``align.unit`` / ``--unit`` by an engine's name (``llama.cpp:q4_K``) is that
engine's block, its candidates are whole blocks, and the block table agrees with llama.cpp's own (the ``gguf``
package's ``GGML_QUANT_SIZES``). Default tier: no engine runs here (tests/export/test_engine_alignment.py runs one)."""

from __future__ import annotations

import pytest

from gac.align import align
from gac.align.candidates import ENGINE_UNITS, LLAMA_CPP_BLOCKS, candidate_set, resolve_unit
from gac.align.targets import Target
from gac.errors import GacError


def test_the_block_table_is_llama_cpps_and_covers_every_quantized_export_type():
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from gac.export.expressible import GGUF_TYPES, UNQUANTIZED

    assert set(LLAMA_CPP_BLOCKS) == set(GGUF_TYPES) - set(UNQUANTIZED)
    for name, block in LLAMA_CPP_BLOCKS.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]][0] == block, name


@pytest.mark.parametrize("name,unit", [("llama.cpp:q4_K", 256), ("llama.cpp:q6_K", 256), ("llama.cpp:q8_0", 32),
                                       ("llama.cpp:q4_0", 32), ("LLAMA.CPP:Q4_K", 256), (" 16 ", 16), (64, 64)])
def test_a_named_unit_is_its_engines_block(name, unit):
    assert resolve_unit(name) == unit


@pytest.mark.parametrize("bad,msg", [
    ("llama.cpp:q4_K_M", r"unknown alignment unit 'llama.cpp:q4_K_M' \(did you mean 'llama.cpp:q4_K'"),
    ("vllm", "give a multiple of 8 .* or an engine's unit: llama.cpp:q8_0"),
    ("12", "positive multiple of 8"), (True, "positive multiple of 8"), (2.5, "positive multiple of 8"),
])
def test_unknown_or_bad_units_are_one_line(bad, msg):
    with pytest.raises(GacError, match=msg) as e:
        resolve_unit(bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(ENGINE_UNITS))
def test_every_candidate_of_an_engine_unit_is_whole_blocks(name):
    unit = resolve_unit(name)
    block = LLAMA_CPP_BLOCKS[name.split(":")[1]]
    targets = [Target(f"model.layers.{i}.mlp", d_star=1536 * f, score=1.0 + i, params_per_dim=3 * 576, d_max=1536)
               for i, f in enumerate((0.31, 0.52, 0.8, 0.77, 0.9))]
    for t in targets:
        cands = candidate_set(t, unit)
        assert cands and all(d % block == 0 for d in cands), (t.d_star, cands)
    budget = sum(t.params(t.d_star) for t in targets)
    plan = align(targets, budget, "gac", unit)
    assert all(d % block == 0 for d in plan.dims.values()) and plan.params <= budget


def test_the_job_config_takes_an_engine_unit():
    from gac.jobs.config.build import spec_from_config
    from tests.jobs.test_schema import _cfg

    spec = spec_from_config(_cfg("align.unit=llama.cpp:q4_K"))
    assert spec.unit == 256
    assert spec.key == spec_from_config(_cfg("align.unit=256")).key  # the same computation: the same run
    with pytest.raises(GacError, match=r"config: align.unit: unknown alignment unit 'llama.cpp:q3_0'"):
        spec_from_config(_cfg("align.unit=llama.cpp:q3_0"))


def test_fallback_tensors_are_read_from_the_file(tmp_path):
    """A file as llama.cpp's quantizer leaves it at q8_0: a 512-column weight in q8_0, a 552-column one stored in f16
    (its rows are not whole blocks of 32); the reader names the second, with the type the file holds."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    from gac.export.gguf import fallback_line, fallback_tensors

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    rng = np.random.default_rng(0)
    q = quantize(rng.standard_normal((8, 512)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_gate.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_down.weight", rng.standard_normal((8, 552)).astype(np.float16))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(552, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = fallback_tensors(tmp_path / "m.gguf", "q8_0")
    assert got == {"blk.0.ffn_down.weight": {"ncols": 552, "block": 32, "type": "f16"}}
    assert "1 x 552 columns -> f16" in fallback_line("q8_0", got) and "llama.cpp:q8_0" in fallback_line("q8_0", got)
    assert fallback_line("q8_0", {}) == ""
