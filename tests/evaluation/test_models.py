"""load_model: tiny, a local HF directory, a gac checkpoint directory, hub ids; bad specs give GacError."""

from __future__ import annotations

import pytest
import torch

from gac.errors import GacError
from gac.models import load_model, model_kind


def test_tiny_loads_offline_in_eval_mode(tiny):
    model, tok = tiny
    assert not model.training and model.config.name_or_path == "tiny"
    assert next(model.parameters()).dtype == torch.float32


def test_a_local_hf_directory_reloads_to_the_same_logits(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert model_kind(tmp_path) == "local"
    again, tok2 = load_model(str(tmp_path), dtype="fp32")
    x = torch.tensor([tok("Thou art a villain.")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, again(input_ids=x).logits)
    assert tok2("Thou art")["input_ids"] == tok("Thou art")["input_ids"]


def test_a_gac_checkpoint_directory_goes_to_the_checkpoint_loader(tmp_path, monkeypatch):
    (tmp_path / "gac_checkpoint.json").write_text("{}")
    assert model_kind(tmp_path) == "checkpoint"
    calls = []

    def fake_load_checkpoint(path, dtype=None, device="cpu", verify=True):
        calls.append((path, dtype, device))
        return load_model("tiny-untrained")

    import types

    monkeypatch.setitem(__import__("sys").modules, "gac.compression.checkpoint_load",
                        types.SimpleNamespace(load_checkpoint=fake_load_checkpoint))
    model, tok = load_model(str(tmp_path), dtype="bf16")
    assert calls == [(str(tmp_path), torch.bfloat16, "cpu")] and not model.training


def test_a_checkpoint_without_a_loader_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "gac_checkpoint.json").write_text("{}")
    monkeypatch.setitem(__import__("sys").modules, "gac.compression.checkpoint_load", None)  # import fails
    with pytest.raises(GacError, match="no checkpoint loader"):
        load_model(str(tmp_path))


@pytest.mark.parametrize(("spec", "match"), [
    ("./no/such/model", "does not exist"),
    ("/", "neither a gac checkpoint"),
    ("meta-llama/Nonexistent-Model-gac-test", "could not load 'meta-llama/Nonexistent-Model-gac-test' from the"),
])
def test_bad_model_specs(spec, match):
    with pytest.raises(GacError, match=match):
        load_model(spec)


def test_bad_dtype_and_device():
    with pytest.raises(GacError, match="did you mean 'fp16'"):
        load_model("tiny", dtype="fp61")
    if not torch.cuda.is_available():
        with pytest.raises(GacError, match="CUDA is not available"):
            load_model("tiny", device="cuda")
