"""On a CUDA GPU: the node report, each estimate gac makes against what this node measures (gac.jobs.doctor.report).

Jobs run through the real pipeline on tiny (ASVD with its sensitivity search, LLM-Pruner with its gradient pass;
with two GPUs, one spread over both), and the report is written to ``$GAC_NODE_REPORT`` (default:
``gpu-node-report-<time>.json`` in the directory pytest runs in): the memory estimate against each device's
measured peak, the sensitivity search's estimated time against its real time, the lm-eval items, the GPUs seen,
with the node and the versions. Keep the file with the run (docs/estimates-vs-measured.md says what to send).
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BASE = ["model=tiny", "gpu=auto", "gpu.profile=none", "eval=quick", "eval.ppl_max_windows=4", "eval.ppl_seq_len=128",
        "eval.limit=20", "calibration.n_samples=4", "calibration.seq_len=128", "seq_len=128",
        "eval.latency_seq_lens=[128]"]


def _run(tmp_path, *extra):
    from omegaconf import OmegaConf

    from gac.jobs.config.command_line import compose_config
    from gac.jobs.run.recipe import run_config

    rec = run_config(OmegaConf.to_container(compose_config([*BASE, f"results_dir={tmp_path / 'r'}", *extra]),
                                            resolve=True))
    assert rec["status"] == "completed", rec.get("error")
    return rec


def test_the_gpu_tier_writes_the_node_report(tmp_path, measured):
    from gac.jobs.doctor.report import REPORT_ENV, write_node_report
    from gac.machine import file_stamp

    records = [_run(tmp_path, "compressor=asvd", "compressor.options.sensitivity_grid=[0.5,0.9]"),
               _run(tmp_path, "compressor=llm_pruner", "ratio=0.3")]
    if torch.cuda.device_count() >= 2:
        from tests.gpu.test_placement_gpu import _first_gpu_limit

        records.append(_run(tmp_path, "compressor=llm_pruner", "ratio=0.3", "eval.tasks=[]",
                            "model.device_map=auto", f"+model.max_memory.0={_first_gpu_limit()}",
                            "+model.max_memory.1=1GiB"))
    path = os.environ.get(REPORT_ENV) or f"gpu-node-report-{file_stamp()}.json"
    report = write_node_report(path, records, "gpu tier")
    print(f"node report: {os.path.abspath(path)}")
    assert report["node"]["device_count"] == torch.cuda.device_count() and report["node"]["gpus"][0]["name"]
    rows = report["estimates"]
    for rec in records:
        peaks = rec["memory"]["gpu_peaks_mb"]
        assert set(peaks) == {f"cuda:{i}" for i in range(torch.cuda.device_count())}  # every device metered
        assert peaks[rec["memory"]["device"] if ":" in rec["memory"]["device"] else "cuda:0"] > 0
    mem = [r for r in rows if r["what"] == "memory" and r["estimate"] is not None]
    assert len(mem) == len(records)
    for r in mem:
        measured(f"memory_ratio_{r['job']}", r["ratio"])
        # the memory check lets a job start only below its estimate: a peak above it is an OOM it let through
        assert 0 < r["ratio"] <= 1.0, r
    (sens,) = [r for r in rows if r["what"] == "sensitivity time"]
    measured("sensitivity_time_ratio", sens["ratio"])
    assert sens["estimate"] > 0 and sens["measured"] > 0
    assert all(r["ratio"] == 1.0 for r in rows if r["what"] == "lm-eval items")
    if len(records) == 3:  # the spread job: both devices held some of it
        spread = records[2]["memory"]["gpu_peaks_mb"]
        assert spread["cuda:0"] > 0 and spread["cuda:1"] > 0
