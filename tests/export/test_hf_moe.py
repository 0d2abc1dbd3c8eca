"""A shared-width mixture of experts (LLM-Pruner's ``expert_width=shared``: one width for all the experts of a layer)
as a plain Hugging Face folder, on the Mixtral, OLMoE and Qwen3-MoE layouts (random weights, the families' small
configs of tests/compression/test_families.py).

Default tier: the verdict from the checkpoint's structure alone (the expert width written into the family's own key
when every layer keeps one; a one-line refusal naming the formats that can when the layers differ), and the
refusal through ``gac export``. Marker ``engines`` (.ci/run runs it): LLM-Pruner's own checkpoint exported by
``gac export --format hf``, loaded by transformers' ``AutoModelForCausalLM`` in a Python where gac cannot be
imported, its logits compared with gac's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from gac.errors import GacError
from tests.compression.test_families import V, _calib, family_model
from tests.export.test_engines import _NO_GAC  # a Python where gac cannot be imported: load, logits, class

MOE = ("mixtral", "olmoe", "qwen3_moe")
#: model_type -> (its experts' width in the small config, the key a transformers config keeps it under)
EXPERT_KEY = {"mixtral": (96, "intermediate_size"), "olmoe": (96, "intermediate_size"),
              "qwen3_moe": (48, "moe_intermediate_size")}


def _cut_experts(model_type: str, widths, path):
    """The family's small model with the experts of each MoE layer cut to their first ``widths[i]`` channels, kept
    in the model's own fused experts class (as LLM-Pruner's shared width leaves them), saved at ``path``."""
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.discovery import discover
    from gac.compression.modules import fused_experts_like
    from gac.compression.swap import replace_module

    m = family_model(model_type)
    blocks = discover(m).experts
    assert len(blocks) == len(widths)
    for b, w in zip(blocks, widths):
        old = m.get_submodule(b.module)
        full = old.down_proj.shape[-1]
        gate_up = torch.cat([old.gate_up_proj[:, :w], old.gate_up_proj[:, full:full + w]], dim=1).detach().clone()
        replace_module(m, b.module, fused_experts_like(old, w, gate_up, old.down_proj[:, :, :w].detach().clone()))
    return save_checkpoint(m, None, path)


@pytest.mark.parametrize("model_type", MOE)
def test_one_expert_width_in_every_layer_is_an_hf_config(model_type, tmp_path):
    from gac.export.expressible import check_format, describe, verdicts

    full, key = EXPERT_KEY[model_type]
    n_moe = 1 if model_type == "qwen3_moe" else 2  # its layer 1 is a dense MLP (mlp_only_layers)
    src = describe(_cut_experts(model_type, [32] * n_moe, tmp_path / "ck"))
    cfg = check_format(src, "hf")
    assert cfg["model_type"] == model_type and cfg[key] == 32
    if model_type == "qwen3_moe":
        assert cfg["intermediate_size"] == 96  # the dense MLP's width, untouched
    assert "hf" in verdicts(src).can() and "onnx" in verdicts(src).can()


@pytest.mark.parametrize("model_type", ("mixtral", "olmoe"))
def test_expert_widths_that_differ_by_layer_are_refused_naming_the_formats_that_can(model_type, tmp_path):
    from gac.export.expressible import check_format, describe

    src = describe(_cut_experts(model_type, [32, 48], tmp_path / "ck"))
    with pytest.raises(GacError) as e:
        check_format(src, "hf")
    msg = str(e.value)
    assert "its experts' widths differ from layer to layer (32, 48)" in msg and "\n" not in msg
    assert msg.endswith("export it as onnx instead")


def test_gac_export_refuses_them_in_one_line_and_writes_nothing(tmp_path, capsys):
    from gac.cli import main

    ck = _cut_experts("mixtral", [32, 48], tmp_path / "ck")
    out = tmp_path / "hf"
    rc = main(["export", str(ck), "--format", "hf", "-o", str(out)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert "--format hf cannot express" in lines[0] and "experts' widths differ" in lines[0]
    assert "export it as onnx instead" in lines[0]
    assert not out.exists()


@pytest.mark.engines
@pytest.mark.parametrize("model_type", MOE)
def test_llm_pruners_shared_width_loads_in_plain_transformers(model_type, tmp_path, capsys):
    """LLM-Pruner at the shared expert width with the uniform allocation (every layer the same ratio, so the same
    width) on every layer, saved, exported by ``gac export --format hf``; transformers alone loads the folder and
    gives gac's logits."""
    from gac.cli import main
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.compress import compress_model
    from gac.compression.checkpoint_load import load_checkpoint
    from gac.compression.discovery import discover

    m = family_model(model_type)
    blocks = discover(m).experts
    cm, plan, _ = compress_model(m, None, "llm_pruner", ratio=0.3, strategy="round_nearest", unit=8,
                                 allocation="uniform", calib_ids=_calib(), compressor_options={"layers": "0:"})
    experts = {plan.dims[b.module] for b in blocks}
    full, key = EXPERT_KEY[model_type]
    assert len(experts) == 1  # one pruned width for every MoE layer (what a transformers config can hold)
    width = experts.pop()
    assert width < full
    ck = save_checkpoint(cm, None, tmp_path / "ck")
    out = tmp_path / "hf"
    rc = main(["-q", "export", str(ck), "--format", "hf", "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-2000:]
    assert json.loads(cap.out)["check"]["gac_imported"] is False
    ids = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(3))
    np.save(tmp_path / "ids.npy", ids.numpy())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([sys.executable, "-I", "-c", _NO_GAC, str(out), str(tmp_path / "ids.npy"),
                        str(tmp_path / "l.npy")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2] == type(m).__name__  # transformers' own class, no remote code
    assert json.loads((out / "config.json").read_text())[key] == width
    gac_model, _ = load_checkpoint(ck)
    gac_model.eval()
    with torch.no_grad():
        ref = gac_model(input_ids=ids, use_cache=False).logits.float().numpy()
    got = np.load(tmp_path / "l.npy")
    assert got.shape == ref.shape
    assert float(np.abs(got - ref).max() / np.abs(ref).max()) <= 1e-5
