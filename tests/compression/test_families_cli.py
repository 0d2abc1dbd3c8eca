"""The families as a new user meets them: a local Hugging Face directory of each (random weights in the family's real
layout, tiny's tokenizer) through ``gac audit``, ``gac evaluate``, ``gac compress`` and back; a family gac has no
layout for is refused in one line before its weights load."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.compression.test_families import family_config

FAMILIES_CLI = ("gpt2", "gpt_neox", "phi3", "mixtral", "gemma3_text")


def _tokenizer():
    from gac.models import load_model

    return load_model("tiny")[1]


def hf_dir(tmp_path, model_type: str, name: str | None = None):
    """A saved model of ``model_type`` with tiny's tokenizer (its 4096-token vocabulary)."""
    from transformers import AutoModelForCausalLM

    tok = _tokenizer()
    cfg = family_config(model_type)
    cfg.vocab_size = len(tok)
    if hasattr(cfg, "text_config") and cfg.text_config is not cfg:
        cfg.text_config.vocab_size = len(tok)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.05)
    d = tmp_path / (name or model_type)
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.parametrize("model_type", FAMILIES_CLI)
def test_audit_evaluate_compress_and_back(model_type, tmp_path, capsys):
    from gac.cli import main

    d = hf_dir(tmp_path, model_type)
    assert main(["audit", str(d), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n_weights"] > 0 and rep["model_type"] == model_type
    assert main(["evaluate", str(d), "--ppl", "--ppl-data", "tiny", "--seq-len", "64", "--ppl-windows", "2", "--json", str(tmp_path / "e.json")]) == 0
    dense = json.loads((tmp_path / "e.json").read_text())
    comp = "llm_pruner" if model_type in ("mixtral",) else "asvd"
    out = tmp_path / "out"
    assert main(["compress", str(d), "--compressor", comp, "--ratio", "0.3", "--allocation", "proportional"
                 if comp == "asvd" else "uniform", "--calib", "tiny", "--calib-samples", "2", "--calib-seq-len", "32", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out), "--ppl", "--ppl-data", "tiny", "--seq-len", "64", "--ppl-windows", "2", "--json", str(tmp_path / "c.json")]) == 0
    after = json.loads((tmp_path / "c.json").read_text())
    ppl = lambda r: next(v for k, v in r["metrics"].items() if k.startswith("ppl_"))  # noqa: E731
    assert math.isfinite(ppl(dense)) and math.isfinite(ppl(after)) and ppl(after) != ppl(dense)


def test_an_unknown_family_is_refused_before_its_weights_load(tmp_path, monkeypatch, capsys):
    from transformers import BloomConfig, BloomForCausalLM

    from gac.cli import main

    tok = _tokenizer()
    d = tmp_path / "bloom"
    BloomForCausalLM(BloomConfig(n_layer=1, hidden_size=32, n_head=2, vocab_size=len(tok))).save_pretrained(d)
    tok.save_pretrained(d)
    import gac.models

    def no_load(*a, **k):
        raise AssertionError("the weights were loaded before the refusal")

    monkeypatch.setattr(gac.models, "load_model", no_load)
    capsys.readouterr()
    for argv in (["compress", str(d), "--compressor", "asvd", "--ratio", "0.2", "--calib", "tiny", "-o",
                  str(tmp_path / "o")], ["audit", str(d)]):
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "no layout for model_type 'bloom'" in err[0], err

    assert not (tmp_path / "o").exists()
