"""What a store must get right beyond one file: ratios equal up to float drift are one point while every exact value
keeps the key it always had, an event log with bytes that are not UTF-8 does not stop `gac launch status`, records
a job did not write are refused by every reader, and a full disk leaves a failure record that says so."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from gac.errors import GacError
from gac.results import ResultsStore, config_key
from gac.results.keys import canonical_number
from gac.results.store import CorruptRecord
from gac.results.validate import record_problem

D = {"ratio": 0.15, "unit": 8, "window": 1, "calibration": {"n_samples": 32, "seq_len": 2048.0},
     "opts": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], "eps": 1e-05, "theta": 500000.0, "name": "tiny"}


def _key_before(config: dict) -> str:
    """The keying rule before floats were canonicalised (integral floats as ints, nothing else changed)."""
    def canon(o):
        if isinstance(o, dict):
            return {str(k): canon(v) for k, v in sorted(o.items(), key=lambda kv: str(kv[0]))}
        if isinstance(o, (list, tuple)):
            return [canon(v) for v in o]
        if isinstance(o, float) and o.is_integer():
            return int(o) if abs(o) < 2**53 else o
        return o

    text = json.dumps(canon(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_exact_numbers_keep_the_keys_existing_stores_hold():
    assert config_key(D) == "b5e922fb18a9a3ca" == _key_before(D)  # computed by gac before this rule
    for ratio in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.125, 0.333333333333, 1e-05, 2048.0, 7, 0.123456789012):
        d = {**D, "ratio": ratio}
        assert config_key(d) == _key_before(d), ratio


def test_ratios_equal_up_to_float_drift_are_one_point():
    drifted = 0.1 + 0.2  # 0.30000000000000004, what range(0.1, 0.5, 0.1) gives
    assert drifted != 0.3 and canonical_number(drifted) == 0.3
    assert config_key({**D, "ratio": drifted}) == config_key({**D, "ratio": 0.3})
    assert config_key({**D, "opts": [0.1 * i for i in range(1, 10)]}) == config_key(D)
    assert canonical_number(2.0000000000000004) == 2 and canonical_number(float("nan")) != canonical_number(1.0)
    assert config_key({**D, "ratio": 0.3 + 1e-9}) != config_key({**D, "ratio": 0.3})  # a real difference stays one


def test_a_swept_range_gives_one_point_per_ratio():
    from gac.jobs.sweep.points import sweep_points

    pts = sweep_points(["ratio=0.3,0.30000000000000004"]) + sweep_points(["ratio=range(0.1,0.5,0.1)"])
    keys = [p["key"] for p in pts]
    assert pts[4]["overrides"] == ["ratio=0.30000000000000004"]  # what Hydra's range gives
    assert [p["spec"].ratio for p in pts] == [0.3, 0.3, 0.1, 0.2, 0.3, 0.4]
    assert keys[0] == keys[1] == keys[4] and len(set(keys)) == 4


def test_an_event_log_with_bytes_that_are_not_utf8_does_not_stop_status(tmp_path):
    from gac.launch.status import point_state

    store = ResultsStore(tmp_path)
    store.prepare_for_writing()
    (tmp_path / "runs").mkdir()
    started = json.dumps({"event": "started", "host": "n1", "pid": 1, "time": "t"}).encode()
    (tmp_path / "runs" / "k.jsonl").write_bytes(b'{"event": "stage", "host": "\xff\xfe"}\n' + started + b"\n\x80\x81")
    st = point_state(store, "k")
    assert st["state"] == "interrupted" and "started on n1" in st["detail"]


def test_every_reader_refuses_a_record_the_job_did_not_write(tmp_path):
    store = ResultsStore(tmp_path)
    good = {"schema": 1, "key": "k1", "status": "completed", "created": "2025-01-01T00:00:00Z",
            "job": {"model": "tiny", "compressor": "none", "strategy": "baseline", "ratio": None, "unit": None,
                    "seq_len": 1024}, "metrics": {"ppl_tiny": 200.0, "piqa_acc": 0.7, "prefill_ms": 3.0}}
    assert record_problem(good, "k1") is None
    store.records_dir.mkdir(parents=True)
    (store.records_dir / "k1.json").write_text(json.dumps(good))
    (store.records_dir / "k2.json").write_text(json.dumps(good))  # the same record under another key
    assert store.status("k1") == "done" and store.status("k2") == "corrupt"
    with pytest.raises(CorruptRecord, match="its file name says 'k2'.*move it aside"):
        list(store.iter_records())
    with pytest.raises(CorruptRecord, match="its file name says 'k2'"):
        store.read_record("k2")
    for bad, why in [({"metrics": {"piqa_acc": 1.2}}, "an accuracy"), ({"metrics": {"ppl_tiny": 1.0}}, "perplexity"),
                     ({"metrics": {"prefill_ms": 0}}, "latency"), ({"metrics": []}, "metrics"),
                     ({"timings": {"total_s": -1}}, "seconds"), ({"aligned_fraction": 2}, "aligned_fraction"),
                     ({"params": 1.5}, "params"), ({"created": None}, "created"), ({"schema": 2}, "schema")]:
        assert why in record_problem({**good, **bad}, "k1"), bad


def _fill(directory) -> None:
    with open(directory / "filler", "ab") as f:
        try:
            while True:
                f.write(b"\0" * 16384)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass


@pytest.mark.parametrize("stage_left", [True, False])
def test_a_full_disk_is_recorded_as_disk_full(fs_1m, tmp_path, monkeypatch, stage_left):
    """The disk fills up while the job runs (after loading the model). With a stage still to write, the attempt ends
    "failed" with the disk-full error, in attempts.json and a failure record (room from the job's reserve), and
    status says so; with only the record left to write, the reserve lets the record itself through."""
    from omegaconf import OmegaConf

    import gac.jobs.run.loading as loading
    from gac.jobs.config.command_line import compose_config
    from gac.jobs.config.build import spec_from_config
    from gac.jobs.run.recipe import run_config
    from gac.launch.status import point_state

    eval_ = ["eval.tasks=[]", "eval.latency=false", "eval.ppl_max_windows=1", "eval.ppl_seq_len=32"]
    cfg = OmegaConf.to_container(compose_config(["compressor=none", f"results_dir={fs_1m / 'r'}",
                                                 *(eval_ if stage_left else ["eval=none"])]), resolve=True)
    real = loading.load_job_model

    def load_then_fill(spec, **kw):
        got = real(spec, **kw)
        _fill(fs_1m)
        return got

    monkeypatch.setattr(loading, "load_job_model", load_then_fill)
    store = ResultsStore(fs_1m / "r")
    key = spec_from_config(cfg).key
    if not stage_left:
        rec = run_config(cfg)
        assert store.status(key) == "done" and rec["attempts"][-1]["outcome"] == "completed"
        return
    with pytest.raises(GacError, match="the disk is full") as e:
        run_config(cfg)
    assert "\n" not in str(e.value)
    attempts = json.loads((fs_1m / "r" / "work" / key / "attempts.json").read_text())["attempts"]
    assert attempts[-1]["outcome"] == "failed" and "disk is full" in attempts[-1]["error"]
    (failure,) = store.failure_paths(key)
    assert "disk is full" in json.loads(failure.read_text())["error"]
    st = point_state(store, key)
    assert st["state"] == "failed" and "disk is full" in st["detail"]
    assert not [p for p in (fs_1m / "r").rglob(".*.tmp")]  # the reserve was given back
