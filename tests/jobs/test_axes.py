"""Which setting matters under which choice (gac.jobs.config.axes): one table, read by one check, refuses before any work
a setting a job cannot use, in a single run and in a sweep, and leaves alone what a sweep's table needs (the
baseline, the unaligned reference row, a setting shared by the sweep). Budgets found unreachable only once the work
ran end the job without a failure record. The catalogue rows (docs/bad-input.md, "Fourth catalogue") run the
commands; here the rule's edges."""

from __future__ import annotations

import inspect
import json

import pytest
from omegaconf import OmegaConf

from gac.errors import ConfigRefused, GacError, InfeasibleBudgetError
from gac.jobs.config.axes import AXES, check_overrides
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config
from gac.jobs.run.recipe import run_config
from gac.jobs.sweep.points import sweep_points


def _cfg(*overrides) -> dict:
    return OmegaConf.to_container(compose_config(list(overrides)), resolve=True)


def test_every_key_of_the_table_is_a_key_of_the_config():
    """A misspelt key in the table would never match an override: the rule would silently not apply."""
    from gac.compression.compressors import COMPRESSORS
    from gac.results.query import MISSING, config_value

    cfg = _cfg()
    options = {p for cls in COMPRESSORS.values() for p in inspect.signature(cls.__init__).parameters}
    for axis in AXES:
        for key in axis.keys:
            if key.startswith("compressor.options."):
                assert key.removeprefix("compressor.options.") in options, key
            elif key != "sensitivity_limit":  # gac compress's flag (GAC_SENSITIVITY_LIMIT in a job)
                assert config_value(cfg, key) is not MISSING, key


def test_a_value_the_job_would_have_had_anyway_passes():
    ok = ["align=authors_dp", "align.window=1"]  # authors_dp.yaml's own value
    check_overrides(spec_from_config(_cfg(*ok)), _cfg(*ok), ok)
    bad = ["align=authors_dp", "align.window=3"]
    with pytest.raises(GacError, match="^config: align.window=3 changes nothing in this job: align=authors_dp"):
        check_overrides(spec_from_config(_cfg(*bad)), _cfg(*bad), bad)


def test_what_a_sweeps_table_needs_is_left_alone():
    # the baseline's record leaves the compression settings out: one baseline for every ratio
    pts = sweep_points(["compressor=none,asvd", "ratio=0.1,0.2", "eval=none"])
    assert len(pts) == 4 and len({p["key"] for p in pts if p["spec"].is_baseline}) == 1
    # the unaligned reference row keeps the aligned rows' window (docs/algorithm.md's table5 at window 8)
    assert len(sweep_points(["compressor=asvd", "align=unaligned,gac", "align.window=8", "eval=none"])) == 2
    # a setting given to the whole sweep that some points use stays on the others (one table)
    assert len(sweep_points(["compressor=asvd,stable_rank_svd", "calibration.n_samples=8", "eval=none"])) == 2


def test_an_axis_a_point_cannot_use_is_refused_where_its_points_use_it_too():
    with pytest.raises(GacError, match=r"sweep point \[compressor=stable_rank_svd calibration.n_samples=8 "
                                       r"eval=none\]: config: calibration.n_samples=8 changes nothing"):
        sweep_points(["compressor=asvd,stable_rank_svd", "calibration.n_samples=8,16", "eval=none"])


def test_a_length_the_bench_reads_back_is_refused_only_as_a_sweep_axis():
    """Without a latency measurement a job's seq_len is still the length ``gac bench`` measures its plan at."""
    once = ["eval=none", "seq_len=64"]
    check_overrides(spec_from_config(_cfg(*once)), _cfg(*once), once)
    assert len(sweep_points(once)) == 1
    with pytest.raises(GacError, match="seq_len=32 changes nothing in this job: eval.latency=false"):
        sweep_points(["eval=none", "seq_len=32,64"])


def test_a_single_run_is_refused_before_the_store_is_touched(tmp_path, monkeypatch):
    import gac.jobs.run.recipe as recipe

    monkeypatch.setattr(recipe, "run_job", lambda *a, **k: pytest.fail("the job ran"))
    results = tmp_path / "results"
    over = ["compressor=stable_rank_svd", "proxy=fisher", "eval=none", f"results_dir={results}"]
    with pytest.raises(GacError, match="proxy=fisher changes nothing in this job"):
        run_config(_cfg(*over), over)
    assert not results.exists()


