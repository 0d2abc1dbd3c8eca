"""LLM-Pruner's shared expert width: one width per mixture-of-experts layer for all its experts, a single knapsack
target, the pruned experts kept in the model's own fused 3-D experts class (its forward, its experts implementation).

Exact where nothing used is dropped (every expert with as many dead channels as the layer prunes), checkpoints and
prepared states that reload bit for bit, the same shapes from a plan alone, and the group's importance the sum of
each expert's own best channels.
"""

from __future__ import annotations

import copy

import pytest
import torch

from gac.errors import GacError
from tests.compression.test_families import _calib, exact_model, family_model

MOE = ("mixtral", "olmoe", "qwen3_moe")
ALL_LAYERS = {"layers": "0:"}


def _compress(m, ratio=0.2, **opts):
    from gac.compression.compress import compress_model

    return compress_model(copy.deepcopy(m), None, "llm_pruner", ratio=ratio, calib_ids=_calib(), unit=8,
                          compressor_options={**ALL_LAYERS, **opts})


@pytest.mark.parametrize("model_type", MOE)
def test_experts_with_as_many_dead_channels_as_pruned_give_the_dense_model(model_type):
    """40% of every expert's channels are dead (the same count in each, different channels); pruning 20% keeps each
    expert's live channels, so the pruned model computes the dense one's logits, in the model's own experts class."""
    from gac.compression.discovery import discover
    from gac.compression.modules import is_fused_experts

    m = exact_model(model_type, dead=True)
    ids = _calib(1)
    with torch.no_grad():
        dense = m(ids).logits
    cm, plan, rep = _compress(m)
    lay = discover(m)
    for b in lay.experts:
        new, old = cm.get_submodule(b.module), m.get_submodule(b.module)
        assert type(new) is type(old) and is_fused_experts(new)  # the model's own class, its own forward
        w = plan.dims[b.module]
        assert w % 8 == 0 and int(0.6 * b.width) <= w < b.width
        assert tuple(new.gate_up_proj.shape) == (b.num_experts, 2 * w, b.hidden)
        assert tuple(new.down_proj.shape) == (b.num_experts, b.hidden, w)
        assert not any(n.startswith(f"{b.module}.") and n.rsplit(".", 1)[0] != b.module for n in plan.dims)
    assert rep["params_counted"] == plan.params <= plan.budget
    with torch.no_grad():
        logits = cm(ids).logits
    err = float((logits - dense).norm() / dense.norm())
    assert err < 1e-5, err


def test_the_shared_width_is_one_target_costing_every_expert_s_channels():
    from gac.compression.compressors import get_compressor
    from gac.compression.discovery import discover

    m = family_model("mixtral")
    lay = discover(m)
    b = lay.experts[0]
    shared = get_compressor("llm_pruner", **ALL_LAYERS).units(m, lay)
    per = get_compressor("llm_pruner", expert_width="per_expert", **ALL_LAYERS).units(m, lay)
    assert [u.name for u in shared] == [e.module for e in lay.experts]
    u = shared[0]
    assert u.params_per_dim == b.num_experts * 3 * b.hidden and u.d_full == b.width
    assert u.dense_params == sum(p.dense_params for p in per if p.name.startswith(b.module + "."))


