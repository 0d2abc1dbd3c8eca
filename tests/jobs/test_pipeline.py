"""The one-job pipeline on `tiny`: records, provenance, skip/force, cache reuse, resume, failures, W&B offline."""

import json
from pathlib import Path

import pytest

from gac.jobs.run.recipe import run_config
from gac.results import ResultsStore


@pytest.fixture(scope="module")
def shared_results(tmp_path_factory):
    return tmp_path_factory.mktemp("shared") / "results"


def test_job_writes_a_complete_record(make_cfg, shared_results):
    rec = run_config(make_cfg("compressor=asvd", "align=gac", "ratio=0.15", results_dir=shared_results))
    store = ResultsStore(shared_results)
    path = store.record_path(rec["key"])
    assert path.exists() and json.loads(path.read_text())["key"] == rec["key"]
    assert rec["job"]["compressor"] == "asvd" and rec["job"]["strategy"] == "gac" and rec["job"]["ratio"] == 0.15
    m = rec["metrics"]
    for k in ("ppl_tiny", "piqa_acc", "piqa_acc_norm", "hellaswag_acc", "hellaswag_acc_norm", "prefill_ms"):
        assert isinstance(m[k], float), k
    # one name per quantity: the perplexity by the text scored (tiny's), the job's own prefill point once
    assert "ppl_wikitext2" not in m and not any("@" in k for k in m)
    assert "prefill_ms_spread" not in m  # eval=quick runs one trial: no spread to report
    assert rec["evaluation"]["lm_eval"]["results"]["piqa"]["acc,none"] == m["piqa_acc"]
    assert 1.0 < m["ppl_tiny"] < 1e4 and 0.0 <= m["piqa_acc"] <= 1.0 and m["prefill_ms"] > 0
    assert rec["aligned_fraction"] == 1.0
    assert rec["params"] <= rec["budget"]
    assert rec["plan"]["budget_met"] and set(rec["plan"]["dims"]) == set(rec["plan"]["d_star"])
    for stage in ("load_s", "compress_prepare_s", "sweep_s", "dp_s", "compress_apply_s", "evaluate_s", "latency_s"):
        assert rec["timings"][stage] >= 0, stage
    prov = rec["provenance"]
    for k in ("git_commit", "git_dirty", "packages", "device", "seed", "date", "gac_version", "slurm_job_id"):
        assert k in prov, k
    assert prov["packages"].get("torch")
    assert rec["config"]["compressor"]["name"] == "asvd"


def test_done_points_are_skipped_and_force_never_overwrites(make_cfg, shared_results):
    cfg = make_cfg("compressor=asvd", "align=gac", "ratio=0.15", results_dir=shared_results)
    store = ResultsStore(shared_results)
    first = run_config(cfg)  # done by the previous test (or now)
    original = store.record_path(first["key"]).read_bytes()
    again = run_config(cfg)
    assert again.get("skipped") is True
    forced = run_config({**cfg, "force": True})
    assert not forced.get("skipped")
    assert store.record_path(first["key"]).read_bytes() == original
    assert Path(forced["_path"]).name.startswith(f"{first['key']}.rerun-")


def test_sweep_points_reuse_scores_and_factorizations(make_cfg, shared_results):
    a = run_config(make_cfg("compressor=asvd", "align=unaligned", "ratio=0.3", "eval=none", results_dir=shared_results))
    b = run_config(make_cfg("compressor=asvd", "align=gac", "ratio=0.3", "eval=none", results_dir=shared_results))
    assert b["stages"]["prepare_cached"] is True
    assert a["aligned_fraction"] < 0.5 and b["aligned_fraction"] == 1.0
    assert a["budget"] == b["budget"] and a["params"] <= a["budget"] and b["params"] <= b["budget"]


def test_baseline_record(make_cfg, shared_results):
    rec = run_config(make_cfg("compressor=none", "eval.tasks=[]", results_dir=shared_results))
    assert rec["job"]["strategy"] == "baseline" and rec["plan"] is None
    assert rec["metrics"]["ppl_tiny"] > 1 and 0 < rec["aligned_fraction"] <= 1


def test_failure_is_recorded_and_the_job_resumes_its_finished_stages(make_cfg, tmp_path, monkeypatch):
    import gac.evaluation as ev

    cfg = make_cfg("compressor=llm_pruner", "align=gac", "ratio=0.2")
    store = ResultsStore(cfg["results_dir"])
    real = ev.evaluate_tasks

    def boom(*a, **k):
        raise RuntimeError("node lost during lm-eval")

    monkeypatch.setattr(ev, "evaluate_tasks", boom)
    with pytest.raises(RuntimeError, match="node lost"):
        run_config(cfg)
    from gac.jobs.config.build import spec_from_config

    key = spec_from_config(cfg).key
    assert store.status(key) == "failed"
    failure = json.loads(next((store.failures_dir / key).glob("*.json")).read_text())
    assert "node lost during lm-eval" in failure["error"] and "Traceback" in failure["traceback"]
    ppl_file = store.root / "work" / key / "ppl.json"
    assert ppl_file.exists()  # the stage before the failure finished
    before = ppl_file.stat().st_mtime_ns
    monkeypatch.setattr(ev, "evaluate_tasks", real)
    rec = run_config(cfg)
    assert store.status(key) == "done"
    assert "ppl" in rec["stages"]["resumed"]
    assert ppl_file.stat().st_mtime_ns == before
    assert rec["metrics"]["ppl_tiny"] == json.loads(ppl_file.read_text())["output"]["ppl"]


