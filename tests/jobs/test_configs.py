"""Every shipped config and experiment composes and validates, without loading any weights."""

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gac.errors import GacError
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.compose import CONF_DIR
from gac.jobs.config.build import spec_from_config
from gac.jobs.sweep.points import expand_sweep, sweep_points

GROUPS = ["model", "compressor", "proxy", "align", "gpu", "eval", "logger", "method"]
ROOT = Path(__file__).resolve().parents[2]


def _options(group):
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _spec(overrides):
    return spec_from_config(OmegaConf.to_container(compose_config(overrides), resolve=True))


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_validates(group):
    opts = _options(group)
    assert opts, group
    for opt in opts:
        extra = ["gpu=cpu"] if group != "gpu" else []
        spec = _spec([f"{group}={opt}", *extra])
        assert spec.key and len(spec.key) == 16


def test_a_method_is_its_compressor_and_alignment():
    for method, (comp, strategy) in {"asvd_gac": ("asvd", "gac"), "llm_pruner_round_to": ("llm_pruner", "round_to"),
                                     "stable_rank_svd_authors_dp": ("stable_rank_svd", "authors_dp")}.items():
        spec = _spec([f"method={method}"])
        assert (spec.compressor, spec.strategy) == (comp, strategy)
        assert spec.key == _spec([f"compressor={comp}", f"align={strategy}"]).key  # the same job either way


def test_gpu_configs_select_cuda_and_a_profile():
    for g in ("a100", "h100", "h200"):
        spec = _spec([f"gpu={g}"])
        assert spec.device == "cuda" and spec.profile == "auto" and spec.dtype == "float16"


def test_model_specialisation_applies():
    spec = _spec(["model=llama3_8b", "compressor=llm_pruner"])
    assert spec.compressor_options == {"layers": "paper", "expert_width": "shared"}
    assert _spec(["model=tiny", "compressor=llm_pruner"]).compressor_options == {"layers": None, "expert_width": "shared"}
    # smollm2's ASVD probes on one calibration sample (its full search is over the 2 h limit); tiny's on all
    assert _spec(["model=smollm2", "compressor=asvd"]).compressor_options["sensitivity_samples"] == 1
    assert "sensitivity_samples" not in _spec(["model=tiny", "compressor=asvd"]).compressor_options
    assert _spec(["model=gemma3", "compressor=asvd"]).compressor_options["sensitivity_samples"] == 1
    assert _spec(["model=smollm2", "compressor=asvd", "compressor.options.sensitivity_samples=null"]
                 ).compressor_options["sensitivity_samples"] is None


@pytest.mark.parametrize("exp", _options("experiment"))
def test_every_experiment_expands_to_valid_points(exp):
    points = sweep_points([f"experiment={exp}"])
    assert len(points) >= 2
    assert {p["config"]["experiment_name"] for p in points} == {exp}


def test_table5_points_share_one_baseline():
    points = sweep_points(["experiment=table5"])
    assert len(points) == 6
    keys = [p["key"] for p in points]
    assert len(set(keys)) == 5  # the baseline ignores the alignment strategy


def test_keys_ignore_labels_and_results_dir_but_not_semantics():
    a = _spec(["experiment_name=x", "results_dir=/tmp/a"]).key
    assert a == _spec(["experiment_name=y", "results_dir=/tmp/b"]).key
    assert a != _spec(["ratio=0.2"]).key
    assert a != _spec(["align=unaligned"]).key


def test_expand_sweep_is_the_cartesian_product():
    jobs = expand_sweep(["ratio=0.1,0.2"], {"align": "unaligned,gac"})
    assert len(jobs) == 4
    assert ["align=unaligned", "ratio=0.1"] in [sorted(j) for j in jobs]
    # a command-line value replaces the experiment's sweep of the same key
    assert len(expand_sweep(["align=gac"], {"align": "unaligned,gac"})) == 1


@pytest.mark.parametrize(
    "overrides,msg",
    [
        (["compressor=asdv"], "unknown compressor 'asdv'; did you mean 'asvd'"),
        (["align=gca"], "did you mean 'gac'"),
        (["model=llama3-8b"], "did you mean 'llama3_8b'"),
        (["proxy=fisherr"], "did you mean 'fisher'"),
    ],
)
def test_unknown_group_option_suggests(overrides, msg):
    with pytest.raises(GacError, match=msg):
        compose_config(overrides)


@pytest.mark.parametrize(
    "overrides,msg",
    [
        (["ratio=1.3"], r"in \(0, 1\)"),
        (["ratio=0"], r"in \(0, 1\)"),
        (["align.unit=0"], "align.unit must be a positive integer"),
        (["align.strategy=best"], "unknown strategy"),
        (["compressor.name=asdv"], "did you mean 'asvd'"),
        (["proxy.name=fishr"], "did you mean 'fisher'"),
        (["+compressor.options.alhpa=1"], "unknown option for compressor 'asvd' 'alhpa'"),
        (["eval.tasks=[piqa,hellaswg]"], "did you mean 'hellaswag'"),
        (["gpu.device=tpu"], "gpu.device must be one of"),
        (["gpu.device=cuda:abc"], "gpu.device must be one of"),  # the type alone was checked
        (["gpu.device=cuda:-1"], "gpu.device must be one of"),
        (["gpu.device=mps"], "gpu.device must be one of"),
        (["gpu.profile=/nonexistent/profile"], "gpu.profile must be one of"),
        (["allocation=greedy"], "unknown allocation"),
    ],
)
def test_invalid_values_fail_validation(overrides, msg):
    with pytest.raises(GacError, match=msg):
        _spec(overrides)


