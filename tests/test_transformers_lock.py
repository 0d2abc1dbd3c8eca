"""Two model builds at once in one process (jobs in threads) leave transformers' process-wide patches as they found
them: gac holds :func:`gac.transformers_lock.transformers_lock` around every build. And the test suite's guard names
the test that leaves them on and switches them back."""

import threading

import torch

from tests.transformers_state import after_test, left_on


class _ObservedLock:
    """The real lock, with an event set when a given thread is about to wait for it."""

    def __init__(self, real, who: dict, arrived: threading.Event):
        self.real, self.who, self.arrived = real, who, arrived

    def __enter__(self):
        if threading.current_thread() is self.who.get("second"):
            self.arrived.set()
        return self.real.__enter__()

    def __exit__(self, *exc):
        return self.real.__exit__(*exc)


def test_two_builds_at_once_leave_init_weights_and_the_default_dtype_as_they_were(monkeypatch):
    """The second build starts while the first is inside transformers' build, and the first finishes while the
    second is (or, with the lock, would be) inside: unlocked, the second puts back the first's no-op init functions
    and its dtype for good."""
    from transformers import LlamaForCausalLM

    import gac.transformers_lock as tl
    from gac.compression.discovery import skeleton
    from gac.fixtures import named_config

    first_inside, second_arrived, first_done = threading.Event(), threading.Event(), threading.Event()
    who: dict = {}
    real_init = LlamaForCausalLM.__init__

    def init(self, *a, **k):  # runs inside transformers' build (no_init_weights on, the build's dtype set)
        if threading.current_thread() is who["first"]:
            first_inside.set()
            assert second_arrived.wait(600), "the second build never started"
        else:
            assert first_done.wait(600), "the first build never finished"
        real_init(self, *a, **k)

    monkeypatch.setattr(LlamaForCausalLM, "__init__", init)
    monkeypatch.setattr(tl, "_LOCK", _ObservedLock(tl._LOCK, who, second_arrived))
    config, errors = named_config("tiny"), []

    def build(dtype, done=None):
        try:
            skeleton(config, dtype=dtype, device="cpu")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            if done is not None:
                done.set()

    who["first"] = threading.Thread(target=build, args=(torch.bfloat16, first_done))
    who["second"] = threading.Thread(target=build, args=(torch.float32,))
    try:
        who["first"].start()
        assert first_inside.wait(600)
        who["second"].start()
    finally:
        for t in (who["first"], who["second"]):
            if t.ident is not None:  # started
                t.join()
        left = left_on()
        after_test("this test")  # switch back what it left, so the tests after it are unaffected
    assert not errors, errors
    assert not left, left


def test_the_guard_names_the_test_that_left_the_patches_on_and_switches_them_back():
    from transformers.initialization import no_init_weights
    from transformers.modeling_utils import PreTrainedModel

    own = PreTrainedModel.init_weights
    first, second = no_init_weights(), no_init_weights()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)  # puts back the first's no-op: the interleaving of two unlocked builds
    torch.set_default_dtype(torch.float16)
    try:
        left = left_on()
        why = after_test("tests/x.py::test_leaky")
    finally:
        after_test("this test")
    assert left[0] == "PreTrainedModel.init_weights" and "torch.nn.init.zeros_" in left
    assert "torch's default dtype (torch.float16)" in left
    assert why.startswith("tests/x.py::test_leaky left transformers' process-wide patches on "
                          "(PreTrainedModel.init_weights, ")
    assert left_on() == [] and PreTrainedModel.init_weights is own and torch.get_default_dtype() == torch.float32
    w = torch.full((4, 4), 7.0)
    torch.nn.init.zeros_(w)  # torch's own again (the no-op leaves the 7s)
    assert w.eq(0).all()
    assert after_test("tests/x.py::test_clean") is None
