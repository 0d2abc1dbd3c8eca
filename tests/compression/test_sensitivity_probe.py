"""How the sensitivity table's probes run: the layer-cache check and its dtype-aware tolerance (issue 21, defect 9),
the announced fallback to full forwards, probes on fewer calibration samples, and the batched calibration pass."""

from __future__ import annotations

import logging

import pytest
import torch

from gac.compression import sensitivity as S
from gac.compression.compressors import get_compressor
from gac.compression.preparation import prepare
from gac.errors import GacError
from tests.compression.conftest import small_model

GRID = (0.5, 0.9)


def _ids(n=3, seq=16, vocab=512, seed=0):
    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))


def _table(model, ids, **kw):
    from gac.compression.discovery import discover

    p = prepare(model, None, "asvd", calib_ids=ids, allocation="proportional")
    return S.sensitivity_table(model, p.compressor, p.units, p.factors, ids, GRID, layout=discover(model), **kw), p


def test_tolerance_is_chosen_by_dtype():
    t32, tb16, t16 = (S.probe_tolerance(d) for d in (torch.float32, torch.bfloat16, torch.float16))
    assert len({t32, tb16, t16}) == 3
    # the 16-bit tolerances scale with the unit roundoffs (2^-8 and 2^-11), both far above float32's
    assert tb16 == pytest.approx(8 * t16) and t16 > 10 * t32
    assert S.probe_tolerance(torch.float64) < t32
    assert S.probe_tolerance(torch.int8) == t32  # anything else: float32's
    # the old single tolerance (1e-4) was below 1 ulp-level disagreement of a half-precision perplexity
    assert t16 >= 4 * 2.0 ** -11


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_check_passes_with_the_dtype_tolerance_and_says_so(dtype):
    model = small_model(num_hidden_layers=2).to(dtype)
    table, _ = _table(model, _ids())
    probe = table["probe"]
    assert probe["path"] == "layer_cache" and probe["ok"]
    assert probe["dtype"] == str(dtype).removeprefix("torch.") and probe["tolerance"] == S.probe_tolerance(dtype)
    assert probe["rel_diff"] <= probe["tolerance"] and probe["check_samples"] == 2
    assert probe["samples"] == 3 and probe["seq_len"] == 16


def _perturb_cache(monkeypatch, factor):
    real = S.LayerCache.sample_nll

    def off(self):
        return real(self) * factor

    monkeypatch.setattr(S.LayerCache, "sample_nll", off)


