"""A job's latency-budget plan (align=gac_latency): the config keys and their refusals, the plan under its budget by
the table, the record block; end to end on tiny (slow)."""

from types import SimpleNamespace

import pytest

from gac.align.latency_budget import plan_latency
from gac.align.targets import Target
from gac.errors import GacError
from gac.jobs.run import latency_plan as lp
from gac.jobs.config.build import spec_from_config

BLOCK_KEYS = {"budget_kind", "source", "device", "batch", "seq_len", "budget_ms", "budget_share", "table_ms",
              "interval_ms", "reference", "unaligned_ms", "gac_ms", "fastest_ms", "fixed_ms", "params", "param_budget", "latency_held",
              "params_held"}


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("overrides, words", [
    (["align=gac_latency", "align.latency_source=predicted"], "needs a GPU the predictor knows"),
    (["align=gac_latency", "align.latency_budget_ms=5"], "both set"),
    (["align=gac_latency", "align.latency_budget=null"], "needs a budget"),
    (["align=gac_latency", "align.budget_kind=min_latency"], "takes no latency budget"),
    (["align=gac_latency", "align.budget_kind=fastest"], "budget_kind must be one of"),
    (["align=gac_latency", "align.latency_source=guessed"], "latency_source must be one of"),
    (["align=gac_latency", "align.latency_budget=-0.5"], "positive number"),
    (["align=gac_latency", "align.latency_budget=1e308"], "positive number at most 1000"),
    (["align=gac_latency", f"align.latency_budget={10**400}"], "override align.latency_budget=...: an integer of about "
                                                               "400 digits is no setting"),
    (["align=gac_latency", "align.latency_budget=null", "align.latency_budget_ms=1e308"], "at most 1e+09"),
    (["align=gac_latency", "align.latency_budget=null", "align.latency_budget_ms=0"], "above 0"),
    (["align=gac", "align.latency_budget=0.9"], "applies to align=gac_latency only"),
    (["align=gac_latency", "align.latency_reference=dense"], "latency_reference must be one of"),
])
def test_bad_latency_settings_are_refused_in_one_line(make_cfg, overrides, words):
    with pytest.raises(GacError) as e:
        spec_from_config(make_cfg("compressor=asvd", *overrides))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_latency_settings_reach_the_spec_and_leave_other_keys_alone(make_cfg):
    gac = spec_from_config(make_cfg("compressor=asvd", "align=gac"))
    assert gac.latency is None and "latency" not in gac.identity()
    lat = spec_from_config(make_cfg("compressor=asvd", "align=gac_latency"))
    assert lat.strategy == "gac_latency"
    assert lat.latency == {"budget_kind": "latency", "budget_ms": None, "budget": 1.0, "source": "measured",
                           "reference": "gac"}
    at_gac = spec_from_config(make_cfg("compressor=asvd", "align=gac_latency_at_gac"))
    assert at_gac.latency == lat.latency and at_gac.key == lat.key  # the shipped gac_latency under its older name
    unaligned = spec_from_config(make_cfg("compressor=asvd", "align=gac_latency", "align.latency_reference=unaligned"))
    assert unaligned.latency["reference"] == "unaligned" and unaligned.key != lat.key
    ms = spec_from_config(make_cfg("compressor=asvd", "align=gac_latency", "align.latency_budget=null",
                                   "align.latency_budget_ms=2.5"))
    assert ms.latency["budget_ms"] == 2.5 and ms.key != lat.key
    dual = spec_from_config(make_cfg("compressor=asvd", "align=gac_latency", "align.budget_kind=min_latency",
                                     "align.latency_budget=null"))
    assert dual.latency["budget_kind"] == "min_latency"
    pred = spec_from_config(make_cfg("compressor=asvd", "align=gac_latency", "gpu=h100", "gpu.device=cpu",
                                     "gpu.profile=none", "align.latency_source=predicted"))
    assert pred.latency["source"] == "predicted"


# ------------------------------------------------------------------------------------------------ the plan
def _targets():
    return [Target(f"t{i}", d, s, 96, d_max=64, kind="generic") for i, (d, s) in
            enumerate([(21.3, 1.0), (37.8, 0.4), (45.1, 2.0), (13.6, 0.7)])]


