"""The site file as docs/first-run-on-your-cluster.md documents it, copied out of the doc into a config dir of its
own, through every compose of a sweep's points: the sweep check (the callback a multirun starts with), ``gac
fetch``, ``gac launch status`` and the end-of-sweep bench. And the per-machine files when they are wrong."""

import re
import shutil
from pathlib import Path

import pytest

from gac.cli import main
from gac.errors import GacError
from gac.jobs.config import compose as compose_module
from gac.jobs.sweep.site_files import check_site_files

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["compressor=none", "align=unaligned,gac", "eval=none"]


def documented_site_file() -> str:
    """The YAML block of section 4 of the first-run guide that says it is conf/local/slurm.yaml."""
    doc = (ROOT / "docs" / "first-run-on-your-cluster.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if b.startswith("# conf/local/slurm.yaml")]
    assert len(blocks) == 1, "the guide shows the site file once, headed '# conf/local/slurm.yaml'"
    return blocks[0]


@pytest.fixture
def conf(tmp_path, monkeypatch):
    """A copy of conf/ with the documented site file in it, made the config dir every compose reads."""
    d = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", d, ignore=shutil.ignore_patterns("*.yaml.bak"))
    for f in (d / "local").glob("*.yaml"):  # this checkout's own machine files stay out of the test
        f.unlink()
    (d / "local" / "slurm.yaml").write_text(documented_site_file(), encoding="utf-8")
    monkeypatch.setattr(compose_module, "CONF_DIR", d)
    return d


def test_the_sweep_check_composes_each_point_with_the_launcher_and_the_site_file(conf, tmp_path, monkeypatch):
    """What a multirun's callback does before anything is submitted, with the site checks recording what they got:
    the launcher they check is the documented site's, and every point composed."""
    from gac.jobs.run import inputs
    from gac.jobs.sweep import slurm_site
    from gac.jobs.config.command_line import compose_config
    from gac.jobs.sweep.points import SweepCallback

    seen = {}
    monkeypatch.setattr(slurm_site, "check_slurm", lambda launcher, gpu=None: seen.setdefault("launcher", launcher))
    monkeypatch.setattr(inputs, "check_sweep_offline", lambda specs, overrides: seen.setdefault("specs", list(specs)))
    from omegaconf import read_write

    fixed = [o for o in SWEEP if "," not in o]  # the primary config Hydra hands the callback: the sweep not expanded
    config = compose_config(["hydra/launcher=slurm_h100", f"hydra.sweep.dir={tmp_path}/sweep", "hydra.mode=MULTIRUN",
                             *fixed], return_hydra_config=True)
    assert "hydra/launcher=slurm_h100" in list(config.hydra.overrides.hydra)
    with read_write(config.hydra.overrides):
        config.hydra.overrides.task = SWEEP
    SweepCallback().on_multirun_start(config)
    launcher = seen["launcher"]
    assert (launcher["partition"], launcher["account"], launcher["constraint"]) == ("gpu-h100", "my-project", "h100")
    assert launcher["setup"] == ["module load cuda/12.4", "export HF_HOME=/scratch/$USER/hf"]
    assert launcher["gpus_per_node"] == 1 and launcher["timeout_min"] == 240  # the shipped values it extends
    assert len(seen["specs"]) == 2


def test_the_site_file_is_the_slurm_launchers_only(conf):
    from gac.jobs.sweep.points import compose_point

    here = compose_point(["compressor=none"], return_hydra_config=True)
    assert "partition" not in here.hydra.launcher  # Hydra's basic launcher: a run here never sees the site file
    site = compose_point(["compressor=none"], ["hydra/launcher=slurm_a100", "hydra.launcher.qos=high"],
                         return_hydra_config=True)
    assert (site.hydra.launcher.partition, site.hydra.launcher.qos) == ("gpu-h100", "high")  # the command line wins


def test_gac_fetch_composes_the_sweep_with_the_site_file_in_place(conf, capsys):
    assert main(["fetch", "--check", "hydra/launcher=slurm_h100", *SWEEP]) == 0
    assert main(["fetch", "--check", *SWEEP]) == 0
    assert "nothing to fetch" in capsys.readouterr().out


def test_gac_launch_status_composes_the_sweep_with_the_site_file_in_place(conf, tmp_path, capsys):
    from gac.results import ResultsStore

    ResultsStore(tmp_path / "results").prepare_for_writing()
    for launcher in ([], ["hydra/launcher=slurm_h100"]):
        assert main(["launch", "status", "--results-dir", str(tmp_path / "results"), *launcher, *SWEEP]) == 0
        out = capsys.readouterr().out
        assert out.rstrip().endswith("2 pending (of 2)"), out


def test_the_end_of_sweep_bench_composes_with_the_site_file_in_place(conf, tmp_path):
    from gac.jobs.bench.store_bench import check_bench_overrides, compose_bench

    cfg = compose_bench([f"results_dir={tmp_path}", "keys=[a,b]", "rounds=3"])
    assert (cfg["results_dir"], cfg["keys"], cfg["rounds"]) == (str(tmp_path), ["a", "b"], 3)
    check_bench_overrides(["rounds=3"])


def test_results_dir_in_the_machine_file_is_not_overridden_by_the_defaults(conf):
    from gac.jobs.config.command_line import compose_config
    from gac.jobs.bench.store_bench import compose_bench

    (conf / "local" / "default.yaml").write_text("results_dir: /scratch/me/results\n")  # no @package line
    assert compose_config([]).results_dir == "/scratch/me/results"
    assert compose_bench([])["results_dir"] == "/scratch/me/results"
    assert compose_config(["results_dir=mine"]).results_dir == "mine"  # the command line still wins
    (conf / "local" / "default.yaml").write_text("")  # an empty file is no setting, not a broken run
    assert compose_config([]).results_dir == "results"


@pytest.mark.parametrize("name, text, says", [
    ("default.yaml", "results_dir: [a\n", "conf/local/default.yaml is not YAML at line 2, column 1"),
    ("default.yaml", "- results_dir\n", "conf/local/default.yaml holds a list, not settings"),
    ("default.yaml", b"results_dir: \xff\n", "conf/local/default.yaml is not UTF-8 text (byte 13)"),
    ("default.yaml", "# @package _global_\nhydra:\n  launcher:\n    partition: gpu\n",
     "conf/local/default.yaml sets hydra.launcher (partition), which only a Slurm launcher has"),
    ("slurm.yaml", "partiton: gpu\n", "conf/local/slurm.yaml: 'partiton' is not a Slurm launcher setting; did you "
                                      "mean 'partition'?"),
    ("slurm.yaml", "# @package _global_\nhydra:\n  launcher:\n    partition: gpu\n",
     "conf/local/slurm.yaml holds the launcher's own keys"),
])
def test_a_machine_file_that_is_wrong_is_one_line_naming_it_and_the_fix(tmp_path, name, text, says):
    (tmp_path / "local").mkdir()
    p = tmp_path / "local" / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(GacError) as e:
        check_site_files(tmp_path)
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


def test_hydras_whole_message_reaches_the_user_on_one_line(conf):
    """A site value of the wrong type is Hydra's to refuse: its message, whole (the key and the file), one line."""
    from gac.jobs.config.command_line import compose_config

    (conf / "local" / "slurm.yaml").write_text("partition: gpu\nmem_gb: lots\n")
    with pytest.raises(GacError) as e:
        compose_config(["hydra/launcher=slurm_h100"])
    msg = str(e.value)
    assert "\n" not in msg and "In 'local/slurm'" in msg and "hydra.launcher.mem_gb" in msg, msg
