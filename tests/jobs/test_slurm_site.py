"""A Slurm launcher's site settings checked against what sinfo (and sacctmgr) say, before anything is submitted:
parsed sinfo rows, and a fake sinfo on PATH through experiments/run.py."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from gac.errors import GacError
from gac.jobs.config.command_line import compose_config
from gac.jobs.sweep.slurm_site import check_site, constraint_features, parse_gres, parse_sinfo, slurm_minutes

ROOT = Path(__file__).resolve().parents[2]

SINFO = """gpu*|a100,ib|gpu:a100:4(S:0-1)|515000|64|2-00:00:00
gpu*|h100,ib|gpu:h100:8(S:0-1),shard:16|1030000|96|2-00:00:00
cpu|(null)|(null)|256000|128|infinite
short|a100|gpu:a100:4|515000|64|30:00
"""
SITE = {"partition": "gpu", "constraint": None, "gpus_per_node": 1, "mem_gb": 64, "cpus_per_task": 8,
        "tasks_per_node": 1, "timeout_min": 240}


def test_sinfo_rows_parse():
    rows = parse_sinfo(SINFO)
    assert [(r.partition, r.default) for r in rows] == [("gpu", True), ("gpu", True), ("cpu", False),
                                                        ("short", False)]
    assert rows[1].features == {"h100", "ib"} and rows[1].gpus == {"h100": 8} and rows[1].mem_mb == 1030000
    assert rows[2].features == frozenset() and rows[2].gpus == {} and rows[2].time_min == math.inf
    assert rows[3].time_min == 30
    # a site banner around the rows (printed on every command at some sites) is not a partition
    banner = "Welcome to Cluster X | support: help@x\n*** maintenance Friday ***\n" + SINFO + "Have a nice day\n"
    assert [r.partition for r in parse_sinfo(banner)] == ["gpu", "gpu", "cpu", "short"]
    assert parse_sinfo("debug*\nWelcome to Cluster X\n") == []


def test_sinfo_memory_with_a_unit_suffix_is_read_in_its_unit():
    """Some sites print memory as ``1000G``: read as 1000 MB it refused a 64 GB job, "at most 0 GB"."""
    rows = parse_sinfo("gpu*|a100|gpu:a100:4|1000G|64|infinite\nbig|(null)|(null)|2T|64|infinite\n"
                       "cpu|(null)|(null)|256000+|64|infinite\n")
    assert [r.mem_mb for r in rows] == [1000 * 1024, 2 * 1024**2, 256000]
    assert check_site(SITE, rows[:1]) == SITE  # 64 GB fits in 1000 GB


@pytest.mark.parametrize(("text", "minutes"), [("infinite", math.inf), ("30", 30), ("30:00", 30), ("4:00:00", 240),
                                               ("2-00:00:00", 2880), ("1-12", 2160), ("n/a", None)])
def test_slurm_minutes(text, minutes):
    assert slurm_minutes(text) == minutes


def test_gres_and_constraints():
    assert parse_gres("gpu:a100:4(S:0-1),shard:8") == {"a100": 4}
    assert parse_gres("gpu:2") == {"": 2} and parse_gres("(null)") == {} and parse_gres("gpu:h100") == {"h100": 1}
    assert constraint_features("a100&ib") == (["a100", "ib"], False)
    assert constraint_features("[a100*2|h100]") == (["a100", "h100"], True)


def test_the_default_site_settings_pass():
    assert check_site(SITE, parse_sinfo(SINFO)) == SITE  # nothing to narrow without a gpu
    check_site({**SITE, "constraint": "h100&ib", "gpus_per_node": 8}, parse_sinfo(SINFO))
    check_site({**SITE, "constraint": "a100|l40s"}, parse_sinfo(SINFO))  # one of an or is enough
    check_site({**SITE, "partition": None}, parse_sinfo(SINFO))  # the default partition


@pytest.mark.parametrize(("change", "msg"), [
    ({"partition": "gpu-h100"}, "unknown Slurm partition (hydra.launcher.partition=...) 'gpu-h100'"),
    ({"constraint": "h200"}, "hydra.launcher.constraint=h200: no node of partition 'gpu' has the feature 'h200' "
                             "(features there: a100, h100, ib); set constraint to null or to one of those"),
    ({"constraint": "a100&nvlink"}, "has the feature 'nvlink'"),
    ({"partition": "cpu"}, "hydra.launcher.gpus_per_node: no node of partition 'cpu' has GPUs (no GPU gres)"),
    ({"gres": "gpu:h200:1"}, "hydra.launcher.gres: no node of partition 'gpu' has gpu:h200 (GPU types there: a100, "
                             "h100)"),
    ({"gpus_per_node": 16}, "gpus_per_node=16: the nodes of partition 'gpu' have at most 8 GPU(s)"),
    ({"mem_gb": 2048}, "mem_gb=2048: the nodes of partition 'gpu' have at most 1005 GB"),
    ({"cpus_per_task": 200}, "cpus_per_task=200: the nodes of partition 'gpu' have at most 96 CPUs"),
    ({"partition": "short"}, "timeout_min=240: the time limit of partition 'short' is 30 minutes"),
])
def test_each_site_setting_the_cluster_lacks_is_named(change, msg):
    with pytest.raises(GacError) as e:
        check_site({**SITE, **change}, parse_sinfo(SINFO))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_account_and_qos_against_sacctmgr(tmp_path):
    fake = tmp_path / "sacctmgr"
    fake.write_text('#!/bin/sh\ncase "$*" in\n  *qos*) printf "normal\\nhigh\\n" ;;\n'
                    '  *user=alice*) printf "proj-a\\nproj-b\\n" ;;\n  *) exit 1 ;;\nesac\n')
    fake.chmod(0o755)
    rows = parse_sinfo(SINFO)
    check_site({**SITE, "account": "proj-b", "qos": "high"}, rows, str(fake), "alice")
    with pytest.raises(GacError, match=r"unknown Slurm account of user alice \(hydra.launcher.account=...\) 'proj-c'; .* known: proj-a, proj-b"):
        check_site({**SITE, "account": "proj-c"}, rows, str(fake), "alice")
    with pytest.raises(GacError, match=r"unknown Slurm QOS \(hydra.launcher.qos=...\) 'urgent'"):
        check_site({**SITE, "qos": "urgent"}, rows, str(fake), "alice")
    check_site({**SITE, "account": "anything"}, rows, str(fake), "bob")  # sacctmgr fails: left to sbatch


def test_an_sacctmgr_that_does_not_answer_is_waited_for_once_and_said(tmp_path, monkeypatch, capsys):
    import time

    from gac.jobs.sweep import slurm_site

    monkeypatch.setattr(slurm_site, "SACCTMGR_ANSWER_S", 1)
    fake = tmp_path / "sacctmgr"
    fake.write_text(f"#!/bin/sh\necho called >> {tmp_path}/calls\nexec sleep 30\n")
    fake.chmod(0o755)
    t = time.monotonic()
    check_site({**SITE, "account": "proj", "qos": "high"}, parse_sinfo(SINFO), str(fake), "alice")
    assert time.monotonic() - t < 20  # one wait, not one per question (each was a minute)
    assert (tmp_path / "calls").read_text().count("called") == 1
    err = capsys.readouterr().err
    assert "sacctmgr did not answer in 1 s: the account and QOS settings were not checked" in err


def test_the_launchers_default_the_constraint_to_null():
    for launcher in ("slurm_a100", "slurm_h100"):
        cfg = compose_config([f"hydra/launcher={launcher}"], return_hydra_config=True)
        assert cfg.hydra.launcher.constraint is None


def test_the_launchers_pass_the_caches_token_proxy_and_offline_mode_through():
    """The variables travel through gac's launcher (a private file, tests/launch/test_slurm_launcher.py), never as
    lines of the job script."""
    from omegaconf import OmegaConf

    for launcher in ("slurm_a100", "slurm_h100", "slurm_local"):
        cfg = compose_config([f"hydra/launcher={launcher}"], return_hydra_config=True)
        settings = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
        assert settings["_target_"] == "hydra_plugins.gac_launcher.gac_launcher.GacSlurmLauncher"
        assert {"HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "GAC_CACHE", "HF_TOKEN", "HF_ENDPOINT",
                "HF_HUB_OFFLINE", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy"} <= set(settings["env"])
        assert settings["setup"] == [] and settings["wait"] is True


def _fake_slurm(tmp_path, sinfo_out):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "sinfo.txt").write_text(sinfo_out)
    for name, body in (("sbatch", "exit 1"), ("srun", "exit 1"), ("sinfo", f"cat {tmp_path / 'sinfo.txt'}")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT)}


def test_an_unknown_constraint_stops_the_launch_in_one_line(tmp_path):
    env = _fake_slurm(tmp_path, SINFO)
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "-m", "hydra/launcher=slurm_h100",
                        "hydra.launcher.constraint=h100x", "eval=none", f"results_dir={tmp_path}/res",
                        f"hydra.sweep.dir={tmp_path}/multirun"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "experiments/run.py: error: Slurm site setting hydra.launcher.constraint=h100x: no node of partition 'gpu' "
        "has the feature 'h100x' (features there: a100, h100, ib); set constraint to null or to one of those "
        "(conf/local/slurm.yaml, or hydra.launcher.KEY=... on the command line)"]
    assert not (tmp_path / "res").exists()


# ----------------------------------------------------------------- the node's requests together, values, GPU types


def test_node_requests_are_checked_together_not_row_by_row():
    """No H100 node has 900 GB (the A100 rows have 503 GB, the H100 rows 1005 GB: each alone would pass)."""
    rows = parse_sinfo("gpu*|a100|gpu:a100:4|1030000|128|2-00:00:00\ngpu*|h100|gpu:h100:8|515000|96|2-00:00:00\n")
    check_site({**SITE, "constraint": "a100", "mem_gb": 900}, rows)
    with pytest.raises(GacError) as e:
        check_site({**SITE, "constraint": "h100", "mem_gb": 900}, rows)
    assert str(e.value).startswith("Slurm site settings hydra.launcher.constraint=h100 + mem_gb=900: no node of "
                                   "partition 'gpu' has them together (its nodes with constraint=h100 have at most "
                                   "502 GB)")
    with pytest.raises(GacError, match=r"gpus_per_node=8 \+ cpus_per_task=100: no node .*[(]its nodes with "
                                       r"gpus_per_node=8 have at most 96 CPUs"):
        check_site({**SITE, "constraint": None, "gpus_per_node": 8, "cpus_per_task": 100, "mem_gb": 64}, rows)


@pytest.mark.parametrize(("key", "value"), [("mem_gb", -4), ("mem_gb", 0), ("timeout_min", -1), ("timeout_min", 0),
                                            ("gpus_per_node", -1), ("cpus_per_task", 0), ("nodes", 0),
                                            ("mem_gb", 1.5), ("array_parallelism", 0), ("max_num_timeout", -2)])
def test_negative_or_zero_settings_are_refused_before_sinfo(key, value):
    with pytest.raises(GacError) as e:
        check_site({**SITE, key: value}, parse_sinfo(SINFO))
    assert f"hydra.launcher.{key}={value}: give a whole number of" in str(e.value)


def test_a_job_must_outlive_its_own_timeout_signal():
    with pytest.raises(GacError, match="timeout_min=2: a job is told to stop signal_delay_s=120 seconds before"):
        check_site({**SITE, "timeout_min": 2, "signal_delay_s": 120}, parse_sinfo(SINFO))
    check_site({**SITE, "timeout_min": 4, "signal_delay_s": 120}, parse_sinfo(SINFO))


def test_an_empty_sinfo_is_refused_not_a_pass():
    with pytest.raises(GacError, match="sinfo lists no partition here"):
        check_site(SITE, [])


MIXED = """gpu*|ib|gpu:a100:4(S:0-1)|515000|64|2-00:00:00
gpu*|ib|gpu:nvidia_h100_80gb_hbm3:8(S:0-1)|1030000|96|2-00:00:00
untyped|a100,ib|gpu:4|515000|64|2-00:00:00
untyped|h100,ib|gpu:8|1030000|96|2-00:00:00
a100only|a100|gpu:a100:4|515000|64|2-00:00:00
"""


def test_a_gpu_job_on_a_mixed_partition_asks_for_its_typed_gres():
    rows = parse_sinfo(MIXED)
    out = check_site(SITE, rows, gpu="h100")
    assert out["gres"] == "gpu:nvidia_h100_80gb_hbm3:1" and out["gpus_per_node"] is None
    assert check_site(SITE, rows, gpu="a100")["gres"] == "gpu:a100:1"
    assert check_site(SITE, rows, gpu="auto") == SITE and check_site(SITE, rows, gpu="cpu") == SITE


def test_untyped_gpus_are_told_apart_by_a_node_feature():
    out = check_site({**SITE, "partition": "untyped"}, parse_sinfo(MIXED), gpu="h100")
    assert out["constraint"] == "h100" and out["gpus_per_node"] == 1 and not out.get("gres")


def test_a_partition_without_the_jobs_gpu_or_a_request_for_another_is_refused():
    rows = parse_sinfo(MIXED)
    with pytest.raises(GacError, match=r"gpu=h100, but the GPUs of partition 'a100only' are a100 \(sinfo's GRES types\)"):
        check_site({**SITE, "partition": "a100only"}, rows, gpu="h100")
    with pytest.raises(GacError, match=r"gres=gpu:a100:1 asks for a100 GPUs but the job says gpu=h100"):
        check_site({**SITE, "gres": "gpu:a100:1", "gpus_per_node": None}, rows, gpu="h100")
    check_site({**SITE, "gres": "gpu:nvidia_h100_80gb_hbm3:1", "gpus_per_node": None}, rows, gpu="h100")


def test_a_missing_srun_or_an_empty_or_banner_only_sinfo_stops_the_launch(tmp_path, monkeypatch):
    from gac.jobs.sweep.slurm_site import check_slurm

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    out = tmp_path / "sinfo.txt"
    for name, body in (("sbatch", "exit 1"), ("sinfo", f"/bin/cat {out}")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # only the fakes (this machine may have a real Slurm)
    out.write_text(SINFO)
    with pytest.raises(GacError, match=r"`srun` is not on PATH"):
        check_slurm(SITE)
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    assert check_slurm(SITE, gpu="h100")["gres"] == "gpu:h100:1"
    out.write_text("")
    with pytest.raises(GacError, match="sinfo lists no partition here"):
        check_slurm(SITE)
    out.write_text("Welcome to Cluster X\nplease read the wiki\n")
    with pytest.raises(GacError, match=r"sinfo printed no partition rows, only other text \('Welcome to Cluster X'\)"):
        check_slurm(SITE)