def _fake_tables(fixed=1.0):
    """A cliff table: 0.01 ms per dimension, 0.05 ms more off a multiple of 8."""
    def make(spec, model, targets, cands, unaligned, cache_dir):
        table = {t.name: {d: 0.01 * d + (0.05 if d % 8 else 0.0) for d in range(1, 65)} for t in targets}
        return lp.Tables(table, fixed, 9.0, "measured", "fake", 1, 64)
    return make


def _spec(**latency):
    return SimpleNamespace(unit=8, window=1, latency={"budget_kind": "latency", "budget_ms": None, "budget": None,
                                                      "source": "measured", "reference": "unaligned", **latency})


def test_the_plan_holds_its_budget_by_the_table_and_fills_its_record_block(monkeypatch):
    monkeypatch.setattr(lp, "measured_tables", _fake_tables())
    targets = _targets()
    budget = int(sum(t.params_per_dim * t.d_star for t in targets))
    plan, block = lp.latency_plan(_spec(budget=0.9), None, targets, budget, None, None)
    assert set(block) >= BLOCK_KEYS and block["budget_kind"] == "latency" and block["source"] == "measured"
    assert block["budget_ms"] == pytest.approx(0.9 * block["unaligned_ms"])
    assert block["table_ms"] <= block["budget_ms"] and block["latency_held"] is True
    assert block["table_ms"] == plan_latency(targets, plan.dims, _fake_tables()(None, None, targets, [], [], None)
                                             .table, 1.0)
    assert block["params"] == plan.params and plan.strategy == "gac_latency"
    assert plan.stats["latency_budget"] is block
    at_gac, b = lp.latency_plan(_spec(budget=1.0, reference="gac"), None, targets, budget, None, None)
    assert b["gac_ms"] <= b["budget_ms"] == pytest.approx(b["gac_ms"], rel=1e-12) and b["reference"] == "gac"
    assert b["table_ms"] <= b["budget_ms"]
    ms, _ = lp.latency_plan(_spec(budget_ms=block["table_ms"]), None, targets, budget, None, None)
    assert plan_latency(targets, ms.dims, _fake_tables()(None, None, targets, [], [], None).table, 1.0) \
        <= block["table_ms"]


def test_a_budget_no_plan_reaches_is_refused_naming_the_minimum(monkeypatch):
    monkeypatch.setattr(lp, "measured_tables", _fake_tables())
    targets = _targets()
    budget = int(sum(t.params_per_dim * t.d_star for t in targets))
    for spec in (_spec(budget_ms=1.1), _spec(budget=0.2)):
        with pytest.raises(GacError) as e:
            lp.latency_plan(spec, None, targets, budget, None, None)
        msg = str(e.value)
        assert "below the fastest plan" in msg and "give at least that" in msg and "\n" not in msg
    # the minimum it names is reachable
    fastest = float(msg.split("allow, ")[1].split(" ms")[0])
    _, block = lp.latency_plan(_spec(budget_ms=fastest * 1.001), None, targets, budget, None, None)
    assert block["latency_held"]


def test_a_flat_table_still_has_plans_at_the_fastest_latency(monkeypatch):
    # a GPU that waits for kernel launches: every candidate takes the same time; the budget at gac's latency is the
    # fastest plan's, and rounding to quanta must not make it infeasible
    def flat(spec, model, targets, cands, unaligned, cache_dir):
        return lp.Tables({t.name: {d: 0.1 + 1e-17 * d for d in range(1, 65)} for t in targets}, 0.3, 1.0,
                         "predicted", "h100", 1, 64)
    monkeypatch.setattr(lp, "measured_tables", flat)
    targets = _targets()
    budget = int(sum(t.params_per_dim * t.d_star for t in targets))
    plan, block = lp.latency_plan(_spec(budget=1.0, reference="gac"), None, targets, budget, None, None)
    assert block["latency_held"] and block["table_ms"] <= block["budget_ms"]


