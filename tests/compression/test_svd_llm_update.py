"""SVD-LLM's optional parameter update (the reference's --step 2): a least-squares refit of A, layer by layer."""

from __future__ import annotations

import pytest
import torch

from gac.compression.compressors import get_compressor
from gac.compression.modules import LowRankLinear, get_module
from gac.compression.preparation import prepare
from gac.compression.prepared import Prepared
from gac.errors import GacError
from tests.compression.conftest import small_model

IDS = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def pair():
    m = small_model()
    plain = prepare(m, None, "svd_llm", calib_ids=IDS)
    upd = prepare(m, None, "svd_llm", calib_ids=IDS, compressor_options={"update": True})
    return m, plain, upd


def test_update_refits_a_only_and_never_worsens_a_projection(pair):
    m, plain, upd = pair
    c0, plan0, _ = plain.compress(0.3, "unaligned")
    c1, plan1, rep = upd.compress(0.3, "unaligned")
    assert plan0.dims == plan1.dims and plan0.params == plan1.params
    errs = rep["update_error"]
    assert set(errs) == {n for n, d in plan1.dims.items() if isinstance(get_module(c1, n), LowRankLinear)}
    assert all(e["after"] <= e["before"] + 1e-12 for e in errs.values())
    layer0 = [e for n, e in errs.items() if ".layers.0." in n]
    later = [e for n, e in errs.items() if ".layers.0." not in n]
    # layer 0 sees the calibration inputs whitening already fitted: nothing to gain; later layers see the
    # compressed prefix's outputs, and the refit lowers their output error
    assert all(abs(e["after"] - e["before"]) < 1e-6 for e in layer0)
    assert any(e["after"] < e["before"] - 1e-6 for e in later)
    for n in errs:
        a, b = get_module(c0, n), get_module(c1, n)
        assert torch.equal(a.down.weight, b.down.weight)  # B as truncation made it
    with torch.no_grad():
        assert torch.isfinite(c1(IDS[:1]).logits).all()


def test_update_keeps_the_calibration_with_the_prepared_state(pair, tmp_path):
    m, plain, upd = pair
    assert plain.calib_ids is None and torch.equal(upd.calib_ids, IDS)
    upd.save(tmp_path / "u.safetensors")
    q = Prepared.load(tmp_path / "u.safetensors", m, "svd_llm", {"update": True})
    assert torch.equal(q.calib_ids, IDS)
    a, _, _ = upd.compress(0.3, "unaligned")
    b, _, _ = q.compress(0.3, "unaligned")
    with torch.no_grad():
        assert torch.allclose(a(IDS[:1]).logits, b(IDS[:1]).logits)


def test_update_option_is_validated():
    with pytest.raises(GacError, match="update must be true or false"):
        get_compressor("svd_llm", update="yes")
    assert get_compressor("svd_llm", update=True).options()["update"] is True
