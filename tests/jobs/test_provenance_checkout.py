"""A record names the commit its job's code came from, even when the checkout moves while the job runs."""

from __future__ import annotations

import pytest

import gac.provenance as report
from gac.jobs.run import provenance
from gac.jobs.config.spec import JobSpec

SPEC = JobSpec(model_name="m", model_spec="m", compressor="asvd", gpu="a100", device="cpu", profile="auto")


@pytest.fixture
def checkout(monkeypatch):
    state = {"commit": "a" * 40, "dirty": False}
    monkeypatch.setattr(report, "git_commit", lambda repo: state["commit"])
    monkeypatch.setattr(report, "git_dirty", lambda repo: state["dirty"])
    provenance.checkout_at_start.cache_clear()
    yield state
    provenance.checkout_at_start.cache_clear()


def test_a_checkout_that_stays_put_is_recorded_as_is(checkout):
    provenance.checkout_at_start()
    p = provenance.job_provenance(SPEC)
    assert (p["git_commit"], p["git_dirty"]) == ("a" * 40, False) and "checkout_moved" not in p


@pytest.mark.parametrize("moved", [{"commit": "b" * 40}, {"dirty": True}], ids=["a commit", "an edit"])
def test_a_commit_or_edit_during_the_job_keeps_the_start_commit_and_says_it_moved(checkout, moved):
    provenance.checkout_at_start()  # the job starts at commit a...
    checkout.update(moved)  # ...and someone commits or edits in the checkout while it runs
    p = provenance.job_provenance(SPEC)
    assert p["git_commit"] == "a" * 40  # the code the process imported
    assert p["git_dirty"] is True  # not one commit's code any more: lazily imported modules may be the new ones
    assert p["checkout_moved"] == {"git_commit": checkout["commit"], "git_dirty": checkout["dirty"]}


def test_a_slurm_job_records_the_env_file_it_read_and_the_gpus_it_was_given(checkout, monkeypatch):
    monkeypatch.delenv("GAC_LAUNCH_ENV_FILE", raising=False)
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
    p = provenance.job_provenance(SPEC)
    assert "launch_env_file" not in p and "slurm_gpus_on_node" not in p  # outside Slurm: nothing added
    monkeypatch.setenv("GAC_LAUNCH_ENV_FILE", "/shared/multirun/x/.gac-env-1.sh")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "2")
    p = provenance.job_provenance(SPEC)
    assert p["launch_env_file"] == "/shared/multirun/x/.gac-env-1.sh" and p["slurm_gpus_on_node"] == "2"
