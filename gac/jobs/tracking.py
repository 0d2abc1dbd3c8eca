"""Run loggers: a disk event log that is always on, and Weights & Biases behind the same small interface.

A logger sees one job: ``start(key, spec, config)``, then ``log_record(record)`` or ``log_failure(error)``, then
``finish()``. W&B is imported only when asked for and is offline by default (runs are written under
``<results_dir>/wandb``; ``wandb sync`` uploads them later), so nothing leaves the machine unless the user asks.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Protocol

from gac.errors import GacError

log = logging.getLogger(__name__)


class RunLogger(Protocol):
    def start(self, key: str, spec, config: dict) -> None: ...
    def log_record(self, record: dict) -> None: ...
    def log_failure(self, error: str) -> None: ...
    def finish(self) -> None: ...


def append_event(results_dir: str | os.PathLike, key: str, kind: str, **kw) -> None:
    """Append one event to ``<results_dir>/runs/<key>.jsonl`` (one JSON object per line, appended in one write)."""
    d = Path(results_dir) / "runs"
    d.mkdir(parents=True, exist_ok=True)
    t = time.time()
    ev = {"event": kind, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)), "t": t,
          "host": os.uname().nodename, "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"), **kw}
    with open(d / f"{key}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(ev, default=str) + "\n")


class DiskLogger:
    """Appends job events to ``<results_dir>/runs/<key>.jsonl`` (started / stage / completed / failed, with the
    host, pid and Slurm job id), which ``gac launch status`` reads beside the job's lock."""

    def __init__(self, results_dir: str | os.PathLike):
        self.root = Path(results_dir)
        self.dir = self.root / "runs"
        self.path: Path | None = None
        self.key: str | None = None

    def _event(self, kind: str, **kw) -> None:
        if self.key is None:
            return
        append_event(self.root, self.key, kind, **kw)

    def start(self, key, spec, config) -> None:
        self.key = key
        self.path = self.dir / f"{key}.jsonl"
        self._event("started", job=spec.job_fields())

    def log_stage(self, stage: str) -> None:
        self._event("stage", stage=stage)

    def log_record(self, record) -> None:
        self._event("completed", metrics=record.get("metrics"), record=record.get("_path"))

    def log_failure(self, error) -> None:
        self._event("failed", error=error)

    def finish(self) -> None:
        self.path = None
        self.key = None


class WandbLogger:
    """One W&B run per job, grouped per sweep: config, metrics, the plan as a table, plan and profile artefacts."""

    def __init__(self, results_dir: str | os.PathLike, project: str = "gac", entity: str | None = None,
                 mode: str = "offline", tags=()):
        if mode not in ("offline", "online", "disabled"):
            raise GacError(f"logger.wandb.mode must be offline, online or disabled, got {mode!r}")
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise GacError("logger=wandb needs the wandb package: pip install wandb") from None
        self.dir = Path(results_dir)
        self.project, self.entity, self.mode, self.tags = project, entity, mode, list(tags or [])
        self.run = None
        self.failed = False

    def start(self, key, spec, config) -> None:
        import wandb

        self.failed = False
        self.dir.mkdir(parents=True, exist_ok=True)
        job = spec.job_fields()
        name = "-".join(str(x) for x in (job["model"], job["compressor"], job["strategy"],
                                         f"r{job['ratio']}" if job["ratio"] is not None else None, key[:6]) if x)
        self.run = wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, dir=str(self.dir),
            group=spec.sweep or spec.experiment, job_type=spec.experiment, name=name, id=None,
            config={**config, "key": key, "job": job}, tags=self.tags, reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log_record(self, record) -> None:
        import wandb

        if self.run is None:
            return
        metrics = {k: v for k, v in (record.get("metrics") or {}).items() if isinstance(v, (int, float))}
        summary = {"aligned_fraction": record.get("aligned_fraction"), "params": record.get("params"),
                   "budget": record.get("budget"), **{f"time/{k}": v for k, v in record.get("timings", {}).items()
                                                     if isinstance(v, (int, float)) and not isinstance(v, bool)}}
        self.run.log({**metrics, **{k: v for k, v in summary.items() if v is not None}})
        plan = record.get("plan")
        if plan:
            d_star = plan.get("d_star", {})
            table = wandb.Table(columns=["target", "d_star", "dim", "aligned"])
            for name, d in plan["dims"].items():
                table.add_data(name, d_star.get(name), d, d % plan["unit"] == 0)
            self.run.log({"plan": table})
            art = wandb.Artifact(f"plan-{record['key']}", type="plan")
            with art.new_file("plan.json") as f:
                json.dump(plan, f, indent=1)
            if record.get("profile"):
                with art.new_file("profile_meta.json") as f:
                    json.dump(record["profile"], f, indent=1, default=str)
            self.run.log_artifact(art)

    def log_failure(self, error) -> None:
        self.failed = True
        if self.run is not None:
            self.run.summary["error"] = error

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if self.failed else 0)
            self.run = None


def build_loggers(results_dir: str | os.PathLike, wandb_cfg: dict | None) -> list:
    loggers: list = [DiskLogger(results_dir)]
    if wandb_cfg:
        loggers.append(WandbLogger(results_dir, project=wandb_cfg.get("project", "gac"),
                                   entity=wandb_cfg.get("entity"), mode=wandb_cfg.get("mode", "offline"),
                                   tags=wandb_cfg.get("tags") or ()))
    return loggers


def read_offline_run(run_dir: str | os.PathLike) -> dict:
    """History rows, summary and config of an OFFLINE W&B run directory (``.../wandb/offline-run-*``), read from
    its ``run-*.wandb`` log without syncing — for checks and for analysis on machines that never go online."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if not files:
        raise GacError(f"no run-*.wandb file in {run_dir}; is it an offline W&B run directory?")
    data = files[0].read_bytes()
    block, pos, chunks, buf = 32768, 7, [], b""  # 7-byte file header: ':W&B', magic, version
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            chunks.append(buf + chunk)
            buf = b""
    out: dict = {"history": [], "summary": {}, "config": {}}
    for c in chunks:
        r = pb.Record()
        r.ParseFromString(c)
        kind = r.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            out["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "config":
            out["config"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.config.update})
        elif kind == "run":  # the run record carries the initial config
            out["config"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                  for i in r.run.config.update})
    return out
