"""Sweeps through a REAL single-node Slurm cluster on loopback (started and stopped by these tests).

Opt in: ``python -m pytest -m slurm`` (root, with slurm-wlm, munge, slurmdbd and mariadb-server installed:
``python -m gac.launch.local_cluster install``). .ci/run installs them and runs these tests.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gac.results import ResultsStore

pytestmark = [pytest.mark.slurm, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
QUICK = ["model=tiny", "gpu=cpu", "calibration.n_samples=4", "calibration.seq_len=128", "seq_len=64",
         "eval=quick", "eval.ppl_seq_len=128", "eval.ppl_max_windows=8", "eval.latency_seq_lens=[64]", "eval.tasks=[]"]



def _quick(overrides):
    """QUICK without the keys ``overrides`` set (a key given twice is refused: the test's own value wins); a test
    that picks its own ``eval`` group gets none of QUICK's eval settings (a setting no job uses is refused)."""
    mine = {o.lstrip("+").split("=", 1)[0] for o in overrides}
    own_eval = "eval" in mine
    return [o for o in QUICK if o.split("=", 1)[0] not in mine and not (own_eval and o.startswith("eval"))]


def _multirun(cluster, tmp, overrides, timeout=600, background=False, env=None):
    quick = _quick(overrides)
    args = [sys.executable, str(ROOT / "experiments" / "run.py"), "-m", "hydra/launcher=slurm_local", *quick,
            f"results_dir={tmp}/results", f"hydra.sweep.dir={tmp}/multirun", *overrides]
    env = {**cluster.env, "PYTHONUNBUFFERED": "1", **(env or {})}
    if background:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _status(tmp, overrides):
    r = subprocess.run([sys.executable, "-m", "gac.cli", "launch", "status", "--json", "--results-dir",
                        f"{tmp}/results", *QUICK, *overrides], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_2x2_sweep_lands_4_records(cluster, tmp_path):
    sweep = ["compressor=asvd,llm_pruner", "align=unaligned,gac"]
    r = _multirun(cluster, tmp_path, sweep)
    assert r.returncode == 0, r.stdout + r.stderr
    records = list(ResultsStore(tmp_path / "results").iter_records())
    assert len(records) == 4
    assert {(x["job"]["compressor"], x["job"]["strategy"]) for x in records} == {
        ("asvd", "unaligned"), ("asvd", "gac"), ("llm_pruner", "unaligned"), ("llm_pruner", "gac")}
    assert all(x["provenance"]["slurm_job_id"] for x in records)
    # one array job, tasks 0..3 (as squeue shows them: ARRAY_TASK), named after the experiment
    arrays = {x["provenance"]["slurm_array_job_id"] for x in records}
    assert len(arrays) == 1 and sorted(x["provenance"]["slurm_array_task_id"] for x in records) == ["0", "1", "2", "3"]
    names = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobName", "-j", arrays.pop()], env=cluster.env,
                           capture_output=True, text=True, timeout=60)
    assert set(names.stdout.split()) == {"gac-default"}, names.stdout + names.stderr
    assert all(x["aligned_fraction"] == 1.0 for x in records if x["job"]["strategy"] == "gac")
    assert all(x["metrics"]["ppl_tiny"] > 1 for x in records)
    assert [row["state"] for row in _status(tmp_path, sweep)] == ["done"] * 4
    # re-launching the sweep skips every done point
    r = _multirun(cluster, tmp_path, sweep)
    assert r.returncode == 0
    assert len(list(ResultsStore(tmp_path / "results").iter_records())) == 4


def test_failing_job_is_recorded_and_reported(cluster, tmp_path):
    # a bad model path is refused by each job's preflight, before the store is touched (no failure record); the
    # end-of-sweep job names the refusal each job returned ...
    bad = _multirun(cluster, tmp_path, ["compressor=asvd", "align=unaligned,gac", "model.spec=/nonexistent/model"])
    assert bad.returncode == 1 and "config: model.spec: " in bad.stderr and "/nonexistent/model" in bad.stderr
    results = tmp_path / "results"
    assert not results.exists() or not list(ResultsStore(results).iter_records(include_failures=True))
    # ... so a job that fails on the node is made by an error inside it (gac.faults: raised during calibration)
    sweep = ["compressor=asvd", "align=unaligned,gac"]
    r = _multirun(cluster, tmp_path, sweep, env={"GAC_FAULT": "calibration:raise"})
    assert r.returncode != 0
    store = ResultsStore(tmp_path / "results")
    failures = list(store.iter_records(include_failures=True))
    assert len(failures) == 2 and all(f["status"] == "failed" for f in failures)
    assert all("injected fault at stage 'calibration'" in f["error"] for f in failures)
    rows = _status(tmp_path, sweep)
    assert [row["state"] for row in rows] == ["failed", "failed"]
    assert "injected fault" in rows[0]["detail"]


def test_requeued_job_resumes_without_redoing_finished_stages(cluster, tmp_path):
    # one job whose latency stage is long; requeue it (as a preemption would) once its perplexity stage is done
    sweep = ["compressor=asvd", "align=gac", "eval.iters=150", "eval.trials=3", "eval.warmup=0",
             "eval.latency_seq_lens=[64,65]"]
    proc = _multirun(cluster, tmp_path, sweep, background=True)
    results = tmp_path / "results"
    deadline = time.time() + 300
    job_id = None
    while time.time() < deadline:
        ppl = list(results.glob("work/*/ppl.json"))
        events = list(results.glob("runs/*.jsonl"))
        if ppl and events:
            job_id = json.loads(events[0].read_text().splitlines()[0])["slurm_job_id"]
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    assert job_id, "the job never finished its perplexity stage"
    ppl_mtime = ppl[0].stat().st_mtime_ns
    rq = subprocess.run(["scontrol", "requeue", str(job_id)], env=cluster.env, capture_output=True, text=True)
    assert rq.returncode == 0, rq.stderr
    out, _ = proc.communicate(timeout=900)  # the requeued job, then the end-of-sweep job after it
    assert proc.returncode == 0, out
    records = list(ResultsStore(results).iter_records())
    assert len(records) == 1
    rec = records[0]
    assert rec["provenance"]["slurm_restart_count"] == "1"
    assert "ppl" in rec["stages"]["resumed"]
    assert ppl[0].stat().st_mtime_ns == ppl_mtime
    started = [json.loads(x) for x in events[0].read_text().splitlines() if '"started"' in x]
    assert len(started) == 2


def test_site_settings_the_cluster_lacks_stop_the_launch(cluster, tmp_path):
    """The loopback node has no features, no GPUs, 4096 MB and 2 CPUs: each such setting is refused before sbatch."""
    for setting, msg in (("hydra.launcher.constraint=h100", "hydra.launcher.constraint=h100: no node of partition "
                                                            "'debug' has the feature 'h100' (features there: none)"),
                         ("hydra.launcher.mem_gb=64", "hydra.launcher.mem_gb=64: the nodes of partition 'debug' have "
                                                      "at most 4 GB (4096 MB)"),
                         ("hydra.launcher.gpus_per_node=1", "no node of partition 'debug' has GPUs (no GPU gres)")):
        r = _multirun(cluster, tmp_path, [setting], timeout=300)
        assert r.returncode == 2, r.stdout + r.stderr
        assert msg in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "multirun" / ".submitit").exists()  # nothing was submitted