def _run(args, **kw):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), *args], capture_output=True,
                          text=True, cwd=kw.pop("cwd", ROOT), timeout=300, **kw)


def test_invalid_sweep_point_fails_before_anything_runs(tmp_path):
    r = _run(["-m", "ratio=0.1,1.3", "eval=none", f"results_dir={tmp_path}/res",
              f"hydra.sweep.dir={tmp_path}/multirun"])
    assert r.returncode == 2, r.stderr
    assert "sweep point [ratio=1.3 " in r.stderr and "nothing was launched" in r.stderr
    assert not (tmp_path / "res").exists()
    assert not (tmp_path / "multirun" / "0").exists()


def test_single_run_bad_value_is_one_line(tmp_path):
    r = _run(["ratio=1.3", f"results_dir={tmp_path}/res", f"hydra.run.dir={tmp_path}/out"])
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("experiments/run.py: error: compression ratio")
    assert "Traceback" not in r.stderr


def test_slurm_launcher_without_sbatch_says_so(tmp_path):
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    r = _run(["-m", "hydra/launcher=slurm_a100", "eval=none", f"results_dir={tmp_path}/res",
              f"hydra.sweep.dir={tmp_path}/multirun"], env=env)
    assert r.returncode == 2
    assert "`sbatch` is not on PATH" in r.stderr


def test_experiment_is_a_group_with_a_null_default():
    assert "experiment" not in compose_config([])
    assert compose_config(["experiment=table5"])["experiment_name"] == "table5"
    # the experiment overrides config.yaml's own values (it comes after _self_), the command line overrides both
    assert compose_config(["experiment=proxy_compare"])["ratio"] == 0.2
    assert compose_config(["experiment=proxy_compare", "ratio=0.3"])["ratio"] == 0.3


def test_old_plus_experiment_form_fails_with_one_line(tmp_path):
    with pytest.raises(GacError, match=r"write experiment=table5 without '\+'"):
        sweep_points(["+experiment=table5"])
    r = _run(["-m", "+experiment=table5", f"results_dir={tmp_path}/res", f"hydra.sweep.dir={tmp_path}/multirun"])
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "experiments/run.py: error: write experiment=table5 without '+': experiment is a config group with a default "
        "in conf/config.yaml, which '+experiment=' clashes with"]


def test_sweep_expansion_uses_no_private_hydra():
    src = (ROOT / "gac" / "jobs" / "run" / "experiment.py").read_text()
    assert "hydra._internal" not in src and "import re\n" not in src and "re.search" not in src
    assert expand_sweep(["ratio=range(1,4)"]) == [["ratio=1"], ["ratio=2"], ["ratio=3"]]
    with pytest.raises(GacError, match="cannot parse the overrides"):
        expand_sweep(["ratio=0.1,,"])


def _fake_slurm(tmp_path, sinfo_body):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", "exit 1"), ("srun", "exit 1"), ("sinfo", sinfo_body)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT)}  # this checkout's gac (the script imports whichever gac Python finds)


def test_slurm_without_a_configuration_says_so_in_one_line(tmp_path):
    env = _fake_slurm(tmp_path, "echo 'sinfo: error: fetch_config: DNS SRV lookup failed' >&2\n"
                                "echo 'sinfo: fatal: Could not establish a configuration source' >&2\nexit 1")
    r = _run(["-m", "hydra/launcher=slurm_local", "eval=none", f"results_dir={tmp_path}/res",
              f"hydra.sweep.dir={tmp_path}/multirun"], env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "experiments/run.py: error: Slurm does not answer here (sinfo: fatal: Could not establish a configuration "
        "source); SLURM_CONF is unset: export SLURM_CONF=<your cluster's slurm.conf> (the loopback cluster: "
        "`python -m gac.launch.local_cluster start` prints it), or use hydra/launcher=local"]


def test_slurm_unknown_partition_is_named(tmp_path):
    env = _fake_slurm(tmp_path, "echo 'debug*|(null)|(null)|4096|2|infinite'")
    r = _run(["-m", "hydra/launcher=slurm_h100", "eval=none", f"results_dir={tmp_path}/res",
              f"hydra.sweep.dir={tmp_path}/multirun"], env=env)
    assert r.returncode == 2
    assert "unknown Slurm partition (hydra.launcher.partition=...) 'gpu'" in r.stderr and "debug" in r.stderr
    assert "Traceback" not in r.stderr


def test_slurm_job_name_carries_the_experiment():
    for launcher in ("slurm_local", "slurm_h100", "slurm_a100"):
        cfg = compose_config([f"hydra/launcher={launcher}", "experiment=table5"], return_hydra_config=True)
        assert cfg.hydra.launcher.name == "gac-table5"
