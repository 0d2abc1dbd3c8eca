"""The node report: each estimate gac makes against what a node measured, from job records (a CPU record as a job
writes it here, a two-GPU record as a spread job writes it; the node this test runs on)."""

from __future__ import annotations

import json

import pytest

from gac.errors import GacError
from gac.jobs.doctor.report import estimate_rows, node_info, node_report, nodes_of, write_node_report


def _record(**over):
    rec = {
        "key": "k1", "job": {"model": "tiny", "compressor": "asvd", "strategy": "gac"},
        "config": {"model": {"spec": "tiny"}, "eval": {"limit": 20, "tasks": ["piqa", "hellaswag"]}},
        "timings": {"load_s": 0.2, "sensitivity_s": 12.0, "sensitivity_estimate_s": 8.0},
        "memory": {"device": "cpu", "peak_rss_mb": 660.0,
                   "estimate": {"device_mb": 80.0, "host_mb": 80.0, "weights_mb": 11.0, "dtype": "float32",
                                "params": 2899968}},
        "evaluation": {"tasks": {"piqa": {"n": 20, "limit": 20, "source": "gac/data/tiny/eval/piqa.jsonl"},
                                 "hellaswag": {"n": 17, "limit": 20, "source": "hellaswag.jsonl"}}},
        "provenance": {"hostname": "node1", "device": "cpu", "slurm_job_id": "12"},
    }
    rec.update(over)
    return rec


def _rows(rows, what):
    return [r for r in rows if r["what"] == what]


def test_a_cpu_record_gives_each_estimate_its_measured_value_and_ratio():
    rows = estimate_rows([_record()])
    (mem,) = _rows(rows, "memory")
    assert (mem["estimate"], mem["measured"], mem["ratio"], mem["device"]) == (80.0, 660.0, 8.25, "host")
    (sens,) = _rows(rows, "sensitivity time")
    assert (sens["estimate"], sens["measured"], sens["ratio"], sens["unit"]) == (8.0, 12.0, 1.5, "s")
    items = {r["task"]: r for r in _rows(rows, "lm-eval items")}
    assert items["piqa"]["ratio"] == 1.0 and items["hellaswag"]["ratio"] == 0.85
    assert items["piqa"]["source"].endswith("piqa.jsonl")
    (shards,) = _rows(rows, "model shards")
    assert shards["ratio"] is None and "not a hub model" in shards["note"] and shards["load_s"] == 0.2
    (dev,) = _rows(rows, "device count")
    assert dev["measured"] == 0 and dev["point"] == "k1" and dev["job"] == "tiny/asvd/gac"


def test_the_host_peak_counts_from_what_the_process_held_before_loading():
    rec = _record()
    rec["memory"]["stages"] = {"load": {"start_rss_mb": 400.0, "peak_rss_mb": 420.0}}
    (mem,) = _rows(estimate_rows([rec]), "memory")
    assert (mem["measured"], mem["ratio"]) == (260.0, 3.25) and "above the 400 MiB held before loading" in mem["note"]


def test_a_two_gpu_spread_record_compares_the_sum_and_lists_each_device():
    rec = _record(memory={"device": "cuda:0", "peak_rss_mb": 9000.0, "gpu_peak_mb": 30000.0,
                          "gpu_peaks_mb": {"cuda:0": 30000.0, "cuda:1": 45000.0},
                          "placement": {"cuda:0": {"units": 17}, "cuda:1": {"units": 18}},
                          "estimate": {"device_mb": 60000.0, "host_mb": 16000.0}},
                  provenance={"device": "cuda:0", "device_name": "NVIDIA H100", "cuda_device_count": 2})
    rows = estimate_rows([rec])
    mem = _rows(rows, "memory")
    assert mem[0]["measured"] == 75000.0 and mem[0]["ratio"] == 1.25 and mem[0]["device"] == "cuda:0+cuda:1"
    assert {r["device"]: r["measured"] for r in mem[1:]} == {"cuda:0": 30000.0, "cuda:1": 45000.0}
    (host,) = _rows(rows, "host memory")
    assert host["ratio"] == round(9000 / 16000, 4)
    (dev,) = _rows(rows, "device count")
    assert (dev["estimate"], dev["measured"], dev["ratio"]) == (2, 2, 1.0)


def test_a_one_gpu_record_compares_its_own_device_and_the_allocation(monkeypatch):
    rec = _record(memory={"device": "cuda:0", "peak_rss_mb": 3000.0, "gpu_peaks_mb": {"cuda:0": 20000.0,
                                                                                     "cuda:1": 0.0},
                          "estimate": {"device_mb": 16000.0, "host_mb": 2000.0}},
                  provenance={"device": "cuda:0", "cuda_device_count": 1, "slurm_gpus_on_node": "2"})
    rows = estimate_rows([rec])
    mem = _rows(rows, "memory")
    assert (mem[0]["device"], mem[0]["ratio"]) == ("cuda:0", 1.25)
    assert [(r["device"], r["estimate"]) for r in mem[1:]] == [("cuda:1", None)]
    (dev,) = _rows(rows, "device count")
    assert (dev["estimate"], dev["measured"], dev["ratio"]) == (2, 1, 0.5)  # asked two, saw one: said


def test_shards_of_a_hub_model_are_counted_in_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = tmp_path / "hub" / "models--acme--llm-8b" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc")
    (snap / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (snap / "model-00001-of-00002.safetensors").write_bytes(b"x" * 10)
    (shards,) = _rows(estimate_rows([_record(config={"model": {"spec": "acme/llm-8b"}})]), "model shards")
    assert (shards["estimate"], shards["measured"], shards["ratio"]) == (2, 1, 0.5)
    (gone,) = _rows(estimate_rows([_record(config={"model": {"spec": "acme/other"}})]), "model shards")
    assert gone["measured"] == 0 and "not in this node's hub cache" in gone["note"]


def test_the_report_names_this_node_and_is_written_once(tmp_path):
    info = node_info()  # the real path on this machine
    assert info["cpus"] >= 1 and info["host_memory_mb"] > 0 and info["device_count"] == len(info["gpus"])
    report = node_report([_record()], "gpu tier")
    assert report["kind"] == "gac-node-report" and report["source"] == "gpu tier" and report["points"] == ["k1"]
    assert {"gac", "torch", "transformers", "lm_eval", "datasets"} <= set(report["versions"])
    assert report["node"]["hostname"] == info["hostname"]
    path = tmp_path / "r" / "node.json"
    write_node_report(path, [_record()], "canary", node={"nodes": nodes_of([_record()])})
    back = json.loads(path.read_text())
    assert back["node"] == {"nodes": [{"hostname": "node1", "device": "cpu", "device_name": None,
                                       "cuda_device_count": None, "slurm_gpus_on_node": None,
                                       "slurm_job_id": "12"}]}
    with pytest.raises(GacError):  # never over an earlier report
        write_node_report(path, [], "canary")
    assert json.loads(path.read_text()) == back
