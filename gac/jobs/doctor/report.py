"""What a node measured against what gac estimated: one machine-readable report (JSON) per run of the gpu tier or
the canary, so the first GPU node that runs them turns each estimate into a measured ratio.

Each row of ``estimates`` is one estimate gac makes and what the node measured for it, from the jobs' records:

=====================  ==========================================================================================
``what``               estimate -> measured
=====================  ==========================================================================================
``memory``             the memory check's estimate before loading (``memory.estimate``) -> the job's peak: on a GPU
                       the peak of each device (``memory.gpu_peaks_mb``; a model spread over devices: their sum,
                       each device also on its own row, measured only), on the CPU the host's peak RSS above
                       what the process held before loading
``host memory``        the estimate's host share -> the host's peak RSS (GPU jobs)
``sensitivity time``   the sensitivity search's estimate before it ran -> its real time (``timings``)
``model shards``       the shards the hub cache's index names -> those there (with the load time)
``lm-eval items``      each task's items asked for (``eval.limit``) -> items scored, with where its data came from
``device count``       the GPUs the Slurm allocation gave (``SLURM_GPUS_ON_NODE``) or the placement used -> the GPUs
                       the job saw
=====================  ==========================================================================================

``ratio`` is measured / estimate (None where either is missing). The report also holds the node (host, CPUs,
memory, each GPU's name and memory, CUDA) and the versions (gac, git, torch, transformers, lm-eval, datasets).
:func:`node_report` builds it; :func:`write_node_report` writes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

REPORT_SCHEMA = 1
#: where the gpu tier writes its report (default: gpu-node-report.json in the directory pytest runs in)
REPORT_ENV = "GAC_NODE_REPORT"


def _ratio(measured, estimate) -> float | None:
    try:
        return round(float(measured) / float(estimate), 4) if measured is not None and estimate else None
    except (TypeError, ValueError):
        return None


def _row(what: str, record: Mapping | None, estimate, measured, unit: str, **extra) -> dict:
    job = (record or {}).get("job") or {}
    return {"what": what, "point": (record or {}).get("key"),
            "job": "/".join(str(job.get(k)) for k in ("model", "compressor", "strategy") if job.get(k) is not None),
            "estimate": estimate, "measured": measured, "unit": unit, "ratio": _ratio(measured, estimate), **extra}


def host_peak(mem: Mapping) -> tuple[float | None, str]:
    """The job's host peak as an estimate counts it: its peak RSS above what the process held before it loaded the
    model (the Python process, torch and transformers are in no estimate), with a note; the raw peak where the
    record has no load stage."""
    peak = mem.get("peak_rss_mb")
    before = ((mem.get("stages") or {}).get("load") or {}).get("start_rss_mb")
    if peak is None or before is None:
        return peak, "the host's peak RSS, the process's own (Python, torch, lm-eval) included"
    return round(peak - before, 1), (f"the host's peak RSS above the {before:.0f} MiB held before loading (raw "
                                     f"{peak:.0f})")


def memory_rows(record: Mapping) -> list[dict]:
    """The memory estimate against the peaks the record measured (module docstring)."""
    mem = record.get("memory") or {}
    est = mem.get("estimate") or {}
    host, note = host_peak(mem)
    rows = []
    peaks = mem.get("gpu_peaks_mb") or {}
    if peaks:
        own = [d for d in peaks if d == mem.get("device")] or list(peaks)[:1]
        used = {d: v for d, v in peaks.items() if v > 0}
        if mem.get("placement"):  # spread: the estimate is for all devices together
            rows.append(_row("memory", record, est.get("device_mb"), round(sum(used.values()), 1), "MiB",
                             device="+".join(sorted(used)) or "none", note="a model spread over devices: the sum "
                             "of their peaks against the estimate for all of them"))
        else:
            rows.append(_row("memory", record, est.get("device_mb"), peaks[own[0]], "MiB", device=own[0]))
        for d, v in peaks.items():
            if mem.get("placement") or d not in own:
                rows.append(_row("memory", record, None, v, "MiB", device=d, note="this device's own peak"))
        rows.append(_row("host memory", record, est.get("host_mb"), host, "MiB", device="host", note=note))
    else:
        rows.append(_row("memory", record, est.get("device_mb"), host, "MiB", device="host", note=note))
    return rows


def sensitivity_rows(record: Mapping) -> list[dict]:
    t = record.get("timings") or {}
    if "sensitivity_s" not in t:
        return []
    return [_row("sensitivity time", record, t.get("sensitivity_estimate_s"), t["sensitivity_s"], "s")]


def shard_rows(record: Mapping) -> list[dict]:
    """The model's shards in the hub cache against its index (hub models only)."""
    from gac.jobs.run.inputs import cached_shards, is_hub_model

    spec = ((record.get("config") or {}).get("model") or {}).get("spec")
    load_s = (record.get("timings") or {}).get("load_s")
    if not spec or not is_hub_model(spec):
        return [_row("model shards", record, None, None, "files", model=spec, load_s=load_s,
                     note="not a hub model (a gac fixture or a local directory): no hub cache read")]
    got = cached_shards(str(spec))
    if got is None:
        return [_row("model shards", record, None, 0, "files", model=spec, load_s=load_s,
                     note="not in this node's hub cache (HF_HUB_CACHE)")]
    named, here = got
    return [_row("model shards", record, len(named), len(here), "files", model=spec, load_s=load_s)]


