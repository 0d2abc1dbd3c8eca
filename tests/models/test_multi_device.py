"""A model spread over several devices (``model.device_map=auto``) on this CPU-only machine: tiny's layers on two
devices that every op tells apart (:mod:`tests.models.fake_devices`), so each step that joins tensors of two devices
must say so, as on a node of GPUs; and tiny's layers memory-mapped from disk through the gradient pass's bfloat16
cast. Each run over two fake devices is compared with the same run with every unit on one fake device: the same CPU
kernels in the same order, so the numbers are equal bit for bit. (A plain CPU run differs in float32 rounding: on a
device that is not the CPU, torch picks other kernels, attention's among them.)"""

from __future__ import annotations

import pytest
import torch

from tests.models.fake_devices import MixedDevices, devices_of, fake_devices
from tests.models.memory_maps import mapped_from

D0, D1 = "meta:0", "meta:1"


# ------------------------------------------------------------------------------------------------ the harness
def test_the_fake_devices_refuse_what_two_gpus_refuse():
    with fake_devices() as mode:
        a, b = torch.ones(3, device=D0), torch.ones(3).to(D1)
        assert (a.device, b.device) == (torch.device(D0), torch.device(D1)) and (a + 1).device == a.device
        with pytest.raises(MixedDevices, match="Expected all tensors to be on the same device"):
            a + b
        with pytest.raises(MixedDevices):
            a + torch.ones((), device=D1)  # a 0-dim tensor on another GPU is no scalar
        with pytest.raises(MixedDevices):
            a + torch.ones(3)  # nor is a CPU tensor with dimensions
        assert (a + torch.ones(())).device == a.device  # a 0-dim CPU tensor is
        assert torch.equal((a + b.to(D0)).cpu(), torch.full((3,), 2.0))  # an explicit copy crosses
        assert (str(torch.device(D1)), str(torch.device(D0))) in {(f, t) for _, f, t in mode.crossings}
        emb = torch.nn.Embedding(8, 4)
        head = torch.nn.Linear(4, 8, bias=False)
        head.weight = emb.weight
        p = emb.weight
        emb.to(D1)
        head.to(D1)
        assert emb.weight is p and head.weight is p and devices_of(emb) == {D1}  # moved in place, still tied


# ------------------------------------------------------------------------------------------------ tiny on two devices
@pytest.fixture(scope="module")
def tiny_data():
    from gac.models import load_model
    from gac.text import calibration_batches

    _, tok = load_model("tiny")
    return tok, calibration_batches(tok, "tiny", 2, 32, seed=0, split="train")


def _tiny(dtype: str = "fp32", untied: bool = False):
    from gac.models import load_model

    model, _ = load_model("tiny", dtype=dtype)
    if untied:  # Llama-3's own head: a weight of its own, placed with the last layers
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return model


