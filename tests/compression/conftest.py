"""Shared fixtures: the embedded ``tiny`` model (shipped: a model that cannot load fails the tests that use it,
never turns them into tests of another model), a few short calibration samples, held-out evaluation ids, and each
compressor prepared once per session."""

from __future__ import annotations

import math

import pytest
import torch

N_CALIB, CALIB_LEN, EVAL_LEN = 4, 64, 128


def small_config(model_type: str = "llama", **kw):
    from transformers import AutoConfig

    base = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=512, max_position_embeddings=256)
    base.update(kw)
    return AutoConfig.for_model(model_type, **base)


def small_model(model_type: str = "llama", seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(small_config(model_type, **kw)).eval()


@pytest.fixture(scope="session")
def base():
    """(model, tokenizer, calibration ids, held-out ids, name) of the shipped ``tiny``; loading errors propagate."""
    from gac.fixtures.tiny import tiny_dir
    from gac.models import load_model
    from gac.text import calibration_batches

    tiny_dir(build_if_missing=False)  # the shipped copy: a test run never trains one
    model, tok = load_model("tiny", dtype=torch.float32)
    model.eval()
    calib = calibration_batches(tok, "tiny", N_CALIB, CALIB_LEN, seed=0, split="train")
    held = calibration_batches(tok, "tiny", 4, EVAL_LEN, seed=1, split="test")
    return model, tok, calib, held, "tiny"


@torch.no_grad()
def ppl(model, ids) -> float:
    from gac.compression.sensitivity import calibration_perplexity

    return calibration_perplexity(model, ids)


_PREPARED: dict = {}


@pytest.fixture(scope="session")
def prepared(base):
    """prepared(compressor, proxy=None, allocation=None) -> Prepared, computed once per session."""
    from gac.compression.preparation import prepare

    model, tok, calib, _, _ = base

    def get(compressor: str, proxy: str | None = None, allocation: str | None = None, **opts):
        key = (compressor, proxy, allocation, tuple(sorted(opts.items())))
        if key not in _PREPARED:
            _PREPARED[key] = prepare(model, tok, compressor, proxy, calib_ids=calib, allocation=allocation,
                                     compressor_options=opts or None)
        return _PREPARED[key]

    return get


@pytest.fixture(scope="session")
def base_ppl(base):
    model, _, _, held, _ = base
    v = ppl(model, held)
    assert math.isfinite(v)
    return v