def test_each_expert_keeps_its_own_best_channels_and_the_curve_is_their_sum():
    """The group's importance at width w is the sum over experts of each one's w best channel energies (its curve at
    rank k: the sum of each expert's k-th largest), and each expert keeps its own best channels: its kept gate rows
    are its own rows at the channels its per-expert ranking puts first."""
    from gac.compression.compressors.pruning_math import kept_channels
    from gac.compression.preparation import prepare

    m = family_model("mixtral")
    ps = prepare(copy.deepcopy(m), None, "llm_pruner", calib_ids=_calib(), compressor_options=ALL_LAYERS)
    pe = prepare(copy.deepcopy(m), None, "llm_pruner", calib_ids=_calib(),
                 compressor_options={**ALL_LAYERS, "expert_width": "per_expert"})
    name = "model.layers.0.mlp.experts"
    f = ps.factors[name]
    E = f["orders"].shape[0]
    curve = sum(pe.factors[f"{name}.{e}"]["energy"] for e in range(E))
    torch.testing.assert_close(f["energy"], curve, rtol=1e-12, atol=0)
    for e in range(E):
        assert torch.equal(f["orders"][e], pe.factors[f"{name}.{e}"]["order"])
    assert ps.scores[name] == pytest.approx(sum(pe.scores[f"{name}.{e}"] for e in range(E)) / E, rel=1e-12)
    cm, plan, _ = ps.compress(0.3, unit=8)
    w = plan.dims[name]
    new, old = cm.get_submodule(name), m.get_submodule(name)
    width = old.down_proj.shape[2]
    for e in range(E):
        keep = kept_channels(f["orders"][e], w)
        assert torch.equal(new.gate_up_proj[e, :w], old.gate_up_proj[e][keep])
        assert torch.equal(new.gate_up_proj[e, w:], old.gate_up_proj[e][width + keep])
        assert torch.equal(new.down_proj[e], old.down_proj[e][:, keep])


@pytest.mark.parametrize("model_type", MOE)
def test_a_shared_width_checkpoint_reloads_bit_for_bit(model_type, tmp_path):
    from gac.compression.audit import audit_model
    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_load import load_checkpoint

    cm, plan, _ = _compress(family_model(model_type), ratio=0.3)
    save_checkpoint(cm, None, tmp_path / "ck")
    back, _ = load_checkpoint(tmp_path / "ck")
    want, got = cm.state_dict(), back.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    for name in (n for n in plan.dims if n.endswith(".experts")):
        assert type(back.get_submodule(name)) is type(cm.get_submodule(name))
    ids = _calib(1)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, cm(ids).logits)
    assert audit_model(back)["n_weights"] > 0


def test_a_prepared_state_with_expert_orders_reloads(tmp_path):
    from gac.compression.preparation import prepare
    from gac.compression.prepared import Prepared

    m = family_model("olmoe")
    p = prepare(copy.deepcopy(m), None, "llm_pruner", calib_ids=_calib(), compressor_options=ALL_LAYERS)
    p.save(tmp_path / "prep")
    q = Prepared.load(tmp_path / "prep", copy.deepcopy(m), "llm_pruner", ALL_LAYERS)
    name = "model.layers.0.mlp.experts"
    assert torch.equal(q.factors[name]["orders"], p.factors[name]["orders"])
    assert q.plan(0.3, unit=8)[0].dims == p.plan(0.3, unit=8)[0].dims


def test_a_prepared_state_whose_expert_orders_are_not_permutations_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from gac.compression.preparation import prepare
    from gac.compression.prepared import Prepared

    m = family_model("mixtral")
    p = prepare(copy.deepcopy(m), None, "llm_pruner", calib_ids=_calib(), compressor_options=ALL_LAYERS)
    f = tmp_path / "prep"
    p.save(f)
    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as h:
        header = h.metadata()
    tensors = load_file(str(f))
    key = "model.layers.0.mlp.experts/orders"
    tensors[key] = tensors[key].clone()
    tensors[key][0, 0] = tensors[key][0, 1]  # a channel twice, another never
    save_file(tensors, str(f), metadata=header)
    with pytest.raises(GacError, match="are not 4 permutations of its 96 channels"):
        Prepared.load(tmp_path / "prep", copy.deepcopy(m), "llm_pruner", ALL_LAYERS)


