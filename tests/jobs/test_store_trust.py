"""A job trusts what a job wrote, nothing else: stage outputs planted or edited in ``work/<key>/`` are recomputed, not
resumed; damaged entries of the store stop the job before any work with one line; a model directory given as
``model.spec`` labels the record by that directory, not by the config's ``model.name``."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from gac.errors import GacError
from gac.jobs.config.build import spec_from_config
from gac.jobs.run.recipe import run_config
from gac.results import ResultsStore

PPL_ONLY = ["compressor=none", "eval.tasks=[]", "eval.latency=false", "eval.ppl_max_windows=2", "eval.ppl_seq_len=64"]


def _key(cfg) -> str:
    return spec_from_config(cfg).key


@pytest.mark.parametrize("planted", [{"ppl": 1.0}, {"ppl": "abc"}, [1, 2], "not json"])
def test_a_stage_output_no_attempt_wrote_is_recomputed(make_cfg, planted, caplog):
    cfg = make_cfg(*PPL_ONLY)
    key = _key(cfg)
    work = ResultsStore(cfg["results_dir"]).root / "work" / key
    work.mkdir(parents=True)
    (work / "ppl.json").write_text(planted if isinstance(planted, str) else json.dumps(planted))
    with caplog.at_level(logging.WARNING, logger="gac.jobs.run.attempts"):
        rec = run_config(cfg)
    assert "ppl" not in rec["stages"]["resumed"] and rec["timings"]["ppl_s"] > 0
    assert 1 < rec["metrics"]["ppl_tiny"] < 10_000
    assert "no attempt of job" in caplog.text
    written = json.loads((work / "ppl.json").read_text())  # replaced by this job's own output
    assert (written["key"], written["stage"], written["attempt"]) == (key, "ppl", 1)
    assert written["output"]["ppl"] == rec["metrics"]["ppl_tiny"]
    from gac.analysis import load_results

    assert len(load_results(cfg["results_dir"])) == 1  # the record is one a report reads


def test_a_stage_output_edited_after_its_attempt_is_recomputed(make_cfg, monkeypatch, caplog):
    import gac.evaluation as ev

    cfg = make_cfg(*PPL_ONLY, "eval.latency=true", "eval.warmup=0", "eval.iters=1", "eval.trials=1")
    key = _key(cfg)
    real = ev.prefill_latency

    def boom(*a, **k):
        raise RuntimeError("node lost during latency")

    monkeypatch.setattr(ev, "prefill_latency", boom)
    with pytest.raises(RuntimeError, match="node lost"):
        run_config(cfg)
    ppl = ResultsStore(cfg["results_dir"]).root / "work" / key / "ppl.json"
    doc = json.loads(ppl.read_text())
    measured = doc["output"]["ppl"]
    doc["output"]["ppl"] = 1.5  # a plausible number: only the checksum tells it was not measured
    ppl.write_text(json.dumps(doc))
    monkeypatch.setattr(ev, "prefill_latency", real)
    with caplog.at_level(logging.WARNING, logger="gac.jobs.run.attempts"):
        rec = run_config(cfg)
    assert "changed since attempt 1" in caplog.text
    assert "ppl" not in rec["stages"]["resumed"] and rec["metrics"]["ppl_tiny"] == pytest.approx(measured)
    assert [a["outcome"] for a in rec["attempts"]] == ["failed", "completed"]


@pytest.mark.parametrize("damage,message", [
    ("work_file", r"is not a directory \(gac keeps a job's finished stages there\); remove the work directory"),
    ("output_dir", r"is not a plain file .*; remove the work directory \(rm -r"),
    ("attempts_shape", r"lists an attempt that is not an object with its own attempt number"),
    ("attempts_outputs", r"has an entry for the output 'ppl' that names no attempt of this job"),
    ("events_dir", r"is not a plain file \(gac appends the job's events there\); move it aside"),
    ("locks_file", r"where gac keeps locks/\); move it aside"),
])
def test_a_damaged_store_entry_stops_the_job_before_any_work(make_cfg, damage, message, monkeypatch):
    import gac.jobs.run.loading as loading

    cfg = make_cfg(*PPL_ONLY)
    key = _key(cfg)
    root = ResultsStore(cfg["results_dir"]).root
    work = root / "work" / key
    if damage == "work_file":
        work.parent.mkdir(parents=True)
        work.write_text("x")
    elif damage == "output_dir":
        (work / "ppl.json").mkdir(parents=True)
    elif damage == "attempts_shape":
        work.mkdir(parents=True)
        (work / "attempts.json").write_text(json.dumps({"attempts": [{"attempt": "one"}]}))
    elif damage == "attempts_outputs":
        work.mkdir(parents=True)
        (work / "attempts.json").write_text(json.dumps({"attempts": [{"attempt": 1}],
                                                        "outputs": {"ppl": {"attempt": 7, "sha256": "0" * 64}}}))
    elif damage == "events_dir":
        (root / "runs" / f"{key}.jsonl").mkdir(parents=True)
    elif damage == "locks_file":
        root.mkdir(parents=True)
        (root / "locks").write_text("x")

    def no_load(spec, **_):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_job_model", no_load)
    before = {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}
    with pytest.raises(GacError, match=message) as e:
        run_config(cfg)
    assert "\n" not in str(e.value)
    assert all(os.stat(p).st_mtime_ns == t for p, t in before.items() if not os.path.isdir(p))  # nothing changed
    assert not list(root.glob("failures/*/*.json")) and not list(root.glob("records/*.json"))
    assert not (work / "attempts.json").exists() or damage.startswith("attempts")


def test_a_model_directory_labels_the_record_not_the_config_name(make_cfg, tmp_path):
    from gac.fixtures.tiny import tiny_dir

    src, d = tiny_dir(), tmp_path / "my-llama"
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        os.link(src / f, d / f) if f.endswith(".safetensors") else shutil.copy(src / f, d / f)
    data = "model.ppl_source=tiny"  # another model's files: its data named on purpose (tiny's, as a fixture)
    rec = run_config(make_cfg(*PPL_ONLY, f"model.spec={d}", data))  # model=tiny's name, another model's files
    assert rec["job"]["model"] == "my-llama"
    named = run_config(make_cfg(*PPL_ONLY, f"model.spec={d}", data, "model.name=mine"))
    assert named["job"]["model"] == "mine" and named["key"] != rec["key"]
    tiny = make_cfg(*PPL_ONLY)
    assert spec_from_config(tiny).model_name == "tiny"
