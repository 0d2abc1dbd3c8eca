"""W&B runs as W&B users expect them: names from the point's overrides, tags, metric namespaces, and a backfill from
the store. The run contents are checked through the logger's calls into a recording stand-in for the wandb module
(W&B's offline format is private); the real wandb writes the offline run directories."""

import contextlib
import io
import json
import sys
import types
from pathlib import Path

import pytest

from gac.jobs.run.recipe import run_config
from gac.jobs.tracking.loggers import backfill_wandb, namespaced_metrics, run_name, run_tags

ROOT = Path(__file__).resolve().parents[2]


class _Run:
    def __init__(self, calls, **kw):
        self.kw, self.id, self.name = kw, kw.get("id") or f"fake{len(calls)}", kw.get("name")
        self.logged, self.summary, self.artifacts, self.exit_code = [], {}, [], None
        calls.append(self)

    def log(self, d):
        self.logged.append(d)

    def log_artifact(self, a):
        self.artifacts.append(a)

    def finish(self, exit_code=0):
        self.exit_code = exit_code


def _fake_wandb(monkeypatch) -> list:
    calls: list = []
    mod = types.ModuleType("wandb")
    mod.init = lambda **kw: _Run(calls, **kw)
    mod.Settings = lambda **kw: kw

    class Table:
        def __init__(self, columns):
            self.columns, self.rows = columns, []

        def add_data(self, *row):
            self.rows.append(row)

    class Artifact:
        def __init__(self, name, type):
            self.name, self.type, self.files = name, type, {}

        @contextlib.contextmanager
        def new_file(self, name):
            buf = io.StringIO()
            yield buf
            self.files[name] = buf.getvalue()

    mod.Table, mod.Artifact = Table, Artifact
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return calls


def test_run_name_carries_the_swept_overrides_not_the_plumbing():
    job = {"model": "tiny", "compressor": "asvd", "strategy": "gac", "ratio": 0.2}
    name = run_name(job, ["proxy=fisher", "align=gac", "results_dir=/x", "hydra.sweep.dir=/m",
                          "hydra/launcher=slurm_local", "experiment=proxy_compare", "+compressor.options.alpha=1"],
                    "abcdef0123456789")
    assert name == "proxy=fisher,align=gac,compressor.options.alpha=1 [abcdef]"
    assert run_name(job, [], "abcdef0123456789") == "tiny,asvd,gac,r0.2 [abcdef]"
    # the five proxy-comparison runs differ by more than a hash
    names = {run_name(job, [f"proxy={p}", "align=gac"]) for p in ("magnitude", "activation", "gradient", "fisher", "random")}
    assert len(names) == 5


def test_tags_and_metric_namespaces():
    job = {"experiment": "table5", "model": "tiny", "compressor": "asvd", "strategy": "gac", "gpu": "h100"}
    assert run_tags(job, ["mine"]) == ["experiment:table5", "model:tiny", "compressor:asvd", "strategy:gac",
                                       "gpu:h100", "mine"]
    rec = {"metrics": {"ppl_wikitext2": 9.5, "piqa_acc": 0.6, "prefill_ms": 3.0, "prefill_ms@64": 3.1,
                       "decode_ms_per_token": 1.0, "note": "x"},
           "aligned_fraction": 1.0, "params": 10, "budget": 11, "plan": {"aligned_by_unit": {"8": 1.0}},
           "timings": {"compress": 2.5, "flag": True}}
    assert namespaced_metrics(rec) == {
        "quality/ppl_wikitext2": 9.5, "quality/piqa_acc": 0.6, "latency/prefill_ms": 3.0, "latency/prefill_ms@64": 3.1,
        "latency/decode_ms_per_token": 1.0, "plan/aligned_fraction": 1.0, "plan/params": 10, "plan/budget": 11,
        "plan/aligned_by_unit/8": 1.0, "time/compress": 2.5}


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def backfill_cli(capsys, monkeypatch):
    from gac.cli import main

    monkeypatch.setenv("WANDB_SILENT", "true")

    def run(results, *args):
        capsys.readouterr()
        rc = main(["wandb", "backfill", str(results), *args])
        out = capsys.readouterr()
        return _Result(rc, out.out, out.err)

    return run


def test_live_run_then_backfill(make_cfg, tmp_path, monkeypatch, backfill_cli):
    # llm_pruner: the compressor is incidental here and prepares 10x faster than asvd on tiny
    monkeypatch.setenv("WANDB_SILENT", "true")
    results = tmp_path / "results"
    cfg = make_cfg("compressor=llm_pruner", "align=gac", "ratio=0.3", "eval.tasks=[]", "logger=wandb")
    assert cfg["logger"]["wandb"]["mode"] == "offline"
    rec = run_config(cfg, overrides=["compressor=llm_pruner", "align=gac", "ratio=0.3", f"results_dir={results}"])
    # the real wandb wrote one offline run; the store's event log names it and the record it logged
    events = [json.loads(x) for x in (results / "runs" / f"{rec['key']}.jsonl").read_text().splitlines()]
    wb = [e for e in events if e["event"] == "wandb"]
    assert len(wb) == 1 and wb[0]["created"] == rec["created"]
    assert wb[0]["run_name"] == f"compressor=llm_pruner,align=gac,ratio=0.3 [{rec['key'][:6]}]"
    runs = list((results / "wandb").glob("offline-run-*"))
    assert [r.name.rsplit("-", 1)[-1] for r in runs] == [wb[0]["run_id"]]

    # a skipped re-launch logs nothing; a backfill leaves the logged record alone
    again = run_config(cfg)
    assert again["skipped"]
    r = backfill_cli(results)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("has run") and len(list((results / "wandb").glob("offline-run-*"))) == 1

    # --force logs it again: the same name, tags, config and namespaced metrics a live job writes
    calls = _fake_wandb(monkeypatch)
    from gac.results import ResultsStore
    from gac.results.query import select_records

    recs = select_records(list(ResultsStore(results).iter_records()))
    rows = backfill_wandb(results, recs, force=True)
    assert [x["action"] for x in rows] == ["logged"] and len(calls) == 1
    run = calls[0]
    assert run.kw["name"] == wb[0]["run_name"] and run.kw["mode"] == "offline"
    assert run.kw["tags"] == ["experiment:default", "model:tiny", "compressor:llm_pruner", "strategy:gac", "gpu:cpu"]
    assert run.kw["config"]["key"] == rec["key"] and run.kw["config"]["job"]["compressor"] == "llm_pruner"
    logged = {k: v for d in run.logged for k, v in d.items()}
    assert logged["quality/ppl_tiny"] == pytest.approx(rec["metrics"]["ppl_tiny"])
    assert logged["plan/aligned_fraction"] == 1.0 and "latency/prefill_ms" in logged
    assert logged["plan/dims"].columns == ["target", "d_star", "dim", "aligned"] and logged["plan/dims"].rows
    assert run.summary["backfilled"] is True and run.exit_code == 0
    assert "plan.json" in run.artifacts[0].files


