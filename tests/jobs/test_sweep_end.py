"""The end of a sweep, on CPU: each point's outcome (done, failed with its error, or gone without a word), the report
files, and the table of the points that finished while others did not (the loopback Slurm test runs the same as a
Slurm job after an array: tests/integration/test_slurm.py)."""

import os
import time

import pytest

from gac.jobs.sweep import end as sweep_end
from gac.results import ResultsStore

REC = {"job": {"model": "tiny", "compressor": "asvd", "strategy": "gac"}, "metrics": {}}


def _plan(tmp_path, points, **kw):
    return {"schema": 1, "kind": "gac-sweep", "sweep_dir": str(tmp_path / "multirun"),
            "results_dir": str(tmp_path / "results"), "experiment_name": "default",
            "bench": {"after_sweep": False, "overrides": []}, "points": points,
            "created": "2026-01-01T00:00:00Z", "created_ts": time.time(), **kw}


@pytest.fixture
def store(tmp_path):
    s = ResultsStore(tmp_path / "results")
    s.prepare_for_writing()
    return s


def _failed_return(folder, job_id, error):
    """A submitit result file as a Hydra job that raised ``error`` leaves it (Hydra catches the error in the job)."""
    from hydra.core.utils import JobReturn, JobStatus
    from submitit.core.utils import JobPaths, cloudpickle_dump

    path = JobPaths(folder, job_id=job_id).result_pickle
    path.parent.mkdir(parents=True)
    cloudpickle_dump(("success", JobReturn(overrides=[], status=JobStatus.FAILED, _return_value=error)), path)


def test_each_point_gets_its_outcome_and_the_report_names_them(tmp_path, store):
    from gac.errors import GacError

    old = store.write_failure("stale", {"error": "RuntimeError: last week's failure"})
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # before this launch: not this launch's outcome
    points = [{"overrides": ["compressor=none", "x=1"], "key": "done1"},
              {"overrides": ["compressor=asvd", "x=1"], "key": "failed1"},
              {"overrides": ["compressor=palu", "x=1"], "key": "stale", "slurm_job": "7_2",
               "log": "/sweep/.submitit/7_2/7_2_0_log.err"},
              {"overrides": ["compressor=svd_llm", "x=1"], "key": "refused", "slurm_job": "7_3"},
              {"overrides": ["compressor=none", "x=2"], "key": "done1"}]
    folder = str(tmp_path / "multirun" / ".submitit" / "%j")
    _failed_return(folder, "7_3", GacError("config: model.spec: the hub is not reachable here"))
    plan = _plan(tmp_path, points, submitit_folder=folder)
    store.write_record("done1", REC)
    store.write_failure("failed1", {"error": "InjectedFault: injected fault at stage 'calibration'"})
    report = sweep_end.finish_sweep(plan)
    states = [(p["key"], p["state"]) for p in report["points"]]
    assert states == [("done1", "done"), ("failed1", "failed"), ("stale", "missing"), ("refused", "failed"),
                      ("done1", "done")]
    by_key = {p["key"]: p["detail"] for p in report["points"][:4]}
    assert "injected fault at stage 'calibration'" in by_key["failed1"]
    assert "last week" not in by_key["stale"] and "Slurm job 7_2" in by_key["stale"]
    assert "killed, out of memory or time" in by_key["stale"] and "7_2_0_log.err" in by_key["stale"]
    assert by_key["refused"] == "GacError: config: model.spec: the hub is not reachable here"
    assert report["done"] == ["done1"] and [f["key"] for f in report["failed"]] == ["failed1", "stale", "refused"]
    text = (tmp_path / "multirun" / "sweep-end.md").read_text()
    assert text == report["text"] and "1 of 4 point(s) done, 3 not: the table holds the others" in text
    assert "- failed  compressor=asvd x=1  [failed1]" in text  # only what differs between the points
    assert sweep_end.read_report(tmp_path / "multirun")["failed"] == report["failed"]


def test_errors_the_launching_process_saw_name_their_points(tmp_path, store):
    plan = _plan(tmp_path, [{"overrides": ["ratio=0.2"], "key": "a"}, {"overrides": ["ratio=0.3"], "key": "b"}])
    store.write_record("a", REC)
    report = sweep_end.finish_sweep(plan, {frozenset(["ratio=0.3"]): "config: ratio=0.3 is refused here"})
    assert [(p["state"], p["detail"]) for p in report["points"]][1] == ("failed", "config: ratio=0.3 is refused here")


def test_a_table5_sweep_gets_the_table_of_the_points_that_finished(tmp_path, monkeypatch, store):
    """The table is made from the done points only; one that failed never stops it."""
    seen = {}

    def fake_table(plan, st, done):
        seen["done"] = list(done)
        return "| Method | PPL |\n|---|---|\n| Baseline | 9.9 |"

    monkeypatch.setattr(sweep_end, "_table", fake_table)
    plan = _plan(tmp_path, [{"overrides": ["compressor=none"], "key": "base"},
                            {"overrides": ["compressor=asvd"], "key": "gone"}], experiment_name="table5")
    store.write_record("base", REC)
    report = sweep_end.finish_sweep(plan)
    assert seen["done"] == ["base"] and report["table"].endswith("| Baseline | 9.9 |")
    assert report["text"].rstrip().endswith("| Baseline | 9.9 |")


def test_the_end_job_removes_the_launchs_environment_file(tmp_path, store):
    env = tmp_path / "multirun" / ".gac-env-x.sh"
    env.parent.mkdir(parents=True)
    env.write_text("export HF_TOKEN=hf_x\n")
    plan = _plan(tmp_path, [{"overrides": ["a=1"], "key": "k"}], env_file=str(env))
    store.write_record("k", REC)
    report = sweep_end.end_job(plan)
    assert report["done"] == ["k"] and not env.exists()


def test_the_launcher_and_the_callback_share_the_plan_by_sweep_dir(tmp_path):
    plan = _plan(tmp_path, [])
    assert sweep_end.submitted(tmp_path / "multirun") is None
    sweep_end.note_submitted(plan)
    assert sweep_end.submitted(str(tmp_path / "multirun" / ".." / "multirun")) is plan
    sweep_end.note_points(tmp_path / "m2", [{"overrides": ("a=1",), "key": "k"}])
    assert sweep_end.noted_points(tmp_path / "m2") == [{"overrides": ["a=1"], "key": "k"}]