def test_a_planted_cache_file_is_never_executed_and_force_bypasses_the_cache(make_cfg, tmp_path, monkeypatch):
    import os
    import pickle

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'PLANTED_RAN'}",))

    results = tmp_path / "r"  # llm_pruner: its prepared entry is a safetensors file like asvd's, 10x cheaper
    first = run_config(make_cfg("compressor=llm_pruner", "align=unaligned", "eval=none", results_dir=results))
    assert first["stages"]["prepare_cached"] is False
    entries = list((results / "cache" / "prepared").glob("*.safetensors"))
    assert len(entries) == 1
    entries[0].write_bytes(pickle.dumps(Planted()))
    (entries[0].with_suffix(".pt")).write_bytes(pickle.dumps(Planted()))  # where gac 0.1 looked
    second = run_config(make_cfg("compressor=llm_pruner", "align=gac", "eval=none", results_dir=results))
    assert second["stages"]["prepare_cached"] is False  # recomputed, not trusted
    assert not (tmp_path / "PLANTED_RAN").exists()
    third = run_config(make_cfg("compressor=llm_pruner", "align=round_up", "eval=none", results_dir=results))
    assert third["stages"]["prepare_cached"] is True  # the recomputed entry replaced the planted file
    forced = run_config({**make_cfg("compressor=llm_pruner", "align=round_up", "eval=none", results_dir=results),
                         "force": True})
    assert forced["stages"]["prepare_cached"] is False


def test_record_has_time_and_peak_memory_per_stage(make_cfg, tmp_path):
    rec = run_config(make_cfg("compressor=svd_llm", "eval=none", results_dir=tmp_path / "r"))
    mem = rec["memory"]
    assert mem["device"] == "cpu" and mem["peak_rss_mb"] > 100
    stages = mem["stages"]
    for st in ("load", "prepare", "calibration", "score", "factorize", "sweep", "plan", "apply", "evaluate"):
        m = stages[st]
        assert m["peak_rss_mb"] >= max(m["start_rss_mb"], m["end_rss_mb"]) > 0, st
        assert "gpu_peak_mb" not in m
    assert mem["peak_rss_mb"] >= max(m["peak_rss_mb"] for m in stages.values())
    for t in ("load_s", "calibration_s", "score_s", "factorize_s", "dp_s", "compress_apply_s"):
        assert rec["timings"][t] >= 0, t


def test_a_model_that_will_not_fit_fails_before_loading(make_cfg, tmp_path, monkeypatch):
    import gac.jobs.run.loading as loading
    import gac.jobs.run.memory_fits as fits
    from gac.errors import GacError

    def boom(spec, **_):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_job_model", boom)
    arch = "{model_type:llama,hidden_size:8192,intermediate_size:28672,num_hidden_layers:80,num_attention_heads:64," \
           "num_key_value_heads:8,vocab_size:128256}"
    cfg = make_cfg("model=llama3_70b", "model.random_weights=true", f"model.arch={arch}", "gpu=cpu", "gpu.dtype=float32",
                   "compressor=asvd", "eval=none", "calibration.source=random", results_dir=tmp_path / "r")
    with pytest.raises(GacError, match=r"will not fit: host memory: needs about \d+\.\d GiB.*bfloat16"):
        run_config(cfg)
    failures = list((tmp_path / "r" / "failures").rglob("*.json"))
    assert failures and "will not fit" in json.loads(failures[0].read_text())["error"]
    monkeypatch.setenv(fits.MEMORY_CHECK_ENV, "1")  # the escape hatch skips the estimate (and then loads)
    with pytest.raises(AssertionError, match="loaded"):
        run_config(cfg)
def test_asvd_sensitivity_table_is_computed_once_across_a_ratio_sweep(make_cfg, tmp_path, monkeypatch):
    """ASVD's default allocation is the reference's sensitivity search; its table (the slow part) is cached with
    the prepared state and reused by every other ratio of a sweep."""
    import gac.compression.preparation as C

    calls = []
    real = C.sensitivity_table
    monkeypatch.setattr(C, "sensitivity_table", lambda *a, **k: calls.append(1) or real(*a, **k))
    recs = [run_config(make_cfg("compressor=asvd", "align=unaligned", f"ratio={r}", "eval=none",
                                results_dir=tmp_path / "results")) for r in (0.15, 0.3)]
    assert len(calls) == 1
    assert recs[0]["stages"]["prepare_cached"] is False and recs[1]["stages"]["prepare_cached"] is True
    for rec in recs:
        assert rec["params"] <= rec["budget"] and isinstance(rec["plan"]["dense"], list)
    assert recs[1]["params"] < recs[0]["params"]


@pytest.mark.parametrize("override,msg", [
    ("compressor.options.sensitivity_grid=[0.5,1.5]", "outside (0, 1]"),
    ("ratio=0.7", "smallest kept ratio is 0.4"),
])
def test_config_rejects_what_the_sensitivity_search_cannot_do(make_cfg, override, msg):
    from gac.errors import GacError
    from gac.jobs.config.build import spec_from_config

    with pytest.raises(GacError, match=msg.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        spec_from_config(make_cfg("compressor=asvd", override))
    assert spec_from_config(make_cfg("compressor=asvd", "ratio=0.7", "allocation=proportional")).allocation == \
        "proportional"
    assert spec_from_config(make_cfg("compressor=asvd")).allocation == "sensitivity"
    assert spec_from_config(make_cfg("compressor=svd_llm")).allocation == "uniform"
