"""The gradient pass of LLM-Pruner, PaLU and the gradient/Fisher proxies: a float16 model runs it in bfloat16 where
the device has it, else with a dynamic loss scale (an unscaled float16 backward underflows small weight gradients to
zero); the fraction of exactly-zero gradients is reported and noted in the prepared state."""

from __future__ import annotations

import pytest
import torch

from gac.compression import gradients as I
from gac.compression.gradients import bf16_native, collect_gradient_stats, gradient_precision
from gac.compression.preparation import gradient_note, prepare
from gac.errors import GacError
from tests.compression.conftest import small_model

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_dtype_choice():
    assert gradient_precision(F16, bf16=True) == (BF16, False)
    assert gradient_precision(F16, bf16=False) == (F16, True)  # a V100 / T4: float16 with a loss scale
    for dt in (F32, BF16, torch.float64):  # nothing to fix
        assert gradient_precision(dt, bf16=True) == (dt, False) == gradient_precision(dt, bf16=False)
    assert gradient_precision(F16, True, "model") == (F16, False)
    assert gradient_precision(F16, True, "loss_scale") == (F16, True)
    assert gradient_precision(F16, False, "bfloat16") == (BF16, False)
    assert gradient_precision(F32, True, "loss_scale") == (F32, False)
    with pytest.raises(GacError, match="gradient precision"):
        gradient_precision(F16, True, "fp8")


def test_bf16_support_is_read_from_the_device_without_emulation(monkeypatch):
    asked = []

    def supported(including_emulation=True):
        asked.append(including_emulation)
        return including_emulation  # a V100: bf16 only emulated

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    assert bf16_native("cuda") is False and asked == [False]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert bf16_native("cuda:0") is True
    assert bf16_native("cpu") is True


def _model(head_scale=1e-3):
    """A small Llama whose LM head is scaled down: its weight gradients are small enough for float16 to flush."""
    m = small_model(num_hidden_layers=2)
    with torch.no_grad():
        m.lm_head.weight.mul_(head_scale)
    return m


IDS = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))


def _names(m):
    return [n for n, x in m.named_modules() if isinstance(x, torch.nn.Linear) and "layers." in n]


def _run(m, precision="auto", **kw):
    rep = {}
    st = collect_gradient_stats(m, IDS, _names(m), elementwise=("taylor_mean",), precision=precision, report=rep, **kw)
    return st, rep


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_float16_paths_keep_the_gradients_an_unscaled_backward_flushes():
    m = _model()
    ref, r32 = _run(m)
    assert r32["dtype"] == "float32" and r32["zero_fraction"] == 0.0 and r32["loss_scale"] is None
    assert r32["gradients"] == 2 * sum(m.get_submodule(n).weight.numel() for n in _names(m))
    m16 = m.half()
    before = {k: v.clone() for k, v in m16.state_dict().items()}
    _, plain = _run(m16, "model")
    assert plain["dtype"] == "float16" and plain["zero_fraction"] > 0.005  # underflow: zero Taylor scores
    bf, rbf = _run(m16, "auto")  # the CPU has bf16
    assert rbf["dtype"] == "bfloat16" and rbf["model_dtype"] == "float16" and rbf["zero_fraction"] < 1e-4
    after = m16.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())  # put back exactly
    sc, rsc = _run(m16, "loss_scale")
    assert rsc["dtype"] == "float16" and rsc["loss_scale"] == I.LOSS_SCALE_INIT and rsc["zero_fraction"] < 1e-4
    for n in _names(m):
        for what in ("fisher_row", "taylor_col", "taylor_mean_row"):
            assert _rel(getattr(sc[n], what), getattr(ref[n], what)) < 0.02, (n, what)
            assert _rel(getattr(bf[n], what), getattr(ref[n], what)) < 0.1, (n, what)
    assert all(not p.requires_grad or p.grad is None for p in m16.parameters())


def test_an_overflow_runs_the_sample_again_at_half_the_scale(monkeypatch):
    m16 = _model(1.0).half()
    ref, _ = _run(m16, "loss_scale")
    monkeypatch.setattr(I, "LOSS_SCALE_INIT", 2.0 ** 40)  # the scaled gradients overflow float16
    got, rep = _run(m16, "loss_scale")
    assert rep["overflow_reruns"] > 0 and rep["loss_scale"] < 2.0 ** 40 and rep["zero_fraction"] < 1e-4
    assert rep["gradients"] == 2 * sum(m16.get_submodule(n).weight.numel() for n in _names(m16))  # each once
    for n in _names(m16):
        assert got[n].samples == 2
        for what in ("fisher_row", "taylor_row", "taylor_mean_col"):
            assert _rel(getattr(got[n], what), getattr(ref[n], what)) < 0.02, (n, what)
    monkeypatch.setattr(I, "LOSS_SCALE_MIN", 2.0 ** 39)  # never below the overflowing scale: refused, one line
    with pytest.raises(GacError, match="overflows on sample 0 even unscaled; run it in bfloat16 or float32"):
        _run(m16, "loss_scale")


def test_the_prepared_state_notes_the_gradient_pass():
    m = small_model(num_hidden_layers=4)  # LLM-Pruner keeps its first and last layers
    ids = IDS[:, :12]
    p = prepare(m, None, "llm_pruner", calib_ids=ids)
    (note,) = [n for n in p.notes if n.startswith("gradient pass:")]
    assert note.startswith("gradient pass: float32; 0% of the ") and note.endswith("weight gradients were exactly zero")
    assert p.paths["gradients"]["dtype"] == "float32" and p.paths["gradients"]["zero_fraction"] == 0.0
    p = prepare(m, None, "asvd", calib_ids=ids, allocation="proportional")  # no gradients taken
    assert not any(n.startswith("gradient pass") for n in p.notes) and "gradients" not in p.paths


def test_the_note_names_a_cast_and_a_loss_scale():
    rep = {"dtype": "bfloat16", "model_dtype": "float16", "loss_scale": None, "overflow_reruns": 0,
           "gradients": 1000, "zero_fraction": 0.0012}
    assert gradient_note(rep) == ("gradient pass: bfloat16 (the float16 weights cast for the pass and restored after "
                                  "it); 0.12% of the 1,000 weight gradients were exactly zero")
    rep.update(dtype="float16", loss_scale=2.0 ** 15, overflow_reruns=3)
    assert "float16 with a loss scale of 2^15 (3 re-runs after an overflow)" in gradient_note(rep)
