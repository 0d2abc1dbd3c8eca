"""Loading the results store (and W&B exports) into the tidy frame."""

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from gac.analysis import (
    load_results,
    metric_columns,
    parse_seq_metric,
    parse_target,
    plan_dims,
    records_from_wandb,
)
from gac.errors import GacError
from tests.analysis.conftest import STORE


def test_one_row_per_completed_record(df):
    assert len(df) == 15  # 14 records + 1 forced re-run; the failure is left out
    assert (df["status"] == "completed").all()
    base = df[df["strategy"] == "baseline"].iloc[0]
    assert base["compressor"] == "none" and base["model"] == "tiny" and base["gpu"] == "a100"
    assert base["ppl_wikitext2"] == 20.0 and base["prefill_ms@b4_1024"] == 400.0
    assert base["dims"] is None and math.isnan(base["n_targets"])
    one = df[df["key"] == "a015000000000000"].iloc[0]
    assert one["ratio"] == 0.15 and one["proxy"] == "activation" and one["n_targets"] == 10
    assert one["aligned_fraction"] == pytest.approx(0.1) and one["aligned_16"] == pytest.approx(0.1)
    assert one["dims"]["model.layers.0.self_attn.q_proj"] == 117
    assert one["time_compress"] == 1.5 and one["gac_version"] == "0.1.0"
    # a metric a record did not run is NaN, not absent
    assert math.isnan(df[df["key"] == "a015000000000002"].iloc[0]["piqa_acc"])


def test_failures_on_request():
    df = load_results(STORE, include_failures=True)
    assert len(df) == 16 and (df["status"] == "failed").sum() == 1


def test_bad_stores(tmp_path):
    with pytest.raises(GacError, match="does not exist"):
        load_results(tmp_path / "nope")
    (tmp_path / "empty" / "records").mkdir(parents=True)
    with pytest.raises(GacError, match="no result records"):
        load_results(tmp_path / "empty")
    assert load_results(tmp_path / "empty", allow_empty=True).empty


_OK = {"key": "zzzz", "status": "completed", "created": "2025-01-01T00:00:00Z"}


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    (json.dumps({**_OK, "schema": 1}), "no 'job'"),
    (json.dumps({**_OK, "job": {"model": "tiny", "compressor": "asvd"}}), "job.strategy None, not a name"),
    (json.dumps({**_OK, "schema": 2, "job": {}}), "schema 2"),
    (json.dumps({**_OK, "job": {"model": "m", "compressor": "c", "strategy": "s"}, "metrics": {"ppl": "high"}}),
     "'high', not a number"),
    (json.dumps({**_OK, "key": "k", "job": {"model": "m", "compressor": "c", "strategy": "s"}, "metrics": {}}),
     "its file name says 'zzzz'"),
])
def test_corrupt_record_names_the_file(store_copy, text, match):
    (store_copy / "records" / "zzzz.json").write_text(text)
    with pytest.raises(GacError, match=match) as e:
        load_results(store_copy)
    assert "zzzz.json" in str(e.value) and "move it aside" in str(e.value)


def test_parsers():
    assert parse_seq_metric("prefill_ms@128") == ("prefill_ms", 1, 128)
    assert parse_seq_metric("prefill_ms@b4_1024") == ("prefill_ms", 4, 1024)
    assert parse_seq_metric("prefill_ms") is None
    assert parse_target("model.layers.3.self_attn.k_proj.group0") == (3, "k_proj", 0)
    assert parse_target("model.layers.3.mlp") == (3, "mlp", None)
    assert parse_target("model.layers.12.self_attn.q_proj") == (12, "q_proj", None)


def test_plan_dims(df):
    dims = plan_dims(df[df["key"] == "p015000000000000"])
    assert list(dims["target"]) == [f"model.layers.{i}.mlp" for i in range(4)]
    assert list(dims["dim"]) == [1003, 1024, 992, 1016]
    assert list(dims["aligned"]) == [False, True, True, True]
    assert list(dims["kind"]) == ["mlp"] * 4


def _runs(df):
    """Fake W&B API runs built from the fixture records (config nested, summary flat with metrics/ prefix)."""
    runs = []
    for rec in df.to_dict("records"):
        job = {f: rec[f] for f in ("model", "compressor", "proxy", "strategy", "ratio", "unit", "gpu", "seq_len")}
        summary = {"aligned_fraction": rec["aligned_fraction"], "_runtime": 3.0, "_step": 1}
        for m in ("ppl_wikitext2", "piqa_acc", "prefill_ms", "prefill_ms@128"):
            if not pd.isna(rec.get(m)):
                summary[f"metrics/{m}"] = rec[m]
        runs.append(SimpleNamespace(config={"job": job, "key": rec["key"], "lr": 0.1}, summary=summary,
                                    name=rec["key"], group="fixture", id=rec["key"][:8], state="finished",
                                    created_at=rec["created"]))
    return runs


