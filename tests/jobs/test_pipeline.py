"""The one-job pipeline on `tiny`: records, provenance, skip/force, cache reuse, resume, failures, W&B offline."""

import json
from pathlib import Path

import pytest

from gac.jobs.experiment import run_config
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
    for k in ("ppl_wikitext2", "piqa_acc", "piqa_acc_norm", "hellaswag_acc", "hellaswag_acc_norm", "prefill_ms",
              "prefill_ms@64"):
        assert isinstance(m[k], float), k
    assert 1.0 < m["ppl_wikitext2"] < 1e4 and 0.0 <= m["piqa_acc"] <= 1.0 and m["prefill_ms"] > 0
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
    assert rec["metrics"]["ppl_wikitext2"] > 1 and 0 < rec["aligned_fraction"] <= 1


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
    from gac.jobs.pipeline import spec_from_config

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
    assert rec["metrics"]["ppl_wikitext2"] == json.loads(ppl_file.read_text())["ppl"]


def test_a_planted_cache_file_is_never_executed_and_force_bypasses_the_cache(make_cfg, tmp_path, monkeypatch):
    import os
    import pickle

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'PLANTED_RAN'}",))

    results = tmp_path / "r"
    first = run_config(make_cfg("compressor=asvd", "align=unaligned", "eval=none", results_dir=results))
    assert first["stages"]["prepare_cached"] is False
    entries = list((results / "cache" / "prepared").glob("*.safetensors"))
    assert len(entries) == 1
    entries[0].write_bytes(pickle.dumps(Planted()))
    (entries[0].with_suffix(".pt")).write_bytes(pickle.dumps(Planted()))  # where gac 0.1 looked
    second = run_config(make_cfg("compressor=asvd", "align=gac", "eval=none", results_dir=results))
    assert second["stages"]["prepare_cached"] is False  # recomputed, not trusted
    assert not (tmp_path / "PLANTED_RAN").exists()
    third = run_config(make_cfg("compressor=asvd", "align=round_up", "eval=none", results_dir=results))
    assert third["stages"]["prepare_cached"] is True  # the recomputed entry replaced the planted file
    forced = run_config({**make_cfg("compressor=asvd", "align=round_up", "eval=none", results_dir=results),
                         "force": True})
    assert forced["stages"]["prepare_cached"] is False
