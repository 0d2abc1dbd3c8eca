"""The canary's verdicts from what a sweep left (records, failure records, the end-of-sweep report, the submission
scripts, the environment file), each failure with its fix; the real run on a loopback cluster is the slurm tier's
(tests/integration/test_slurm_canary.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gac.errors import GacError
from gac.launch import canary
from gac.results import ResultsStore

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "analysis" / "fixtures" / "store_mixed" / "records" / "m000000000000001.json"
POINTS = [{"overrides": ["compressor=asvd", "align=unaligned", "experiment=canary"], "key": "c000000000000001"},
          {"overrides": ["compressor=asvd", "align=gac", "experiment=canary"], "key": "c000000000000002"}]
JOBS = {"array": "7", "end": "8"}


def _canary(tmp_path) -> canary.Canary:
    lines: list[str] = []
    c = canary.Canary(["hydra/launcher=slurm_h100", "model=tiny"], tmp_path / "sweep", out=lines.append)
    c.lines = lines
    (c.sweep_dir / ".submitit" / "7_0").mkdir(parents=True)
    return c


def _record(key: str, env_file, device="cpu", device_name=None, n=20) -> dict:
    rec = json.loads(FIXTURE.read_text())
    for k in ("schema", "key", "status", "created"):
        rec.pop(k)
    rec["config"] = {**rec["config"], "eval": {"limit": 20, "tasks": ["piqa", "hellaswag"]}}
    rec["evaluation"] = {"tasks": {t: {"n": n, "limit": 20, "source": f"/data/{t}.jsonl"} for t in ("piqa",
                                                                                                 "hellaswag")}}
    rec["provenance"] = {**rec["provenance"], "device": device, "device_name": device_name,
                         **({"launch_env_file": env_file} if env_file else {})}
    return rec


def _store(c, records: dict, failures: dict = ()) -> None:
    store = ResultsStore(c.results_dir)
    store.prepare_for_writing()
    for key, rec in records.items():
        store.write_record(key, rec)
    for key, error in dict(failures).items():
        store.write_failure(key, {"job": json.loads(FIXTURE.read_text())["job"], "error": error})


def _end_report(c, done, failed=(), job="8", bench="/r/bench/b1.json"):
    c.sweep_dir.mkdir(parents=True, exist_ok=True)
    (c.sweep_dir / "sweep-end.json").write_text(json.dumps(
        {"kind": "gac-sweep-end", "slurm_job_id": job, "done": list(done), "failed": list(failed), "bench": bench,
         "report": str(c.sweep_dir / "sweep-end.md")}))


def _verdicts(c) -> dict:
    return {v.step: v for v in c.verdicts}


def test_a_sweep_that_went_through_passes_every_step(tmp_path):
    c = _canary(tmp_path)
    env = str(c.sweep_dir / ".gac-env-x.sh")
    _store(c, {p["key"]: _record(p["key"], env) for p in POINTS})
    _end_report(c, [p["key"] for p in POINTS])
    records = canary.judge(c, POINTS, JOBS, ended=True)
    v = _verdicts(c)
    assert len(records) == 2
    assert all(v[s].ok for s in ("preflight", "points", "lm-eval data", "env file", "end of sweep")), c.lines
    assert v["GPU request"].ok is None and "asks for no GPU" in v["GPU request"].detail
    assert "20 items per task" in v["lm-eval data"].detail and "removed by the end-of-sweep job" in v["env file"].detail
    assert "benched (/r/bench/b1.json)" in v["end of sweep"].detail and all("FAIL" not in ln for ln in c.lines)


def test_each_failure_is_named_with_its_fix(tmp_path):
    c = _canary(tmp_path)
    (c.sweep_dir / ".gac-env-x.sh").write_text("export X=1\n")  # left behind
    first = POINTS[0]["key"]
    _store(c, {first: _record(first, None, n=12)},
           {POINTS[1]["key"]: "out of memory on cuda:0 in stage prepare; try calibration.n_samples=8"})
    _end_report(c, [first], [{"key": POINTS[1]["key"], "detail": "failed"}], job="99")
    canary.judge(c, POINTS, JOBS, ended=True)
    v = _verdicts(c)
    assert v["preflight"].ok  # both got past it: one record, one failure record
    assert v["points"].ok is False and "1 of 2 done" in v["points"].detail
    assert v["points"].fix == "try calibration.n_samples=8"
    assert v["lm-eval data"].ok is False and "piqa scored 12 of 20 items" in v["lm-eval data"].detail
    assert v["lm-eval data"].fix.startswith("gac fetch experiment=canary model=tiny")
    assert v["env file"].ok is False and "hydra.sweep.dir" in v["env file"].fix
    assert v["end of sweep"].ok is False and "not by the end-of-sweep job 8" in v["end of sweep"].detail
    assert sum("FAIL" in ln for ln in c.lines) == 4 and all("fix:" in ln for ln in c.lines if "FAIL" in ln)


def test_a_job_refused_by_its_preflight_fails_that_step_with_the_refusal(tmp_path):
    c = _canary(tmp_path)
    _end_report(c, [], [{"key": p["key"], "detail": "config: model.spec: /x is not a model; give a hub id"}
                        for p in POINTS])
    canary.judge(c, POINTS, JOBS, ended=True)
    v = _verdicts(c)
    assert v["preflight"].ok is False and "/x is not a model" in v["preflight"].detail
    assert v["preflight"].fix == "give a hub id"


def test_an_end_of_sweep_job_that_never_reported_is_a_failure_naming_its_log(tmp_path):
    c = _canary(tmp_path)
    _store(c, {p["key"]: _record(p["key"], "/e") for p in POINTS})
    canary.judge(c, POINTS, JOBS, ended=False)
    v = _verdicts(c)["end of sweep"]
    assert v.ok is False and "wrote no report within 30 min" in v.detail and ".submitit/8/" in v.fix


def test_the_gpu_request_is_judged_from_the_scripts_and_the_records(tmp_path):
    c = _canary(tmp_path)
    script = c.sweep_dir / ".submitit" / "7_0" / "7_0_submission.sh"
    script.write_text("#!/bin/bash\n#SBATCH --partition=gpu\n#SBATCH --gres=gpu:nvidia_h100_80gb_hbm3:1\n")
    on_gpu = {"k": _record("k", "/e", device="cuda:0", device_name="NVIDIA H100 80GB HBM3")}
    v = canary.gpu_verdict(c, on_gpu)
    assert v.ok and "typed" in v.detail and "NVIDIA H100 80GB HBM3" in v.detail
    v = canary.gpu_verdict(c, {"k": _record("k", "/e")})
    assert v.ok is False and "gpu=" in v.fix
    script.write_text("#!/bin/bash\n#SBATCH --gpus-per-node=1\n")
    assert "untyped" in canary.gpu_verdict(c, on_gpu).detail


@pytest.mark.parametrize("line", [["hydra/launcher=slurm_h100", "model=llama3_8b", "gpu=h100"],
                                  ["hydra/launcher=slurm_local", "hydra.launcher.partition=debug",
                                   "hydra.launcher.setup=[a,b]"]])
def test_a_command_line_it_can_run(line):
    canary.check_command_line(line)


def test_a_step_that_fails_before_submitting_stops_there(tmp_path, monkeypatch):
    """A fetch that fails ends the canary with that verdict and the time (exit 1): nothing is submitted."""
    import subprocess

    monkeypatch.setattr(canary, "_cli", lambda args, env=None, timeout=0: subprocess.CompletedProcess(
        args, 2, "", "gac fetch: error: the hub is not reachable here (offline); run `gac fetch x` where it is"))
    monkeypatch.setattr(canary, "submit", lambda *a: pytest.fail("submitted after a failed step"))
    lines: list[str] = []
    rc = canary.run_canary(["hydra/launcher=slurm_local"], sweep_dir=tmp_path / "s", out=lines.append)
    assert rc == 1
    assert any(ln.startswith("  FAIL  fetch") for ln in lines) and "run `gac fetch x` where it is" in "\n".join(lines)
    assert lines[-1].startswith("canary: FAIL") and "first failure: fetch" in lines[-1]
    assert not (tmp_path / "s" / canary.REPORT).exists()  # no record, no node report


def test_a_bad_command_line_is_refused_before_anything(tmp_path):
    with pytest.raises(GacError, match="not a Slurm launcher"):
        canary.run_canary(["hydra/launcher=basic"], sweep_dir=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def _offline_ok(args, env=None, timeout=0):
    import subprocess

    out = json.dumps({"inputs": [{"input": "tiny"}], "caches": {"HF_HUB_CACHE": "/c"}}) if "--check" in args else ""
    return subprocess.CompletedProcess(args, 0, out, "")


def test_the_whole_run_prints_the_verdicts_the_first_run_guide_shows(tmp_path, monkeypatch):
    """Every step stubbed at its edge (the CLI, sbatch, the wait): the closing line is the one
    docs/first-run-on-your-cluster.md shows, so the guide's count of steps is the code's."""
    import gac.jobs.sweep.points

    lines: list[str] = []
    sweep = tmp_path / "s"
    env = str(sweep / ".gac-env-x.sh")

    def submitted(c, task, hydra):
        _store(c, {p["key"]: _record(p["key"], env) for p in POINTS})
        _end_report(c, [p["key"] for p in POINTS])
        return canary.Verdict("submit", True, "array job 7, end-of-sweep job 8 (afterany)"), JOBS

    monkeypatch.setattr(canary, "_cli", _offline_ok)
    monkeypatch.setattr(canary, "submit", submitted)
    monkeypatch.setattr(canary, "wait", lambda c, points, jobs: True)
    monkeypatch.setattr(gac.jobs.sweep.points, "sweep_points", lambda task: POINTS)
    assert canary.run_canary(["hydra/launcher=slurm_local", "model=tiny"], sweep_dir=sweep, out=lines.append) == 0
    shown = re.search(r"^#   (canary: PASS: .*)$", (ROOT / "docs" / "first-run-on-your-cluster.md").read_text(),
                      re.M)
    assert shown and lines[-1] == shown.group(1), (lines[-1], shown)
    steps = [ln.split()[1:3] for ln in lines if ln.startswith(("  PASS", "  SKIP"))]
    assert len(steps) == 11 and steps[0] == ["site", "files"] and steps[-1][0] == "time"


def test_the_sweep_is_submitted_through_the_installed_app_not_experiments(tmp_path, monkeypatch):
    """The command runs the function the gac-run console script runs (pyproject.toml), by this Python, with this gac
    first on its path: the same from a checkout and from a wheel, which has no experiments/."""
    import subprocess
    import sys

    seen = []

    def run(args, **kw):
        seen.append((args, kw))
        return subprocess.CompletedProcess(args, 0, "Slurm: 2 point(s) submitted as array job 41; the end-of-sweep "
                                                    "job 42 runs when they have all ended", "")

    monkeypatch.setattr(canary.subprocess, "run", run)
    c = _canary(tmp_path)
    v, jobs = canary.submit(c, ["experiment=canary", "model=tiny"], ["hydra/launcher=slurm_local"])
    assert v.ok and jobs == {"array": "41", "end": "42"}
    (args, kw), = seen
    assert not any("experiments" in a for a in args), args
    script = re.search(r'^gac-run = "([\w.]+):(\w+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert script and tuple(script.groups()) == canary.APP
    assert args[:2] == [sys.executable, "-c"] and f"from {script[1]} import {script[2]}; {script[2]}()" in args[2]
    assert repr(str(canary.ROOT)) in args[2] and args[3] == "-m" and "hydra.launcher.wait=false" in args
    assert kw["timeout"] == canary.SUBMIT_LIMIT_S and "GAC_CANARY" not in kw["env"]


def test_the_app_command_runs_the_app_from_anywhere_without_pythonpath(tmp_path):
    """The command, from another directory and without PYTHONPATH, composes the canary's config from this checkout's
    gac (its conf/), as the submission will."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([*canary.app_command(), "experiment=canary", "model=tiny", "--cfg", "hydra"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"path: {ROOT / 'conf'}" in r.stdout and "experiment=canary" in r.stdout


