"""Where a job's record came from: gac, git and package versions (:func:`gac.evaluation.report.provenance`), the
job's seed and device, and the Slurm ids of the allocation it ran in."""

from __future__ import annotations

import os
import time

from gac.jobs.spec import JobSpec

SLURM_IDS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT")


def slurm_ids() -> dict:
    """``{"slurm_job_id": ..., ...}`` of this process (None outside Slurm)."""
    return {name.lower(): os.environ.get(name) for name in SLURM_IDS}


def job_provenance(spec: JobSpec) -> dict:
    """The record's ``provenance`` block."""
    from gac.evaluation.report import provenance

    p = provenance(device=spec.device)
    p["seed"] = spec.seed
    p.update(slurm_ids())
    try:
        import torch

        if spec.device.startswith("cuda") and torch.cuda.is_available():
            p["device_name"] = torch.cuda.get_device_name(torch.device(spec.device))  # the job's GPU, not cuda:0
    except Exception:  # provenance must never fail a job
        pass
    return p


def safe_provenance(spec: JobSpec) -> dict:
    """:func:`job_provenance`, or the error that prevented it (a failure record must never fail itself)."""
    try:
        return job_provenance(spec)
    except Exception as e:  # never mask the job's own error
        return {"error": str(e)}


def attempt_info() -> dict:
    """Who runs this attempt: host, pid, Slurm ids and the start time."""
    return {"host": os.uname().nodename, "pid": os.getpid(), **slurm_ids(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