def test_a_disagreement_above_the_tolerance_falls_back_and_is_announced(monkeypatch, caplog):
    model = small_model(num_hidden_layers=2)
    ids = _ids()
    ref, _ = _table(model, ids)
    # move the cached NLL by 3 tolerances (the perplexity moves by about the same relative amount times the NLL)
    rel = 3 * S.probe_tolerance(torch.float32)
    _perturb_cache(monkeypatch, 1 + rel / float(torch.tensor(ref["base_ppl"]).log()))
    with caplog.at_level(logging.WARNING, logger="gac.compression.sensitivity"):
        p = prepare(model, None, "asvd", calib_ids=ids, compressor_options={"sensitivity_grid": GRID})
    probe = p.sensitivity["probe"]
    assert probe["path"] == "full_forward" and not probe["ok"] and probe["rel_diff"] > probe["tolerance"]
    assert "float32 tolerance" in probe["why"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("probing with full forwards" in m and "float32 tolerance" in m for m in warned)
    assert any(n.startswith("sensitivity: every probe ran a full forward") for n in p.notes)
    # the full-forward table is the reference's: the same values the cached path gives on this model
    for a, b in zip(p.sensitivity["table"], ref["table"]):
        assert a == pytest.approx(b, rel=1e-5)
    assert p.sensitivity["base_ppl"] == pytest.approx(ref["base_ppl"], rel=1e-6)
    # and the note reaches the record's report
    _, _, report = p.compress(0.15, "unaligned")
    assert any("every probe ran a full forward" in n for n in report["notes"])


def test_a_disagreement_below_the_tolerance_keeps_the_cache(monkeypatch):
    model = small_model(num_hidden_layers=2)
    ids = _ids()
    ref, _ = _table(model, ids)
    rel = 0.3 * S.probe_tolerance(torch.float32)
    _perturb_cache(monkeypatch, 1 + rel / float(torch.tensor(ref["base_ppl"]).log()))
    table, p = _table(model, ids)
    assert table["probe"]["path"] == "layer_cache" and table["probe"]["rel_diff"] > 0
    assert not any("full forward" in n for n in p.notes)


def test_a_unit_outside_the_layers_falls_back_with_the_reason(monkeypatch, caplog):
    model = small_model(num_hidden_layers=2)
    ids = _ids()
    monkeypatch.setattr(S, "_layer_of", lambda unit, layout: None)
    with caplog.at_level(logging.WARNING, logger="gac.compression.sensitivity"):
        table, _ = _table(model, ids)
    assert table["probe"]["path"] == "full_forward" and "no decoder layer" in table["probe"]["why"]
    assert any("no decoder layer" in r.getMessage() for r in caplog.records)


def test_probes_on_the_first_samples_equal_a_table_on_those_samples():
    model = small_model(num_hidden_layers=2)
    ids = _ids(n=4)
    sub, p = _table(model, ids, probe_samples=2)
    direct = S.sensitivity_table(model, p.compressor, p.units, p.factors, ids[:2], GRID)  # the same factors
    assert sub["probe"]["samples"] == 2
    assert sub["base_ppl"] == pytest.approx(direct["base_ppl"], rel=1e-9)
    for a, b in zip(sub["table"], direct["table"]):
        assert a == pytest.approx(b, rel=1e-9)
    # the per-sample NLLs, when asked for, add up to the table's perplexities
    full, _ = _table(model, ids, keep_samples=True)
    import math

    for row, srow in zip(full["table"], full["sample_nll"]):
        for v, nll in zip(row, srow):
            assert len(nll) == 4 and v == pytest.approx(math.exp(sum(nll) / (4 * 15)), rel=1e-12)
    assert len(full["base_sample_nll"]) == 4


def test_sensitivity_samples_option_is_checked_and_used():
    for bad in (0, -1, 1.5, "x", True):
        with pytest.raises(GacError, match="sensitivity_samples"):
            get_compressor("asvd", sensitivity_samples=bad)
    assert get_compressor("asvd", sensitivity_samples="null").sensitivity_samples is None
    assert get_compressor("asvd", sensitivity_samples=2).options()["sensitivity_samples"] == 2
    model = small_model(num_hidden_layers=1)
    ids = _ids(n=3)
    with pytest.raises(GacError, match="sensitivity_samples=4 is more than the 3 calibration samples"):
        prepare(model, None, "asvd", calib_ids=ids, compressor_options={"sensitivity_samples": 4})
    p = prepare(model, None, "asvd", calib_ids=ids, compressor_options={"sensitivity_samples": 2,
                                                                          "sensitivity_grid": GRID})
    assert p.sensitivity["probe"]["samples"] == 2
    assert any("probes on 2 of the 3 calibration samples" in n for n in p.notes)


def test_config_rejects_more_probe_samples_than_calibration_samples():
    from omegaconf import OmegaConf

    from gac.jobs.config.command_line import compose_config
    from gac.jobs.config.build import spec_from_config

    def spec(*extra):
        cfg = compose_config(["compressor=asvd", "calibration.n_samples=8", *extra])
        return spec_from_config(OmegaConf.to_container(cfg, resolve=True))

    assert spec("+compressor.options.sensitivity_samples=8").compressor_options["sensitivity_samples"] == 8
    with pytest.raises(GacError, match="sensitivity_samples=9 is more than the 8 calibration samples"):
        spec("+compressor.options.sensitivity_samples=9")
    with pytest.raises(GacError, match="sensitivity_samples"):
        spec("+compressor.options.sensitivity_samples=0")


def test_batched_calibration_gives_the_per_sample_statistics(monkeypatch):
    from gac.compression import importance as I
    from gac.compression.discovery import discover

    model = small_model(num_hidden_layers=2)
    layout = discover(model)
    ids = _ids(n=5, seq=16)
    mods = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "layers." in n]

    def stats(chunk):
        monkeypatch.setattr(I, "CALIB_CHUNK_TOKENS", chunk)
        return I.collect_activation_stats(model, layout, ids, mods, xtx=True, yty={mods[0]})

    one, many = stats(1), stats(48)  # one sample per forward; three samples per forward
    for n in mods:
        assert one[n].tokens == many[n].tokens == 5 * 16
        for what in ("act_sq", "act_abs", "xtx"):
            assert torch.allclose(getattr(one[n], what), getattr(many[n], what), rtol=1e-5, atol=1e-8), (n, what)
    assert torch.allclose(one[mods[0]].yty, many[mods[0]].yty, rtol=1e-5, atol=1e-8)


def test_thread_chooser_takes_the_faster_and_checks_again():
    c = S._ThreadChooser(pool=2, every=10)
    seen = []
    for i in range(30):
        th = c.threads()
        seen.append(th)
        # the pool is faster in the first window, one thread afterwards (a machine that became busy)
        c.record(th, (1.0 if th == 2 else 1.6) if i < 10 else (3.0 if th == 2 else 1.2))
    assert seen[:4] == [2, 1, 2, 1]  # the trial alternates
    assert set(seen[4:10]) == {2} and set(seen[14:20]) == {1} and set(seen[24:30]) == {1}
    rep = c.report()
    assert [t["chose"] for t in rep["trials"]] == [2, 1, 1] and sum(rep["probes_by_threads"].values()) == 30


def test_the_table_records_its_thread_choices(monkeypatch):
    monkeypatch.setattr(S, "RECHECK_PROBES", 5)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        table, _ = _table(small_model(num_hidden_layers=1), _ids())
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(old)
    th = table["probe"]["threads"]
    n_probes = sum(1 for row in table["table"] for g in GRID if g < 1)
    assert th["pool"] == 2 and sum(th["probes_by_threads"].values()) == n_probes == 14
    assert len(th["trials"]) == 3 and all(t["chose"] in (1, 2) for t in th["trials"])
