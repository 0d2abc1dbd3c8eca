"""A relative ``results_dir`` / ``save_model`` is taken from the directory the command ran in, not the job's
``hydra.run.dir`` (``hydra.job.chdir=true`` used to put the store under ``outputs/<date>/<time>/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gac.jobs.run.experiment import from_launch_dir

ROOT = Path(__file__).resolve().parents[2]


def test_relative_places_are_taken_from_the_launch_directory(tmp_path):
    out = from_launch_dir({"results_dir": "rel", "save_model": "ck/0", "seed": 1}, str(tmp_path))
    assert out == {"results_dir": str(tmp_path / "rel"), "save_model": str(tmp_path / "ck" / "0"), "seed": 1}


def test_absolute_home_and_unset_places_are_kept(tmp_path):
    cfg = {"results_dir": str(tmp_path / "abs"), "save_model": None}
    assert from_launch_dir(cfg, "/elsewhere") == cfg
    assert from_launch_dir({"results_dir": "~/r"}, "/elsewhere") == {"results_dir": "~/r"}


@pytest.mark.slow
def test_a_job_run_in_its_run_dir_writes_the_store_where_the_user_ran_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "compressor=none", "eval=none",
                        "results_dir=rel", "hydra.job.chdir=true"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list((tmp_path / "rel" / "records").glob("*.json"))
    assert not list((tmp_path / "outputs").glob("*/*/rel"))