def test_at_the_gac_plans_latency_the_plan_scores_at_least_the_gac_plan(monkeypatch):
    # latency proportional to the parameters (a float factor): the gac plan is within its own latency, so the
    # latency plan's Eq. 4 value, exactly, is at least the gac plan's
    from fractions import Fraction

    from gac.align import align

    def proportional(spec, model, targets, cands, unaligned, cache_dir):
        return lp.Tables({t.name: {d: 0.0137 * t.params(d) for d in range(1, 65)} for t in targets}, 0.45, 9.0,
                         "measured", "fake", 1, 64)
    monkeypatch.setattr(lp, "measured_tables", proportional)
    targets = _targets()
    budget = int(sum(t.params_per_dim * t.d_star for t in targets))
    plan, block = lp.latency_plan(_spec(budget=1.0, reference="gac"), None, targets, budget, None, None)
    gac = align(targets, budget, "gac", 8, 1)

    def eq4(dims):
        return sum((Fraction(t.score * (t.params(dims[t.name]) - t.params_star)) for t in targets), Fraction(0))

    assert block["latency_held"] and eq4(plan.dims) >= eq4(gac.dims)


def test_the_shipped_budget_has_a_plan_on_every_table(monkeypatch, make_cfg):
    """align=gac_latency as shipped budgets the gac plan's own latency, which that plan holds: no table refuses it
    (1.0 of the unaligned plan, the old default, was refused after calibration wherever aligning down is slower)."""
    shipped = spec_from_config(make_cfg("compressor=asvd", "align=gac_latency")).latency

    def aligned_slower(spec, model, targets, cands, unaligned, cache_dir):  # multiples of 8 the slow ones
        return lp.Tables({t.name: {d: 0.01 * d + (0.2 if d % 8 == 0 else 0.0) for d in range(1, 65)}
                          for t in targets}, 1.0, 9.0, "measured", "fake", 1, 64)
    monkeypatch.setattr(lp, "measured_tables", aligned_slower)
    targets = _targets()
    budget = int(sum(t.params_per_dim * t.d_star for t in targets))
    plan, block = lp.latency_plan(SimpleNamespace(unit=8, window=1, latency=shipped), None, targets, budget, None, None)
    assert block["latency_held"] and block["reference"] == "gac" and block["table_ms"] <= block["budget_ms"]
    with pytest.raises(GacError, match="below the fastest plan"):
        lp.latency_plan(SimpleNamespace(unit=8, window=1, latency={**shipped, "reference": "unaligned"}), None,
                        targets, budget, None, None)


def test_min_latency_keeps_the_parameter_count(monkeypatch):
    monkeypatch.setattr(lp, "measured_tables", _fake_tables())
    targets = _targets()
    budget = int(sum(t.params_per_dim * t.d_star for t in targets))
    plan, block = lp.latency_plan(_spec(budget_kind="min_latency"), None, targets, budget, None, None)
    assert block["budget_ms"] is None and block["latency_held"] is None
    assert plan.params >= budget and block["params_held"] is True
    assert block["table_ms"] >= block["fastest_ms"]


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_a_latency_budget_job_on_tiny_records_its_budget(make_cfg):
    from gac.jobs.run.recipe import run_config

    rec = run_config(make_cfg("compressor=asvd", "align=gac_latency", "ratio=0.3", "eval.tasks=[]"))  # as shipped
    block = rec["latency_budget"]
    assert set(block) >= BLOCK_KEYS | {"job_prefill_ms", "timer"}
    assert block["latency_held"] is True and block["table_ms"] <= block["budget_ms"]
    # the budget is gac's latency rounded up to hold it exactly; the fastest plan's likewise
    assert block["gac_ms"] <= block["budget_ms"] == pytest.approx(block["gac_ms"], rel=1e-12)
    assert block["fastest_ms"] <= block["table_ms"] * (1 + 1e-12)
    assert block["params"] == rec["params"] and rec["job"]["strategy"] == "gac_latency"
    assert block["job_prefill_ms"] == rec["metrics"]["prefill_ms"] and block["fixed_ms"] >= 0
    with pytest.raises(GacError, match="below the fastest plan"):
        run_config(make_cfg("compressor=asvd", "align=gac_latency", "ratio=0.3", "eval.tasks=[]",
                            "align.latency_budget=0.05", results_dir=rec["_path"].rsplit("/records/", 1)[0]))


def test_measured_cpu_tables_use_the_bench_clock():
    # thread CPU time on one torch thread, as `gac bench` times a CPU; restored afterwards
    import torch

    from gac.profiling.timing import TimingProtocol, cpu_thread_clock, time_op

    before = torch.get_num_threads()
    with cpu_thread_clock():
        assert torch.get_num_threads() == 1
        t = time_op(lambda: (torch.randn(64, 64),), torch.relu, torch.device("cpu"), TimingProtocol.quick())
    assert torch.get_num_threads() == before and t.median_ms > 0