def test_wandb_runs_and_csv_export_match_the_store(df, tmp_path):
    w = records_from_wandb(_runs(df))
    cols = ["key", "model", "compressor", "strategy", "ratio", "aligned_fraction", "ppl_wikitext2", "piqa_acc",
            "prefill_ms", "prefill_ms@128"]
    pd.testing.assert_frame_equal(w[cols].reset_index(drop=True), df[cols].reset_index(drop=True), check_dtype=False)
    assert "lr" not in w.columns and "_runtime" not in w.columns
    # the W&B UI's CSV export: config and summary side by side, dotted config keys
    rows = []
    for r in _runs(df):
        row = {"Name": r.name, "State": r.state, "Created": r.created_at, "key": r.config["key"], "lr": 0.1}
        row.update({f"job.{k}": v for k, v in r.config["job"].items()})
        row.update({k.split("/", 1)[1]: v for k, v in r.summary.items() if k.startswith("metrics/")})
        row["aligned_fraction"] = r.summary["aligned_fraction"]
        rows.append(row)
    csv = tmp_path / "export.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    c = records_from_wandb(csv)
    pd.testing.assert_frame_equal(c[cols].reset_index(drop=True), df[cols].reset_index(drop=True), check_dtype=False)
    assert "lr" not in c.columns


def test_wandb_run_without_job_fields():
    with pytest.raises(GacError, match="no model, compressor, strategy"):
        records_from_wandb([SimpleNamespace(config={"lr": 1}, summary={}, name="r1", group=None)])
    with pytest.raises(GacError, match="does not exist"):
        records_from_wandb("/nonexistent/export.csv")


def test_task_data_column_from_records_and_wandb(tmp_path):
    """``task_data`` says what the task metrics were scored on, from ``model.task_files`` in a record's or a W&B
    run's config (issue 30): a look-alike set by name, ``hub`` for null, ``files`` for a mapping, None unknown."""
    from gac.analysis.load import row_task_data
    from tests.analysis.conftest import FIXTURES

    assert set(load_results(FIXTURES / "store_mixed")["task_data"]) == {"tiny"}  # run.py model=tiny records it
    job = {"model": "tiny", "compressor": "none", "strategy": "baseline"}
    configs = {"a": {"model": {"task_files": "enwiki"}}, "b": {"model": {"task_files": None}},
               "c": {"model": {"task_files": {"piqa": "/d/piqa.jsonl"}}}, "d": {"model": {"name": "x"}},
               "e": {"model": {"task_files": "auto"}}}
    runs = [SimpleNamespace(config={"job": job, **cfg}, summary={"metrics/piqa_acc": 0.5}, name=k, id=k)
            for k, cfg in configs.items()]
    w = records_from_wandb(runs).set_index("key")
    known = {k: v for k, v in w["task_data"].items() if isinstance(v, str)}  # unknown: None/NaN, never a name
    assert known == {"a": "enwiki", "b": "hub", "c": "files"} and row_task_data(w.loc["d"]) is None
    assert row_task_data(w.loc["c"], "piqa") == "files" and row_task_data(w.loc["c"], "hellaswag") == "hub"
    csv = tmp_path / "export.csv"  # the W&B UI's export: dotted config columns
    pd.DataFrame([{"Name": "r", "job.model": "tiny", "job.compressor": "none", "job.strategy": "baseline",
                   "model.task_files": "tiny", "piqa_acc": 0.5}]).to_csv(csv, index=False)
    assert list(records_from_wandb(csv)["task_data"]) == ["tiny"]
    assert "task_data" not in metric_columns(w)


def test_gpu_auto_is_named_by_the_device_the_job_ran_on_and_allocation_by_the_recipe():
    from gac.analysis.load import records_to_frame

    def rec(key, gpu, device_name=None, allocation=None):
        r = {"key": key, "job": {"model": "m", "compressor": "asvd", "strategy": "gac", "gpu": gpu},
             "provenance": {"device": "cuda:0"}, "metrics": {}}
        if device_name:
            r["provenance"]["device_name"] = device_name
        if allocation:
            r["compression"] = {"recipe": {"allocation": allocation}}
        return r

    df = records_to_frame([rec("a", "auto", "NVIDIA H100 80GB HBM3", "sensitivity"), rec("b", "auto", "NVIDIA L40S"),
                           rec("c", "a100", "NVIDIA A100-SXM4-80GB"), rec("d", "auto")]).set_index("key")
    assert df["gpu"].to_dict() == {"a": "h100", "b": "NVIDIA L40S", "c": "a100", "d": "auto"}
    assert df.loc["a", "allocation"] == "sensitivity" and pd.isna(df.loc["b", "allocation"])
    assert "allocation" not in metric_columns(df.reset_index())