def _spread(model, two: bool = True) -> dict[str, str]:
    """``model`` dispatched over D0 (embedding, first half of the layers) and D1 (the rest, norm, an untied head);
    ``two=False``: every unit on D0 (the reference)."""
    from gac.models.placement import dispatch, placement_units

    units, follow = placement_units(model)
    layers = [n for n, _ in units if n.startswith("model.layers.")]
    second = set(layers[len(layers) // 2:]) | {"model.norm", "lm_head"} if two else set()
    plan = {n: D1 if n in second and n not in follow else D0 for n, _ in units}
    plan.update({f: plan[t] for f, t in follow.items()})
    dispatch(model, plan)
    return plan


def _proj(model) -> list[str]:
    return [n for n, m in model.named_modules() if n.endswith(("q_proj", "down_proj", "k_proj", "v_proj", "up_proj"))]


@pytest.mark.parametrize("precision", ["auto", "loss_scale"])
def test_the_gradient_pass_over_two_devices_counts_each_device_apart(tiny_data, precision):
    """Row/column sums, element-wise sums and the zero-gradient count of weights on two devices equal one device's;
    the float16 loss-scaled pass reads each weight's overflow flag on its own device."""
    from gac.compression.gradients import collect_gradient_stats
    from gac.compression.importance import ELEMENTWISE

    _, calib = tiny_data
    dtype = "fp32" if precision == "auto" else "fp16"
    out = []
    for spread in (False, True):
        model = _tiny(dtype)
        mods = _proj(model)
        report: dict = {}
        with fake_devices():
            _spread(model, spread)
            assert {str(model.get_submodule(n).weight.device) for n in mods} == ({D0, D1} if spread else {D0})
            stats = collect_gradient_stats(model, calib, mods, ELEMENTWISE, precision=precision, report=report)
        out.append((stats, report))
    (ref, ref_rep), (got, got_rep) = out
    assert got_rep == ref_rep and got_rep["gradients"] > 0 and got_rep["dtype"] == {"auto": "float32"}.get(
        precision, "float16")
    for n, st in ref.items():
        for what in ("taylor_row", "taylor_col", "fisher_row", "fisher_col", "taylor_mean_row", "fisher_rms_col"):
            a, b = getattr(st, what), getattr(got[n], what)
            assert b.device.type == "cpu" and torch.equal(a, b), (n, what)


def test_the_sensitivity_layer_cache_scores_on_the_heads_device(tiny_data):
    """The cached probes' targets meet the logits on the device of an untied LM head (the last one)."""
    from gac.compression.discovery import discover
    from gac.compression.sensitivity import LayerCache, sample_nll

    _, calib = tiny_data
    ref_model = _tiny(untied=True)
    with fake_devices():
        _spread(ref_model, two=False)
        ref = LayerCache(ref_model, discover(ref_model), calib).sample_nll()
        full = sample_nll(ref_model, calib)  # the plain full forward, one sample at a time
    assert torch.allclose(ref, full, rtol=1e-5)
    model = _tiny(untied=True)
    with fake_devices():
        plan = _spread(model)
        assert plan["lm_head"] == D1 and plan["model.embed_tokens"] == D0
        cache = LayerCache(model, discover(model), calib)
        got = cache.sample_nll()
        cache.advance_to(3)  # a probe of the last layer: its input now on D1
        assert cache.hidden.device == torch.device(D1)
        tail = cache.sample_nll()
    assert torch.equal(got, ref) and torch.equal(tail, ref)


@pytest.mark.slow
@pytest.mark.parametrize("compressor,allocation,options", [
    ("llm_pruner", None, {}),
    ("palu", None, {}),
    ("asvd", "sensitivity", {"sensitivity_grid": (0.5,), "sensitivity_samples": 1, "layers": "2:4"}),
], ids=["llm_pruner", "palu", "asvd"])
def test_compressing_over_two_devices_equals_one_device(tiny_data, compressor, allocation, options):
    """The whole compression (calibration, gradients or the sensitivity search, factorisation, the swap) of tiny
    with an untied head spread over two devices: the same plan and perplexity as on one device, each compressed
    module on its unit's device. (``slow``: every op of the fake devices passes through Python, and the search
    runs dozens of forwards; the tests above cover each cross-device step on its own in the default tier.)"""
    from gac.compression.compress import compress_model
    from gac.evaluation.perplexity import perplexity_of_ids

    tok, calib = tiny_data
    out = []
    for spread in (False, True):
        model = _tiny(untied=True)
        with fake_devices():
            plan = _spread(model, spread)
            model, aligned, _ = compress_model(model, tok, compressor, ratio=0.3, calib_ids=calib,
                                               allocation=allocation, compressor_options=options)
            for name, dev in plan.items():
                assert devices_of(model.get_submodule(name)) <= {dev}, name
            nll = perplexity_of_ids(model, calib.flatten(), seq_len=32)["ppl"]
        out.append((dict(aligned.dims), nll))
    assert out[1] == out[0]


# ------------------------------------------------------------------------------------------------ disk
def test_the_bfloat16_pass_keeps_disk_units_on_disk(tmp_path, tiny_data):
    """A float16 model's gradient pass runs in bfloat16: a unit on disk is cast through a file of its own (not into
    host memory), put back bit for bit afterwards, and scores as the same model in memory does."""
    from gac.compression.gradients import _cast_floating, collect_gradient_stats
    from gac.models.placement import place_model, placement_of

    _, calib = tiny_data
    model = _tiny("fp16")
    place_model(model, "cpu", {"cpu": "4MiB", "disk": "1GiB"}, tmp_path)  # fp16: the embedding, a layer
    on_disk = [n for n, d in placement_of(model).items() if d == "disk"]
    assert "model.layers.3" in on_disk
    w = model.get_submodule("model.layers.3").mlp.down_proj.weight
    orig_ptr, orig = w.data_ptr(), w.detach().clone()
    (own,) = tmp_path.iterdir()  # the folder of its own gac made
    assert mapped_from(orig_ptr) == str(own / "model.layers.3.pt")
    restore = _cast_floating(model, torch.float16, torch.bfloat16)
    assert w.dtype == torch.bfloat16
    assert mapped_from(w.data_ptr()) == str(own / "model.layers.3.bfloat16.pt")  # a file, not host memory
    assert not any(own.iterdir())  # each file unlinked once mapped: nothing to leave behind
    restore()
    restore()  # idempotent
    assert w.dtype == torch.float16 and w.data_ptr() == orig_ptr and torch.equal(w, orig)
    assert mapped_from(w.data_ptr()) == str(own / "model.layers.3.pt")
    mods = _proj(model)
    got = collect_gradient_stats(model, calib, mods, ("taylor_mean",))
    ref = collect_gradient_stats(_tiny("fp16"), calib, mods, ("taylor_mean",))
    for n in mods:
        assert torch.equal(got[n].taylor_mean_row, ref[n].taylor_mean_row), n
