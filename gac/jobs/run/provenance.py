"""Where a job's record came from: gac, git and package versions (:func:`gac.provenance.provenance`), the
job's seed and device, and the Slurm ids of the allocation it ran in."""

from __future__ import annotations

import functools
import os

from gac.jobs.config.spec import JobSpec

SLURM_IDS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT")


def slurm_ids() -> dict:
    """``{"slurm_job_id": ..., ...}`` of this process (None outside Slurm)."""
    return {name.lower(): os.environ.get(name) for name in SLURM_IDS}


@functools.lru_cache(maxsize=1)
def checkout_at_start() -> tuple[str | None, bool | None]:
    """``(git_commit, git_dirty)`` of gac's checkout when this process started its first job (cached): the code a
    job runs is what the process imported then, not what the checkout holds when the record is written hours later."""
    from gac.provenance import checkout

    return checkout()


def job_provenance(spec: JobSpec) -> dict:
    """The record's ``provenance`` block. Its ``git_commit``/``git_dirty`` are the checkout's at the process's first
    job; when the checkout moved while the process ran, ``checkout_moved`` holds what it is at the record's writing
    (and a record written from a checkout edited meanwhile is marked dirty: its code is then not one commit's)."""
    from gac.provenance import provenance

    p = provenance(device=spec.device)
    start = checkout_at_start()
    now = (p["git_commit"], p["git_dirty"])
    if start[0] is not None and now != start:
        p["checkout_moved"] = {"git_commit": now[0], "git_dirty": now[1]}
        p["git_commit"], p["git_dirty"] = start[0], True
    p["seed"] = spec.seed
    p.update(slurm_ids())
    from gac.jobs.sweep.slurm_site import ENV_FILE_VAR

    if os.environ.get(ENV_FILE_VAR):  # a Slurm job that read its launch's environment file
        p["launch_env_file"] = os.environ[ENV_FILE_VAR]
    if os.environ.get("SLURM_GPUS_ON_NODE"):  # the GPUs its allocation gave (against those it sees)
        p["slurm_gpus_on_node"] = os.environ["SLURM_GPUS_ON_NODE"]
    try:
        import torch

        if spec.device.startswith("cuda") and torch.cuda.is_available():
            p["device_name"] = torch.cuda.get_device_name(torch.device(spec.device))  # the job's GPU, not cuda:0
            p["cuda_device_count"] = torch.cuda.device_count()  # the GPUs the job sees (its allocation's)
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
    from gac.machine import host, utc_stamp

    return {"host": host(), "pid": os.getpid(), **slurm_ids(), "started": utc_stamp()}
