"""The bench on a CUDA GPU (auto-skipped without one): CUDA events, resident and swap memory, CUDA kernels."""

import pytest
import torch

from gac.compression.structure import Structure, architecture
from gac.evaluation.bench import Protocol, Variant, run_bench

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _variants():
    config = architecture("tiny")
    dims = {f"model.layers.{i}.self_attn.{p}": d for i in range(4) for p, d in (("q_proj", 100), ("k_proj", 60))}
    aligned = {k: (v // 8) * 8 for k, v in dims.items()}
    return [Variant("Baseline", Structure(config, "float16")),
            Variant("ASVD", Structure(config, "float16", "asvd", {}, dims)),
            Variant("ASVD (GAC)", Structure(config, "float16", "asvd", {}, aligned), sibling="ASVD")]


@pytest.mark.parametrize("memory", ["resident", "swap"])
def test_cuda_bench(memory):
    doc = run_bench(_variants(), Protocol(points=((1, 512),), rounds=4, warmup=2, iters=3, memory=memory), "cuda")
    prot = doc["protocol"]
    assert prot["timer"] == "cuda_events" and prot["memory_mode"] == memory and prot["peak_memory_bytes"] > 0
    assert doc["device"]["type"] == "cuda" and doc["device"]["cuda"]
    for v in doc["variants"]:
        # the trace names a real backend ("unknown (sdpa called)" / "none (...)" would also be non-empty)
        assert v["median_ms"] > 0 and v["top_kernels"] and set(v["sdpa_backend"]) <= {"flash", "efficient", "cudnn",
                                                                                      "math"}
        assert v["sdpa_backend"]
        assert all(0 < k["pct"] <= 100 for k in v["top_kernels"])
    assert doc["variants"][2]["ratio_to_unaligned"] > 0