def test_backfill_of_disk_logger_records_and_filters(make_cfg, tmp_path, backfill_cli):
    results = tmp_path / "results"
    rec = run_config(make_cfg("compressor=llm_pruner", "align=unaligned", "ratio=0.3", "eval=none"))
    assert not (results / "wandb").exists()
    r = backfill_cli(results, "--where", "compressor=asvd")
    assert r.returncode == 2 and "no completed record matches compressor='asvd'" in r.stderr
    r = backfill_cli(results, "--dry-run")
    assert r.returncode == 0 and r.stdout.startswith(f"would log {rec['key']}")
    r = backfill_cli(results, "--where", "strategy=unaligned")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"logged    {rec['key']}  tiny,llm_pruner,unaligned,r0.3")
    assert len(list((results / "wandb").glob("offline-run-*"))) == 1
    r = backfill_cli(results)
    assert r.stdout.startswith("has run")
    assert backfill_cli(tmp_path / "nope").returncode == 2


def test_a_killed_backfill_is_resumed_under_its_recorded_run_id(tmp_path, monkeypatch):
    """The run id is recorded (wandb_open) before the run is opened; a backfill that never recorded the record as
    logged is resumed under that id, its half-written offline run replaced; an id that is not gac's is ignored."""
    from gac.jobs.tracking.loggers import append_event, opened_for_wandb

    calls = _fake_wandb(monkeypatch)
    res = tmp_path / "results"
    rec = {"key": "0123456789abcdef", "job": {"model": "tiny", "compressor": "asvd", "strategy": "gac", "ratio": 0.2},
           "created": "2026-01-01T00:00:00Z", "metrics": {"ppl_tiny": 3.0}, "_path": "records/0123456789abcdef.json"}
    other = {**rec, "key": "fedcba9876543210", "_path": "records/fedcba9876543210.json"}
    append_event(res, rec["key"], "wandb_open", run_id="abcd1234", created=rec["created"])  # then killed
    append_event(res, other["key"], "wandb_open", run_id="../../x*", created=other["created"])  # not an id gac chose
    partial = res / "wandb" / "offline-run-20260101_000000-abcd1234"
    (partial / "files").mkdir(parents=True)
    (res / "wandb" / "offline-run-20260101_000001-abcd1234").symlink_to(tmp_path)  # a link: never removed through
    assert opened_for_wandb(res, rec)["run_id"] == "abcd1234" and opened_for_wandb(res, other) is None
    assert [r["action"] for r in backfill_wandb(res, [rec, other], dry_run=True)] == ["would log", "would log"]

    rows = backfill_wandb(res, [rec, other])
    assert [(r["action"], r["run_id"]) for r in rows][0] == ("logged", "abcd1234")
    assert rows[1]["action"] == "logged" and rows[1]["run_id"] != "abcd1234" and len(rows[1]["run_id"]) == 8
    assert [c.kw["id"] for c in calls] == ["abcd1234", rows[1]["run_id"]]
    assert all(c.kw["resume"] == "allow" and c.logged for c in calls)
    assert not partial.exists() and (res / "wandb" / "offline-run-20260101_000001-abcd1234").is_symlink()
    assert not list((res / "wandb").glob(".*.tmp"))
    for r in (rec, other):
        events = [json.loads(x) for x in (res / "runs" / f"{r['key']}.jsonl").read_text().splitlines()]
        kinds = [e["event"] for e in events]
        assert kinds.count("wandb") == 1 and opened_for_wandb(res, r) is None
    assert kinds == ["wandb_open", "wandb_open", "wandb"]  # the planted line, then this backfill's own id
    assert not list((res / "locks").glob("*.lock"))  # each record's lock was released

    # logged once: a re-run leaves both alone, and so does a dry run
    again = backfill_wandb(res, [rec, other])
    assert [r["action"] for r in again] == ["has run", "has run"] and len(calls) == 2
    assert [r["action"] for r in backfill_wandb(res, [rec], dry_run=True)] == ["has run"]
    # a run W&B itself resumed (online) gets the summary again, never a second history row
    monkeypatch.setattr(_Run, "resumed", True, raising=False)
    append_event(res, rec["key"], "wandb_open", run_id="zzzz9999", created=rec["created"])
    (row,) = backfill_wandb(res, [rec])
    assert row["run_id"] == "zzzz9999" and calls[-1].logged == [] and calls[-1].summary["quality/ppl_tiny"] == 3.0