def test_an_app_that_cannot_be_imported_fails_before_anything_is_fetched(tmp_path, monkeypatch):
    monkeypatch.setattr(canary, "APP", ("gac.no_such_app", "run"))
    monkeypatch.setattr(canary, "_cli", lambda *a, **k: pytest.fail("fetched for a sweep that cannot be submitted"))
    lines: list[str] = []
    assert canary.run_canary(["hydra/launcher=slurm_local"], sweep_dir=tmp_path / "s", out=lines.append) == 1
    assert lines[1].startswith("  FAIL  submit") and "gac.no_such_app, cannot be imported" in lines[1]
    assert "fix: reinstall gac" in lines[1] and "first failure: submit" in lines[-1]
    monkeypatch.undo()
    assert canary.check_app() is None  # the real app and its launcher are importable here


@pytest.mark.parametrize("step", ["fetch", "offline"])
def test_a_fetch_past_its_limit_is_a_failure_naming_it_not_a_traceback(tmp_path, monkeypatch, step):
    import subprocess

    def cli(args, env=None, timeout=canary.FETCH_LIMIT_S):
        if step == "fetch" or "--check" in args:
            raise subprocess.TimeoutExpired(["gac", *args], timeout, output=b"fetching x\n")
        return _offline_ok(args)

    monkeypatch.setattr(canary, "_cli", cli)
    monkeypatch.setattr(canary, "submit", lambda *a: pytest.fail("submitted after a failed step"))
    lines: list[str] = []
    assert canary.run_canary(["hydra/launcher=slurm_local"], sweep_dir=tmp_path / "s", out=lines.append) == 1
    fail = next(i for i, ln in enumerate(lines) if ln.startswith("  FAIL"))
    assert lines[fail].startswith(f"  FAIL  {step}") and "did not finish within the canary's 60 min" in lines[fail]
    assert "\n        fix: " in lines[fail] and f"first failure: {step}" in lines[-1]


