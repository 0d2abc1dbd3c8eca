"""A job's ``save_model`` is its own: a done job launched again is skipped (not refused), a job that failed or was
preempted after saving resumes and keeps its checkpoint (neither refusing nor replacing it), and a checkpoint it did
not write, or one changed since, is still refused."""

import json

import pytest

from gac.errors import GacError
from gac.faults import InjectedFault
from gac.jobs.run.recipe import run_config


def _cfg(make_cfg, tmp_path):
    cfg = make_cfg("compressor=llm_pruner", "align=gac", "ratio=0.2", "eval.tasks=[]", "eval.latency=false")
    return {**cfg, "save_model": str(tmp_path / "ck")}


def test_a_done_job_with_a_checkpoint_is_skipped_not_refused(make_cfg, tmp_path):
    cfg = _cfg(make_cfg, tmp_path)
    first = run_config(cfg)
    meta = (tmp_path / "ck" / "gac_checkpoint.json").read_bytes()
    again = run_config(cfg)
    assert again.get("skipped") is True and again["key"] == first["key"]
    assert (tmp_path / "ck" / "gac_checkpoint.json").read_bytes() == meta
    with pytest.raises(GacError, match="never replaces one"):  # a forced re-run still never replaces it
        run_config({**cfg, "force": True})


def test_a_job_failed_after_its_save_resumes_and_keeps_its_checkpoint(make_cfg, tmp_path, monkeypatch):
    cfg = _cfg(make_cfg, tmp_path)
    monkeypatch.setenv("GAC_FAULT", "ppl:raise")  # after the save, inside evaluate
    with pytest.raises(InjectedFault):
        run_config(cfg)
    meta_path = tmp_path / "ck" / "gac_checkpoint.json"
    saved = meta_path.read_bytes()
    mtime = meta_path.stat().st_mtime_ns
    monkeypatch.delenv("GAC_FAULT")
    rec = run_config(cfg)
    assert not rec.get("skipped") and "saved" in rec["stages"]["resumed"]
    assert meta_path.read_bytes() == saved and meta_path.stat().st_mtime_ns == mtime  # kept, not written again
    assert json.loads(saved)["plan"]["dims"] == rec["plan"]["dims"]


def test_a_checkpoint_changed_since_the_save_is_refused(make_cfg, tmp_path, monkeypatch):
    cfg = _cfg(make_cfg, tmp_path)
    monkeypatch.setenv("GAC_FAULT", "ppl:raise")
    with pytest.raises(InjectedFault):
        run_config(cfg)
    monkeypatch.delenv("GAC_FAULT")
    meta_path = tmp_path / "ck" / "gac_checkpoint.json"
    doc = json.loads(meta_path.read_text())
    doc["edited"] = True
    meta_path.write_text(json.dumps(doc))
    with pytest.raises(GacError, match="save_model"):
        run_config(cfg)