def _status_text(cluster, tmp, overrides):
    r = subprocess.run([sys.executable, "-m", "gac.cli", "launch", "status", "--results-dir", f"{tmp}/results",
                        *_quick(overrides), *overrides], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=cluster.env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_points_that_die_leave_the_end_of_sweep_job_to_write_the_table_of_the_others(cluster, tmp_path):
    """Table 5 with its ASVD points killed (SIGKILL at the first row of ASVD's sensitivity table: what an OOM killer
    does): the end-of-sweep job (afterany on the array) still benches and tabulates baseline and LLM-Pruner."""
    sweep = ["experiment=table5", 'bench.overrides=["rounds=2","warmup=0","iters=1"]']
    r = _multirun(cluster, tmp_path, sweep, timeout=1500, env={"GAC_FAULT": "sensitivity_row:kill"})
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 point(s) of the sweep did not finish, the first [compressor=asvd align=unaligned " in r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads((tmp_path / "multirun" / "sweep-end.json").read_text())
    text = (tmp_path / "multirun" / "sweep-end.md").read_text()
    assert "3 of 5 point(s) done, 2 not: the table holds the others" in text and text in r.stdout
    gone = {tuple(o for o in f["overrides"] if o.startswith(("compressor=", "align="))): f["state"]
            for f in report["failed"]}
    assert gone == {("compressor=asvd", "align=unaligned"): "missing", ("compressor=asvd", "align=gac"): "missing"}
    assert all("killed, out of memory or time" in f["detail"] and "_log.err" in f["detail"] for f in report["failed"])
    for row in ("| Baseline ", "| LLM-Pruner ", "| LLM-Pruner (GAC) "):
        assert row in report["table"]
    assert "ASVD" not in report["table"] and "side-by-side bench" in report["table"]
    records = list(ResultsStore(tmp_path / "results").iter_records())
    arrays = {x["provenance"]["slurm_array_job_id"] for x in records}
    assert len(records) == 3 and len(arrays) == 1 and report["slurm_job_id"] not in arrays
    (bench,) = ResultsStore(tmp_path / "results").iter_bench()
    assert bench["provenance"]["slurm_job_id"] == report["slurm_job_id"]  # measured by the end-of-sweep job
    names = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobName", "-j", report["slurm_job_id"]], env=cluster.env,
                           capture_output=True, text=True, timeout=60)
    assert names.stdout.split() == ["gac-table5-end"], names.stdout + names.stderr
    status = _status_text(cluster, tmp_path, sweep)
    assert f"end of sweep: Slurm job {report['slurm_job_id']} done: 3 point(s) done, 2 not; report: " in status


def test_submit_log_off_and_come_back_on_an_export_none_site(cluster, tmp_path):
    """wait=false returns once submitted; the site submits with --export=NONE, yet the jobs get the caches and the
    token through the launcher's private file (never the job script), which the end-of-sweep job removes."""
    sweep = ["compressor=none", "align=unaligned,gac", "eval=none", "hydra.launcher.wait=false",
             "+hydra.launcher.additional_parameters.export=NONE"]
    secret = "hf_not_a_real_token_0123456789"
    r = _multirun(cluster, tmp_path, sweep, timeout=300,
                  env={"HF_TOKEN": secret, "HF_HOME": str(tmp_path / "hf"), "GAC_CACHE": str(tmp_path / "gac")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "submitted as array job" in r.stdout and "Logging off is safe" in r.stdout
    scripts = list((tmp_path / "multirun" / ".submitit").rglob("*_submission.sh"))
    assert scripts and all(secret not in p.read_text() for p in scripts)
    assert all("--export=NONE" in p.read_text() for p in scripts)
    report_path = tmp_path / "multirun" / "sweep-end.json"
    envs = list((tmp_path / "multirun").glob(".gac-env-*.sh"))
    assert report_path.exists() or (len(envs) == 1 and (envs[0].stat().st_mode & 0o777) == 0o600)
    deadline = time.time() + 600
    while not report_path.exists() and time.time() < deadline:
        time.sleep(2)
    report = json.loads(report_path.read_text())
    assert len(report["done"]) == 1 and not report["failed"], report
    assert not list((tmp_path / "multirun").glob(".gac-env-*.sh"))  # removed once every job had ended
    status = _status_text(cluster, tmp_path, sweep[:3])
    assert f"end of sweep: Slurm job {report['slurm_job_id']} done: 1 point(s) done; report: " in status


def test_the_launchers_environment_file_reaches_the_task_under_export_none(cluster, tmp_path):
    """sbatch --export=NONE hands NONE on to srun: without the file's SLURM_EXPORT_ENV=ALL the task sees none of the
    exports (submitit's own included); with it, the exact values."""
    import submitit

    from gac.launch.slurm import ENV_FILE_LINE, write_env_file

    values = {"HF_TOKEN": "hf_a'b c$x", "HTTPS_PROXY": "http://u:p@proxy:3128", "HF_HUB_OFFLINE": "1"}
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        env_file = write_env_file(tmp_path, list(values))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ex = submitit.AutoExecutor(folder=str(tmp_path / "%j"), cluster="slurm")
    ex.update_parameters(timeout_min=5, slurm_partition="debug", cpus_per_task=1, mem_gb=1,
                         slurm_setup=[ENV_FILE_LINE.format(path=env_file)],
                         slurm_additional_parameters={"export": "NONE"})

    def environment(names):  # a local function: pickled by value, whatever the job's sys.path
        import os

        return {n: os.environ.get(n) for n in names}

    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        job = ex.submit(environment, list(values))
        assert job.result() == values
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


def test_a_sweep_with_the_documented_site_file_in_place(cluster, tmp_path):
    """The first-run guide's conf/local/slurm.yaml (its loopback values: partition debug, no account or
    constraint), in a config directory added with --config-dir: the sweep check, the array, the jobs (which run its
    setup lines) and the end-of-sweep job all go through it."""
    import yaml

    from tests.jobs.test_site_file import documented_site_file

    site = yaml.safe_load(documented_site_file())
    site.update(partition="debug", account=None, qos=None, constraint=None)
    site["setup"] = [line.replace("/scratch/$USER/hf", str(tmp_path / "hf")) for line in site["setup"]]
    site["setup"].append(f"echo site-setup-ran > {tmp_path}/setup-ran")
    (tmp_path / "conf" / "local").mkdir(parents=True)
    (tmp_path / "conf" / "local" / "slurm.yaml").write_text(yaml.safe_dump(site))
    sweep = ["compressor=none", "align=unaligned,gac", "eval=none", f"--config-dir={tmp_path}/conf"]
    r = _multirun(cluster, tmp_path, sweep)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sweep-end.md" in r.stdout and len(list(ResultsStore(tmp_path / "results").iter_records())) == 1
    scripts = [p.read_text() for p in (tmp_path / "multirun" / ".submitit").rglob("*_submission.sh")]
    assert scripts and all("module load cuda/12.4" in s and "#SBATCH --partition=debug" in s for s in scripts)
    assert (tmp_path / "setup-ran").read_text() == "site-setup-ran\n"
    assert len([s for s in scripts if "--dependency=afterany:" in s]) == 1  # the end of the sweep, through it too