def test_per_expert_widths_stay_an_option_and_a_bad_value_is_refused():
    from gac.compression.compressors import get_compressor
    from gac.compression.modules import ExpertMLPs

    cm, plan, _ = _compress(family_model("olmoe"), ratio=0.3, expert_width="per_expert")
    assert isinstance(cm.get_submodule("model.layers.0.mlp.experts"), ExpertMLPs)
    assert "model.layers.0.mlp.experts.3" in plan.dims
    with pytest.raises(GacError, match="expert_width='fused': choose 'shared'"):
        get_compressor("llm_pruner", expert_width="fused")


def test_a_checkpoint_whose_fused_experts_disagree_with_the_router_is_refused(tmp_path):
    """A fused_experts spec must hold the router's expert count and hidden size: one line before any weight."""
    import json

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.checkpoint_format import META_FILE
    from gac.compression.checkpoint_load import check_checkpoint

    cm, plan, _ = _compress(family_model("mixtral"), ratio=0.3)
    save_checkpoint(cm, None, tmp_path / "ck")
    meta = json.loads((tmp_path / "ck" / META_FILE).read_text())
    meta["modules"]["model.layers.0.mlp.experts"]["experts"] = 3
    (tmp_path / "ck" / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(GacError, match="it holds 3 experts of hidden size 64, but the model's router picks among 4"):
        check_checkpoint(tmp_path / "ck", verify=False)


def test_a_plan_builds_the_fused_experts_without_weights():
    """The bench and the predictor build a plan's model from shapes (Structure): the model's own experts class at the
    plan's width, the plan's parameter count."""
    from gac.compression.modules import module_spec
    from gac.compression.structure import Structure

    m = family_model("qwen3_moe")
    cm, plan, _ = _compress(m, ratio=0.3)
    s = Structure(m.config, torch.float32, "llm_pruner", ALL_LAYERS, dict(plan.dims))
    assert s.compressed_params() == plan.params
    built = s.build("cpu")
    name = "model.layers.0.mlp.experts"
    assert type(built.get_submodule(name)) is type(m.get_submodule(name))
    assert module_spec(built.get_submodule(name)) == module_spec(cm.get_submodule(name)) == s.specs[name]
    assert s.specs[name]["type"] == "fused_experts"
    with torch.no_grad():
        assert torch.isfinite(built(_calib(5)).logits).all()


def test_the_default_expert_width_leaves_a_job_s_record_key_as_it_was():
    """``expert_width: shared`` (the config's default) adds nothing to a job's key: the records of LLM-Pruner jobs
    made before the option existed stay theirs; ``per_expert`` is another job."""
    from dataclasses import replace

    from tests.jobs.test_configs import _spec

    spec = _spec(["model=tiny", "compressor=llm_pruner"])
    assert spec.compressor_options["expert_width"] == "shared"
    before = replace(spec, compressor_options={k: v for k, v in spec.compressor_options.items() if k != "expert_width"})
    assert spec.key == before.key
    other = _spec(["model=tiny", "compressor=llm_pruner", "compressor.options.expert_width=per_expert"])
    assert other.key != spec.key


@pytest.mark.engines
def test_onnx_of_per_expert_widths_still_matches(tmp_path, capsys):
    """The engines' family cases export LLM-Pruner's default (one shared width, the fused experts); ExpertMLPs' own
    export path keeps a case: a per-expert Mixtral checkpoint in onnxruntime equals gac's logits."""
    from gac.compression.checkpoint import save_checkpoint
    from tests.compression.test_families import V
    from tests.export.test_engines import _export, _gac_logits, _onnx_logits, _rel

    cm, _, _ = _compress(family_model("mixtral"), ratio=0.3, expert_width="per_expert")
    ck = save_checkpoint(cm, None, tmp_path / "ck")
    assert _export(capsys, ck, "onnx", tmp_path / "m.onnx")["check"]["max_rel_diff"] <= 1e-4
    ids = torch.randint(0, V, (2, 21), generator=torch.Generator().manual_seed(12))
    assert _rel(_onnx_logits(tmp_path / "m.onnx", ids), _gac_logits(ck, ids)) <= 1e-4