def task_rows(record: Mapping) -> list[dict]:
    tasks = (record.get("evaluation") or {}).get("tasks") or {}
    limit = (((record.get("config") or {}).get("eval") or {}).get("limit"))
    return [_row("lm-eval items", record, t.get("limit", limit), t.get("n"), "items", task=name,
                 source=t.get("source")) for name, t in sorted(tasks.items()) if isinstance(t, Mapping)]


def device_rows(record: Mapping) -> list[dict]:
    prov = record.get("provenance") or {}
    mem = record.get("memory") or {}
    if mem.get("placement"):
        asked, why = len([d for d in mem["placement"] if str(d).startswith("cuda")]), "the placement's GPUs"
    else:
        env = os.environ.get("SLURM_GPUS_ON_NODE")
        given = prov.get("slurm_gpus_on_node") or env
        asked = int(given) if str(given or "").isdigit() else None
        why = "the Slurm allocation's GPUs" if asked is not None else "not known (no Slurm allocation, no placement)"
    seen = prov.get("cuda_device_count", 0 if not str(prov.get("device") or "").startswith("cuda") else None)
    return [_row("device count", record, asked, seen, "GPUs", note=why)]


def estimate_rows(records: Iterable[Mapping]) -> list[dict]:
    """Every estimate-vs-measured row of ``records`` (completed job records)."""
    rows = []
    for r in records:
        for part in (memory_rows, sensitivity_rows, shard_rows, task_rows, device_rows):
            rows += part(r)
    return rows


def node_info() -> dict:
    """The node this runs on: host, CPUs, host memory, each visible GPU (name, memory, compute capability), CUDA."""
    from gac.compression.resources import MB, device_memory
    from gac.machine import hostname

    info = {"hostname": hostname(), "cpus": os.cpu_count(), "host_memory_mb": device_memory("cpu")["total_mb"],
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "gpus": []}
    try:
        import torch

        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                info["gpus"].append({"index": i, "name": p.name, "total_mb": round(p.total_memory / MB, 1),
                                     "capability": f"{p.major}.{p.minor}"})
    except Exception as e:  # noqa: BLE001 - a report must be written even where CUDA cannot be asked
        info["gpu_error"] = f"{type(e).__name__}: {e}"
    info["device_count"] = len(info["gpus"])
    return info


def nodes_of(records: Iterable[Mapping]) -> list[dict]:
    """The nodes the ``records`` ran on, as their provenance says (host, device, GPU name, GPUs seen, Slurm job): the
    node of a job that ran elsewhere (a Slurm sweep seen from the login node)."""
    out = []
    for r in records:
        p = r.get("provenance") or {}
        n = {k: p.get(k) for k in ("hostname", "device", "device_name", "cuda_device_count", "slurm_gpus_on_node",
                                   "slurm_job_id")}
        if n not in out:
            out.append(n)
    return out


def node_report(records: Iterable[Mapping], source: str, extra: Mapping | None = None,
                node: Mapping | None = None) -> dict:
    """The report of ``records``; ``source``: what ran them (``gpu tier``, ``canary``); ``node``: where they ran
    (default: this node, :func:`node_info`; the canary passes what the records say, :func:`nodes_of`)."""
    from gac.machine import utc_stamp
    from gac.provenance import provenance

    prov = provenance()
    records = list(records)
    return {"schema": REPORT_SCHEMA, "kind": "gac-node-report", "source": source, "created": utc_stamp(),
            "node": dict(node) if node is not None else node_info(),
            "versions": {"gac": prov["gac_version"], "git_commit": prov["git_commit"], "git_dirty": prov["git_dirty"],
                         "python": prov["python"], **prov["packages"]},
            "points": [r.get("key") for r in records], "estimates": estimate_rows(records), **(extra or {})}


def write_node_report(path: str | os.PathLike, records: Iterable[Mapping], source: str,
                      extra: Mapping | None = None, node: Mapping | None = None) -> dict:
    """:func:`node_report`, written to ``path`` (atomically; an existing file is refused); returns it."""
    from gac.io import write_json_atomic

    report = node_report(records, source, extra, node)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(path), report)  # never over an earlier report
    return report
