"""Compressed checkpoints: identical logits after reload, never a silent random initialisation, audit and CLI."""

from __future__ import annotations

import json

import pytest
import torch

from gac.compression.checkpoint import save_checkpoint
from gac.compression.checkpoint_format import META_FILE, read_meta
from gac.compression.checkpoint_load import load_checkpoint
from gac.errors import GacError

COMPRESSORS = ("asvd", "svd_llm", "llm_pruner", "palu")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, prepared, base):
    """One gac-aligned checkpoint per compressor (ratio 0.3)."""
    model, tok, _, held, _ = base
    out = {}
    for c in COMPRESSORS:
        cm, plan, report = prepared(c).compress(0.3, "unaligned" if c == "palu" else "gac")
        d = tmp_path_factory.mktemp(c) / "ckpt"
        save_checkpoint(cm, tok, d)
        with torch.no_grad():
            logits = cm(held[:2]).logits
        out[c] = (d, cm, plan, logits)
    return out


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_reload_identical_logits(saved, base, compressor):
    _, tok, _, held, _ = base
    d, cm, plan, logits = saved[compressor]
    m2, tok2 = load_checkpoint(d)
    with torch.no_grad():
        assert torch.equal(m2(held[:2]).logits, logits)
    assert (tok2 is None) == (tok is None)
    meta = read_meta(d)
    assert meta["recipe"]["compressor"] == compressor and meta["recipe"]["ratio"] == 0.3
    assert meta["recipe"]["calibration"]["n_samples"] == 4 and meta["recipe"]["strategy"] == plan.strategy
    assert meta["plan"]["dims"] == plan.dims and meta["gac_version"]
    from gac.provenance import provenance

    # the one provenance shape of gac's results (records, bench files), with the platform beside it
    assert set(meta["provenance"]) == set(provenance()) | {"platform"}
    assert meta["provenance"]["packages"]["torch"] == torch.__version__
    # every per-layer dimension is recorded
    specs = meta["modules"]
    assert len(specs) == 7 * m2.config.num_hidden_layers
    assert sum(p.numel() for p in m2.parameters()) == sum(p.numel() for p in cm.parameters())


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_transformers_cannot_silently_random_init(saved, base, compressor):
    from transformers import AutoModelForCausalLM

    model = base[0]
    d = saved[compressor][0]
    assert not (d / "config.json").exists() and not (d / "model.safetensors").exists()
    with pytest.raises((OSError, ValueError)):
        AutoModelForCausalLM.from_pretrained(d)
    with pytest.raises((OSError, ValueError)):
        AutoModelForCausalLM.from_pretrained(d, config=model.config)


def test_load_model_dispatches_to_checkpoint(saved, base):
    from gac.models import load_model

    _, _, _, held, _ = base
    d, _, _, logits = saved["llm_pruner"]
    m, _ = load_model(str(d))
    with torch.no_grad():
        assert torch.equal(m(held[:2]).logits, logits)


