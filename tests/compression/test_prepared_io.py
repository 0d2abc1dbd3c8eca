"""Prepared state on disk: safetensors + JSON round trip, and nothing but data is ever read back."""

import os
import pickle

import pytest
import torch

from gac.compression.prepared import Prepared
from gac.compression.prepared_io import read_prepared
from gac.errors import GacError


@pytest.mark.parametrize("compressor", ["asvd", "llm_pruner", "palu", "svd_llm"])
def test_round_trip_gives_the_same_plan_and_model(prepared, base, tmp_path, compressor):
    model = base[0]
    p = prepared(compressor)
    path = tmp_path / "state.safetensors"
    p.save(path)
    q = Prepared.load(path, model, compressor)
    assert q.scores == p.scores and q.proxy == p.proxy and q.power == p.power
    for name, f in p.factors.items():
        for k, v in f.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v.cpu(), q.factors[name][k]), (name, k)
            else:
                assert q.factors[name][k] == v
    ma, plan_a, _ = p.compress(0.3, "gac")
    mb, plan_b, _ = q.compress(0.3, "gac")
    assert plan_a.dims == plan_b.dims
    ids = base[2][:1]
    with torch.no_grad():
        assert torch.equal(ma(ids).logits, mb(ids).logits)


class _Planted:
    def __reduce__(self):
        return (os.system, ("touch PLANTED_RAN",))


def test_a_planted_pickle_is_refused_and_never_run(base, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "state.safetensors"
    path.write_bytes(pickle.dumps({"scores": _Planted()}))
    torch.save({"scores": _Planted()}, tmp_path / "legacy.pt")
    for p in (path, tmp_path / "legacy.pt"):
        with pytest.raises(GacError, match="not a gac prepared state"):
            Prepared.load(p, base[0], "asvd")
    assert not (tmp_path / "PLANTED_RAN").exists()


def test_a_state_for_another_model_or_compressor_is_refused(prepared, base, tmp_path):
    from tests.compression.conftest import small_model

    path = tmp_path / "state.safetensors"
    prepared("asvd").save(path)
    state, _ = read_prepared(path)
    assert state["compressor"] == "asvd"
    with pytest.raises(GacError, match="not for svd_llm"):
        Prepared.load(path, base[0], "svd_llm")
    with pytest.raises(GacError, match="not this model's|do not fit"):
        Prepared.load(path, small_model(num_hidden_layers=3), "asvd")


def test_a_truncated_state_is_refused(prepared, base, tmp_path):
    path = tmp_path / "state.safetensors"
    prepared("asvd").save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(GacError, match="not a gac prepared state"):
        Prepared.load(path, base[0], "asvd")