def test_a_submission_past_its_limit_names_the_jobs_it_may_have_queued(tmp_path, monkeypatch):
    """sbatch may have queued the array before the limit: the job ids from the partial output (bytes, as
    TimeoutExpired holds them) and from the sweep's .submitit folders, the sweep dir, status and scancel."""
    import subprocess

    said = {"stderr": b"... array job 41 ..."}

    def run(args, **kw):
        raise subprocess.TimeoutExpired(args, kw["timeout"], output=b"Slurm: asking for gres=gpu:h100:1\n", **said)

    monkeypatch.setattr(canary.subprocess, "run", run)
    c = _canary(tmp_path)  # its .submitit/7_0: a job whose folder submitit made
    v, jobs = canary.submit(c, ["experiment=canary", "model=tiny"], ["hydra/launcher=slurm_local"])
    assert v.ok is False and jobs == {}
    assert "did not finish within the canary's 30 min" in v.detail and "Slurm job(s) 41, 7" in v.detail
    assert str(c.sweep_dir) in v.detail and "scancel 41 7" in v.fix
    assert f"gac launch status --results-dir {c.results_dir} experiment=canary model=tiny" in v.fix
    (c.sweep_dir / ".submitit" / "7_0").rmdir()
    said["stderr"] = None
    v, _ = canary.submit(c, ["experiment=canary"], [])
    assert v.ok is False and "no job id in its output so far" in v.detail and "squeue --me" in v.fix