def test_damaged_checkpoint_fails_loudly(saved, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    src = saved["asvd"][0]
    d = tmp_path / "broken"
    shutil.copytree(src, d)
    sd = load_file(d / "gac_model.safetensors")
    key = next(k for k in sd if k.endswith("q_proj.down.weight"))
    del sd[key]
    save_file(sd, d / "gac_model.safetensors")
    with pytest.raises(GacError, match=f"1 missing from gac_model.safetensors, e.g. '{key}'"):
        load_checkpoint(d)  # named before any hash is computed
    with pytest.raises(GacError, match="does not match its weights"):  # without the hash too
        load_checkpoint(d, verify=False)
    meta = json.loads((d / META_FILE).read_text())
    meta["format"] = "something-else"
    (d / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(GacError, match="not a gac checkpoint"):
        load_checkpoint(d)


def test_refuses_to_overwrite(saved, tmp_path):
    d, cm, _, _ = saved["llm_pruner"]
    with pytest.raises(GacError, match="refusing to overwrite"):
        save_checkpoint(cm, None, d)
    out = tmp_path / "x"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(GacError, match="holding keep.txt; refusing to overwrite it"):
        save_checkpoint(cm, None, out)
    with pytest.raises(GacError, match="not a gac checkpoint; refusing to overwrite it: only a checkpoint gac saved"):
        save_checkpoint(cm, None, out, overwrite=True)  # overwrite replaces a checkpoint, never another directory
    assert (out / "keep.txt").read_text() == "mine" and not (out / META_FILE).exists()
    ck = save_checkpoint(cm, None, tmp_path / "ck")
    (ck / META_FILE).write_text((ck / META_FILE).read_text().replace('"provenance"', '"old_marker": 1, "provenance"'))
    save_checkpoint(cm, None, ck, overwrite=True)  # a checkpoint gac saved is replaced, once the new one is complete
    assert "old_marker" not in (ck / META_FILE).read_text() and not list(tmp_path.glob(".ck*"))
    empty = tmp_path / "empty"
    empty.mkdir()
    save_checkpoint(cm, None, empty)  # an empty directory is fine


def test_audit_checkpoint_and_dense(saved, base, tmp_path, capsys):
    from gac.cli import main
    from gac.compression.audit import audit, audit_model

    model = base[0]
    rep = audit_model(model)
    assert rep["aligned_fraction"] == 1.0 and rep["head_dim_flash_ok"]
    d = saved["palu"][0]  # saved with the unaligned strategy: some ranks break mod 8
    rep = audit(d)
    assert rep["n_weights"] == 7 * model.config.num_hidden_layers
    plan = saved["palu"][2]
    broken = sum(1 for v in plan.dims.values() if v % 8)
    assert sum(1 for w in rep["weights"] if w["misaligned"]["8"]) == broken > 0
    rep = audit(saved["asvd"][0])  # gac-aligned
    assert rep["aligned_fraction"] == 1.0
    assert main(["audit", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["aligned_fraction"] < 1.0
    assert main(["audit", str(d)]) == 0
    assert "rank" in capsys.readouterr().out
    model.save_pretrained(tmp_path / "hf")
    assert audit(tmp_path / "hf")["aligned_fraction"] == 1.0
    assert main(["audit", str(tmp_path / "nope")]) == 2


def test_audit_flags_bad_head_dim():
    from gac.compression.audit import audit_model
    from tests.compression.conftest import small_model

    m = small_model(hidden_size=120, num_attention_heads=4, num_key_value_heads=2, head_dim=30, intermediate_size=100)
    rep = audit_model(m)
    assert not rep["head_dim_flash_ok"] and not rep["head_dim_vllm_ok"]
    # q/o (120 x 120) are 8-aligned; k/v (60 out) and gate/up/down (100) are not
    assert rep["aligned_fraction"] == pytest.approx(2 / 7)


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "qwen3"])
def test_other_families_roundtrip(model_type, tmp_path):
    """GQA families with biases (Qwen2) and per-head norms (Qwen3): compress, align, save, reload identically."""
    from gac.compression.preparation import prepare
    from tests.compression.conftest import small_model

    m = small_model(model_type, num_attention_heads=8, num_key_value_heads=4, head_dim=16)
    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    for comp in ("asvd", "palu", "llm_pruner"):
        cm, plan, report = prepare(m, None, comp, calib_ids=ids, compressor_options={"group_size": 2} if comp == "palu"
                                   else None).compress(0.3, "gac")
        assert plan.aligned_fraction == 1.0 and plan.params <= plan.budget
        save_checkpoint(cm, None, tmp_path / comp)
        m2, _ = load_checkpoint(tmp_path / comp)
        with torch.no_grad():
            a, b = cm(ids).logits, m2(ids).logits
        assert torch.isfinite(a).all() and torch.equal(a, b)
    if model_type == "qwen2":
        assert m2.model.layers[0].self_attn.k_proj.bias is not None


def test_compress_cli(tmp_path, base, monkeypatch, capsys):
    from gac.cli import main

    out = tmp_path / "ck"
    rc = main(["compress", "tiny", "--compressor", "llm_pruner", "--ratio", "0.2", "--calib", "tiny",
               "--calib-samples", "2", "--calib-seq-len", "64", "-o", str(out)])
    assert rc == 0 and (out / META_FILE).exists()
    assert main(["compress", "tiny", "--compressor", "llm_pruner", "--ratio", "0.2", "-o", str(out)]) == 2  # not empty
    assert main(["compress", "tiny", "--compressor", "asvd", "--ratio", "1.2", "-o", str(tmp_path / "y")]) == 2
    meta = read_meta(out)
    assert meta["recipe"]["strategy"] == "gac" and meta["plan"]["aligned_fraction"] == 1.0
    assert meta["base_model"] == "tiny"
    # the checkpoint knows its data: evaluating it needs no --data tiny and never asks the hub
    import gac.evaluation.suite as suite

    asked = {}

    def fake_evaluate(model, tokenizer, **kw):
        asked.update(kw)
        raise GacError("stop after the data choice")

    monkeypatch.setattr(suite, "evaluate", fake_evaluate)
    assert main(["evaluate", str(out), "--ppl", "--tasks", "piqa"]) == 2
    assert asked["ppl_source"] == "tiny" and asked["task_files"]["piqa"].endswith(".jsonl")
    # --data hub asks for WikiText-2, which is not reachable offline: refused in one line before anything is loaded
    asked.clear()
    capsys.readouterr()
    assert main(["evaluate", str(out), "--ppl", "--data", "hub"]) == 2 and asked == {}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wikitext" in err[0].lower(), err


def test_bf16_cast_model_reloads_identically(tmp_path):
    """A model cast with .to(bfloat16) has bf16 rotary buffers that from_config would rebuild in fp32: the checkpoint
    stores non-persistent buffers too, so logits still match bit for bit."""
    from gac.compression.preparation import prepare
    from tests.compression.conftest import small_model

    m = small_model().to(torch.bfloat16)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    cm, _, _ = prepare(m, None, "svd_llm", calib_ids=ids).compress(0.2, "gac")
    save_checkpoint(cm, None, tmp_path / "bf16")
    m2, _ = load_checkpoint(tmp_path / "bf16")
    assert next(m2.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(cm(ids).logits, m2(ids).logits)
