"""gac's Slurm launcher on CPU: the environment file a job sources (private, exact values, srun told to pass them on
under --export=NONE), the end-of-sweep job's sbatch script (afterany on the array) and the hint it prints. The real
thing runs on the loopback cluster: tests/integration/test_slurm.py (marker slurm)."""

import stat
import subprocess

import pytest

from gac.launch import slurm


def test_the_env_file_is_private_and_sources_to_the_exact_values(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_a'b c$x")
    monkeypatch.setenv("HTTPS_PROXY", "http://user:p%40ss@proxy:3128")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    path = slurm.write_env_file(tmp_path, ["HF_TOKEN", "HTTPS_PROXY", "HF_HUB_OFFLINE", "HF_ENDPOINT", "BAD-NAME"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    line = slurm.ENV_FILE_LINE.format(path=path)
    script = f'{line}\nprintf "%s|%s|%s|%s|%s|%s" "$HF_TOKEN" "$HTTPS_PROXY" "$HF_HUB_OFFLINE" "${{HF_ENDPOINT-unset}}" ' \
             f'"$SLURM_EXPORT_ENV" "$GAC_LAUNCH_ENV_FILE"\n'
    out = subprocess.run(["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    # the file names itself last: a job's record says it read it (provenance.launch_env_file)
    assert out.stdout == f"hf_a'b c$x|http://user:p%40ss@proxy:3128|1|unset|ALL|{path}"
    path.unlink()  # gone (a node that does not mount it): the job stops, saying why, rather than run without it
    r = subprocess.run(["bash", "-c", f"{line}\necho ran"], capture_output=True, text=True)
    assert r.returncode == 1 and "ran" not in r.stdout
    assert f"gac: cannot read the launch's environment file {path}" in r.stderr


def test_the_env_file_is_sourced_by_its_absolute_path_from_any_directory(tmp_path, monkeypatch):
    """A job that runs elsewhere (--chdir, a site's default directory) still reads it."""
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "multirun").mkdir()
    path = slurm.write_env_file((tmp_path / "multirun").relative_to(tmp_path).resolve(), ["HF_TOKEN"])
    assert path.is_absolute()
    r = subprocess.run(["bash", "-c", f"{slurm.ENV_FILE_LINE.format(path=path)}\necho $HF_TOKEN"], cwd="/",
                       capture_output=True, text=True)
    assert r.stdout == "hf_x\n", r.stderr


def test_env_prefixes_and_names_a_shell_cannot_export(tmp_path, monkeypatch):
    from gac.errors import GacError
    from gac.jobs.config.schema import JOB_ENV
    from gac.jobs.sweep.slurm_site import check_values, env_names

    environ = {"WANDB_API_KEY": "k", "WANDB_MODE": "offline", "GAC_SENSITIVITY_LIMIT": "9", "OTHER": "x"}
    names = env_names(JOB_ENV, environ)
    assert {"WANDB_API_KEY", "WANDB_MODE", "GAC_SENSITIVITY_LIMIT"} <= set(names) and "OTHER" not in names
    assert {"GAC_SKIP_MEMORY_CHECK", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "XDG_CACHE_HOME"} <= set(
        env_names(JOB_ENV, dict.fromkeys(["GAC_SKIP_MEMORY_CHECK", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE",
                                          "XDG_CACHE_HOME"], "1")))
    for bad in ("1BAD", "A-B", "A B", "Ä", "*", "A\n"):
        with pytest.raises(GacError, match="hydra.launcher.env: .* is not a variable name"):
            check_values({"env": ["HF_TOKEN", bad]})
    check_values({"env": ["HF_TOKEN", "WANDB_*"]})
    monkeypatch.setenv("1BAD", "x")
    monkeypatch.setenv("WANDB_PROJECT", "p")
    text = slurm.write_env_file(tmp_path, ["1BAD", "WANDB_*"]).read_text()
    assert "export WANDB_PROJECT=p" in text and "1BAD" not in text


def test_the_end_of_sweep_job_asks_for_a_gpu_and_the_arrays_time_only_to_bench():
    params = {"timeout_min": 240, "signal_delay_s": 120, "gpus_per_node": 1, "gres": "gpu:h100:1", "mem_gb": 64,
              "partition": "gpu"}
    plain = slurm._end_params(params, bench=False, end_gpu=None)
    assert plain["timeout_min"] == slurm.END_TIMEOUT_MIN and "gpus_per_node" not in plain and "gres" not in plain
    assert plain["partition"] == "gpu" and plain["timeout_min"] * 60 > plain["signal_delay_s"] + 60
    assert slurm._end_params(params, bench=True, end_gpu=None) == params
    assert slurm._end_params(params, bench=False, end_gpu=True)["gres"] == "gpu:h100:1"


def test_a_job_that_ended_without_a_result_is_failed_not_completed(tmp_path):
    class Job:
        job_id = "7_0"

        class paths:  # noqa: N801 - submitit's JobPaths, as far as the launcher reads it
            stderr = "/x/7_0.err"

        def results(self):
            raise RuntimeError("Job 7_0 (task: 0) with path /x\nhas not produced any output (state: OUT_OF_MEMORY)")

    launcher = slurm.SlurmLauncher(submitit_folder=str(tmp_path), timeout_min=5)
    (r,) = launcher._collect([Job()], [["ratio=0.1"]], None)
    assert r.status.name == "FAILED" and "OUT_OF_MEMORY" in str(r._return_value) and "/x/7_0.err" in str(
        r._return_value)


def test_no_env_file_when_nothing_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert slurm.write_env_file(tmp_path, ["HF_TOKEN"]) is None and not list(tmp_path.iterdir())


@pytest.fixture
def fake_srun(monkeypatch):
    """submitit's Slurm executor wants srun on PATH; the sbatch script is only written here, never submitted."""
    import submitit.slurm.slurm as s

    monkeypatch.setattr(s.shutil, "which", lambda name: f"/usr/bin/{name}")


def test_the_end_of_sweep_job_waits_for_the_array_with_afterany(tmp_path, fake_srun):
    params = {"submitit_folder": str(tmp_path / "%j"), "timeout_min": 10, "cpus_per_task": 1, "mem_gb": 1,
              "partition": "debug", "name": "gac-table5", "array_parallelism": 4, "max_num_timeout": 3,
              "additional_parameters": {"export": "NONE"}, "setup": ["test ! -r /x/env || . /x/env"]}
    end = slurm._executor(params, end_of="42")._executor
    text = end._make_submission_file_text("python -m x", "uid")
    assert "#SBATCH --dependency=afterany:42" in text and "#SBATCH --job-name=gac-table5-end" in text
    assert "#SBATCH --export=NONE" in text and "test ! -r /x/env || . /x/env" in text
    assert "--array" not in text
    array = slurm._executor(params)._executor._make_submission_file_text("python -m x", "uid")
    assert "dependency" not in array and "#SBATCH --job-name=gac-table5\n" in array


def test_the_status_hint_names_each_axis_once():
    jobs = [["compressor=none", "align=unaligned", "results_dir=/r", "hydra.sweep.dir=/s"],
            ["compressor=asvd", "align=unaligned", "results_dir=/r", "hydra.sweep.dir=/s"],
            ["compressor=asvd", "align=gac", "results_dir=/r", "hydra.sweep.dir=/s"]]
    assert slurm._shared_overrides(jobs) == ["compressor=none,asvd", "align=unaligned,gac", "results_dir=/r"]


def test_hydra_finds_the_launcher_in_its_plugin_namespace():
    from hydra.core.plugins import Plugins

    from hydra_plugins.gac_launcher.gac_launcher import GacSlurmLauncher

    assert issubclass(GacSlurmLauncher, slurm.SlurmLauncher)
    assert Plugins.instance().is_in_toplevel_plugins_module(f"{GacSlurmLauncher.__module__}.GacSlurmLauncher")
    launcher = GacSlurmLauncher(wait=False, env=["HF_TOKEN"], submitit_folder="/tmp/x/%j", timeout_min=5)
    assert launcher.wait is False and launcher.env == ["HF_TOKEN"] and "wait" not in launcher.params


def _sweep_on_fake_slurm(tmp_path, **tools):
    """``experiments/run.py -m`` through gac's launcher (found by Hydra's plugin discovery) on a fake Slurm: each
    of ``tools`` a shell body (sbatch, scancel, ...), srun and a one-partition sinfo beside them, HF_TOKEN set."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {"srun": "exit 1", "sinfo": "echo 'debug*|(null)|(null)|4096|2|infinite'", **tools}
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTHONPATH": str(root), "HF_TOKEN": "hf_x"}
    return subprocess.run([sys.executable, str(root / "experiments" / "run.py"), "-m", "hydra/launcher=slurm_local",
                           "eval=none", f"results_dir={tmp_path}/res", f"hydra.sweep.dir={tmp_path}/multirun"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_an_array_sbatch_refuses_is_one_line_not_a_traceback(tmp_path):
    """Through experiments/run.py with a fake Slurm whose sbatch refuses (an account the site does not know): the
    launcher (found by Hydra's plugin discovery) says so in one line, exit code 2, and leaves no env file behind."""

    refuse = ("echo 'sbatch: error: Batch job submission failed: Invalid account or account/partition combination "
              "specified' >&2; exit 1")
    r = _sweep_on_fake_slurm(tmp_path, sbatch=refuse)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("experiments/run.py: error: Slurm refused the array: ") and "Traceback" not in r.stderr
    assert "Invalid account or account/partition combination specified" in lines[-1]
    assert not list((tmp_path / "multirun").glob(".gac-env-*"))


def test_when_sbatch_refuses_the_end_of_sweep_job_the_array_is_cancelled_and_the_env_file_removed(tmp_path):
    """A sweep without its end would leave the token's file in the sweep directory and nothing to say how it ended:
    the array is cancelled (scancel), the file removed, and the launch ends in one line, exit code 2."""
    sbatch = ('if grep -q dependency "$1"; then echo "sbatch: error: Batch job submission failed: Job dependency '
              'problem" >&2; exit 1; fi; echo "Submitted batch job 42"')
    r = _sweep_on_fake_slurm(tmp_path, sbatch=sbatch, scancel=f'echo "$@" >> {tmp_path}/cancelled')
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("experiments/run.py: error: Slurm refused the end-of-sweep job, so array job 42 was "
                           "cancelled and the environment file removed; fix it and re-launch: "), last
    assert "Job dependency problem" in last and "Traceback" not in r.stderr
    assert (tmp_path / "cancelled").read_text().split() == ["42"]
    assert not list((tmp_path / "multirun").glob(".gac-env-*"))