def test_a_point_of_a_running_sweep_is_not_judged_alone(monkeypatch, tmp_path):
    """A multirun's points were checked together when it started; alone, a point given a setting the sweep's other
    points use would look refusable."""
    import gac.jobs.run.recipe as recipe

    monkeypatch.setattr(recipe, "run_job", lambda *a, **k: {"metrics": {}})
    over = ["compressor=stable_rank_svd", "calibration.n_samples=8", "eval=none", f"results_dir={tmp_path / 'r'}"]
    assert run_config(_cfg(*over), over, sweep_dir="multirun/2026-01-01/00-00-00") == {"metrics": {}}
    with pytest.raises(GacError, match="calibration.n_samples=8 changes nothing"):
        run_config(_cfg(*over), over)


def test_gac_compress_flags_at_their_defaults_pass(tmp_path):
    """``--calib-samples 32`` and ``--window 1`` are what the command would use anyway: not refused."""
    from gac.commands import compress

    p = __import__("argparse").ArgumentParser()
    compress.add_arguments(p)
    args = p.parse_args(["tiny", "--compressor", "stable_rank_svd", "--ratio", "0.2", "--calib-samples", "32",
                         "--strategy", "authors_dp", "--window", "1", "-o", str(tmp_path / "out")])
    compress.validate(args)


def test_a_model_with_random_weights_runs_only_what_needs_no_tokenizer():
    base = ["model=llama3_8b", "model.random_weights=true"]
    for extra, match in ((["compressor=none"], "eval.ppl cannot run"),
                         (["compressor=none", "eval.ppl=false"], "eval.tasks cannot run"),
                         (["eval=none"], "set calibration.source=random")):
        with pytest.raises(GacError, match=match):
            spec_from_config(_cfg(*base, *extra))
    assert spec_from_config(_cfg(*base, "eval=none", "calibration.source=random")).random_weights
    assert spec_from_config(_cfg(*base, "eval=none", "compressor=stable_rank_svd")).random_weights  # data-free


def test_a_w_and_b_name_w_and_b_refuses_is_refused_with_the_config():
    for value in ("a/b", "../x", "a:b", "x" * 129):
        with pytest.raises(GacError, match="is not a W&B project name"):
            spec_from_config(_cfg("logger=wandb", f"logger.wandb.project={value}"))
    with pytest.raises(GacError, match="is not a W&B tag"):
        spec_from_config(_cfg("logger=wandb", f"logger.wandb.tags=[{'t' * 65}]"))


# ------------------------------------------------------------------------------------ refused after the work
def test_a_budget_found_unreachable_after_the_work_leaves_no_failure_record(make_cfg, monkeypatch, tmp_path):
    """A latency budget no plan reaches is known once the table exists: one line, and no failures/ entry (nothing
    failed; the config has to change), the attempt kept in attempts.json."""
    from gac.jobs.run import latency_plan as lp
    from gac.results import ResultsStore

    def tables(spec, model, targets, cands, unaligned, cache_dir):  # 0.01 ms per dimension, 0.05 ms off a multiple of 8
        table = {t.name: {d: 0.01 * d + (0.05 if d % 8 else 0.0) for d in range(1, 4097)} for t in targets}
        return lp.Tables(table, 1.0, 9.0, "measured", "fake", 1, 64)

    monkeypatch.setattr(lp, "measured_tables", tables)
    cfg = make_cfg("compressor=svd_llm", "align=gac_latency", "align.latency_budget=0.05", "eval=none",
                   results_dir=tmp_path / "r")
    with pytest.raises(ConfigRefused, match="infeasible latency budget: align.latency_budget=0.05"):
        run_config(cfg)
    store, key = ResultsStore(tmp_path / "r"), spec_from_config(cfg).key
    assert store.failure_paths(key) == [] and not store.is_done(key)
    attempts = json.loads((tmp_path / "r" / "work" / key / "attempts.json").read_text())["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed"]
    assert issubclass(InfeasibleBudgetError, ConfigRefused)  # the parameter budget's, found after calibration


def test_the_shipped_latency_budget_is_the_gac_plans_latency(make_cfg):
    """A share of 1 of the gac plan's latency: the best plan by Eq. 4 no slower than the parameter-budget gac plan by
    the same table, which that plan holds on every model (0.9, then 1.0 of the unaligned plan, were refused after the
    calibration where no aligned plan reached them: tests/jobs/test_latency_plan.py)."""
    lat = spec_from_config(make_cfg("align=gac_latency")).latency
    assert lat == {"budget_kind": "latency", "budget_ms": None, "budget": 1.0, "source": "measured",
                   "reference": "gac"}
