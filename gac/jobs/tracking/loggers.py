"""Run loggers: a disk event log that is always on, and Weights & Biases behind the same small interface.

A logger sees one job: ``start(key, spec, config, overrides)``, then ``log_record(record)`` or ``log_failure(error)``, then
``finish()``. W&B is imported only when asked for and is offline by default (runs are written under
``<results_dir>/wandb``; ``wandb sync`` uploads them later), so nothing leaves the machine unless the user asks.
:func:`backfill_wandb` logs the store's records that no run has logged, one writer per record and idempotent across
a kill (see there).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import string
import time
from pathlib import Path

from gac.errors import GacError

log = logging.getLogger(__name__)


def append_event(results_dir: str | os.PathLike, key: str, kind: str, **kw) -> None:
    """Append one event to ``<results_dir>/runs/<key>.jsonl`` (one JSON object per line, appended in one write)."""
    d = Path(results_dir) / "runs"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from gac.io import os_error

        raise os_error(e, "create the event log directory", d) from None
    t = time.time()
    from gac.machine import host, utc_stamp

    ev = {"event": kind, "time": utc_stamp(t), "t": t, "host": host(), "pid": os.getpid(),
          "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
          "slurm_array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
          "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"), **kw}
    try:
        with open(d / f"{key}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(ev, default=str) + "\n")
    except OSError as e:
        from gac.io import os_error

        raise os_error(e, "append to the job's event log", d / f"{key}.jsonl") from None


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

    def start(self, key, spec, config, overrides=()) -> None:
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


# Overrides that say where or how a job runs, not what it is: left out of W&B run names.
_NAME_SKIP = ("results_dir", "hydra", "logger", "force", "on_busy", "sweep", "bench", "experiment", "experiment_name",
              "save_model")
LATENCY_HINTS = ("_ms", "prefill", "decode", "latency", "tok_per_s", "tokens_per_s")


def run_name(job: dict, overrides=(), key: str = "") -> str:
    """A W&B run name that says which point this is: the job's overrides (``compressor=asvd,align=gac,ratio=0.2``,
    as Hydra's ``override_dirname``) without where/how-to-run keys; the job's fields when there are none. The
    record key's first 6 characters follow, so equal-looking names from different configs stay apart."""
    parts = []
    for o in overrides or ():
        k, sep, v = str(o).partition("=")
        k = k.lstrip("+~")
        if not sep or k.split(".")[0].split("/")[0] in _NAME_SKIP:
            continue
        parts.append(f"{k}={v}")
    if not parts:
        parts = [str(x) for x in (job.get("model"), job.get("compressor"), job.get("strategy"),
                                  f"r{job['ratio']}" if job.get("ratio") is not None else None) if x]
    return ",".join(parts) + (f" [{key[:6]}]" if key else "")


def run_tags(job: dict, extra=()) -> list[str]:
    """``experiment:table5``, ``model:tiny``, ``compressor:asvd``, ``strategy:gac``, ``gpu:h100`` and the user's."""
    tags = [f"{k}:{job[k]}" for k in ("experiment", "model", "compressor", "strategy", "gpu") if job.get(k) is not None]
    return [t[:64] for t in tags] + [str(t) for t in extra or () if str(t) not in tags]


def namespaced_metrics(record: dict) -> dict:
    """A record's numbers under W&B namespaces: ``quality/`` (perplexity, task scores), ``latency/`` (ms),
    ``plan/`` (aligned fraction, parameters, budget), ``time/`` (seconds per stage)."""
    from gac.results.query import is_number as num

    out = {}
    for k, v in (record.get("metrics") or {}).items():
        if num(v):
            out[f"{'latency' if any(h in k for h in LATENCY_HINTS) else 'quality'}/{k}"] = v
    for k in ("aligned_fraction", "params", "budget"):
        if num(record.get(k)):
            out[f"plan/{k}"] = record[k]
    for k, v in ((record.get("plan") or {}).get("aligned_by_unit") or {}).items():
        if num(v):
            out[f"plan/aligned_by_unit/{k}"] = v
    for k, v in (record.get("timings") or {}).items():
        if num(v):
            out[f"time/{k}"] = v
    return out


def _check_wandb_online() -> None:
    """W&B online needs an API key (WANDB_API_KEY or ``wandb login``'s netrc entry) and its server reachable."""
    import netrc
    import socket
    from urllib.parse import urlparse

    base = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    url = urlparse(base)
    host = url.hostname or "api.wandb.ai"
    key = os.environ.get("WANDB_API_KEY", "").strip()
    if not key:
        try:
            auth = netrc.netrc(os.environ.get("NETRC") or None).authenticators(host)
            key = (auth[2] or "").strip() if auth else ""
        except (OSError, netrc.NetrcParseError):
            key = ""
    offline = ("use logger=wandb (offline: runs land under RESULTS_DIR/wandb; `wandb sync` uploads them later)")
    if not key:
        raise GacError(f"W&B online needs an API key and none is set (WANDB_API_KEY, or `wandb login` for {host}); "
                       f"set one, or {offline}")
    try:
        with socket.create_connection((host, url.port or (80 if url.scheme == "http" else 443)), timeout=5):
            pass
    except OSError as e:
        raise GacError(f"W&B online: {host} is not reachable from here ({e.strerror or e}); {offline}") from None


class WandbLogger:
    """One W&B run per job, grouped per sweep: named by the point's overrides, tagged by experiment, model,
    compressor, strategy and GPU; metrics under quality/ latency/ plan/ time/, the plan as a table, plan and
    profile artefacts. Each logged record leaves a ``wandb`` event in ``runs/<key>.jsonl`` (the run's id and the
    record it logged), which ``gac wandb backfill`` reads to log only what has no run yet."""

    def __init__(self, results_dir: str | os.PathLike, project: str = "gac", entity: str | None = None,
                 mode: str = "offline", tags=()):
        if mode not in ("offline", "online", "disabled"):
            raise GacError(f"logger.wandb.mode must be offline, online or disabled, got {mode!r}")
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise GacError("logger=wandb needs the wandb package: pip install wandb") from None
        check_wandb_names(project, entity, tags)
        if mode == "online":
            _check_wandb_online()  # before the job: not a traceback (or a hang) once it holds its lock
        self.dir = Path(results_dir)
        self.project, self.entity, self.mode, self.tags = project, entity, mode, list(tags or [])
        self.run = None
        self.key: str | None = None
        self.failed = False

    def start(self, key, spec, config, overrides=()) -> None:
        job = spec.job_fields()
        self.open(key, job, config, overrides, group=spec.sweep or spec.experiment, job_type=spec.experiment)

    def open(self, key: str, job: dict, config: dict, overrides=(), group: str | None = None,
             job_type: str | None = None, run_id: str | None = None) -> None:
        """Start the run of ``key``; ``run_id``: the id chosen (and recorded) beforehand, resumed if W&B knows it."""
        import wandb

        self.failed = False
        self.key = key
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, dir=str(self.dir),
            group=group, job_type=job_type, name=run_name(job, overrides, key), id=run_id,
            resume="allow" if run_id else None,
            config={**(config or {}), "key": key, "job": job, "overrides": list(overrides or ())},
            tags=run_tags(job, self.tags), reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log_record(self, record) -> None:
        import wandb

        if self.run is None:
            return
        # A run W&B resumed (online: a backfill killed after opening it) may already hold the record's history
        # row: only the summary and the artefact, which W&B replaces and deduplicates, are logged again.
        history = not getattr(self.run, "resumed", False)
        numbers = namespaced_metrics(record)
        if history:
            self.run.log(numbers)
        for k, v in numbers.items():
            self.run.summary[k] = v
        plan = record.get("plan")
        if plan:
            d_star = plan.get("d_star", {})
            table = wandb.Table(columns=["target", "d_star", "dim", "aligned"])
            for name, d in plan["dims"].items():
                table.add_data(name, d_star.get(name), d, d % plan["unit"] == 0)
            if history:
                self.run.log({"plan/dims": table})
            art = wandb.Artifact(f"plan-{record['key']}", type="plan")
            with art.new_file("plan.json") as f:
                json.dump(plan, f, indent=1)
            if record.get("profile"):
                with art.new_file("profile_meta.json") as f:
                    json.dump(record["profile"], f, indent=1, default=str)
            self.run.log_artifact(art)
        if self.key and not record.get("skipped"):
            from gac.faults import fault_point

            fault_point("wandb_logged")  # logged, not yet recorded as logged: a kill here is what a re-run resumes
            append_event(self.dir, self.key, "wandb", run_id=self.run.id, run_name=self.run.name, mode=self.mode,
                         project=self.project, record=record.get("_path"), created=record.get("created"))

    def log_failure(self, error) -> None:
        self.failed = True
        if self.run is not None:
            self.run.summary["error"] = error

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if self.failed else 0)
            self.run = None
        self.key = None


WANDB_FORBIDDEN = '/\\#?%:'  # W&B refuses these in a project or entity name (and they would make paths of it)
WANDB_NAME_MAX, WANDB_TAG_MAX = 128, 64


def check_wandb_names(project, entity=None, tags=(), flag: str = "logger.wandb.") -> None:
    """A project and entity W&B accepts (1-128 characters, none of ``/ \\ # ? % :``, not a path) and tags of at
    most 64 characters: refused here in one line, not by W&B after the job ran."""
    sep = " " if flag == "--" else "="
    for key, value in (("project", project), ("entity", entity)):
        if value is None and key == "entity":
            continue
        v = str(value) if value is not None else ""
        bad = sorted({c for c in v if c in WANDB_FORBIDDEN or not c.isprintable()})
        if not v.strip() or len(v) > WANDB_NAME_MAX or bad or v.strip(".") == "":
            why = (f"has {' '.join(repr(c) for c in bad)}" if bad else "is empty" if not v.strip() else
                   f"is {len(v)} characters" if len(v) > WANDB_NAME_MAX else "is only dots")
            raise GacError(f"{flag}{key}{sep}{value!r} is not a W&B {key} name ({why}); give 1 to {WANDB_NAME_MAX} "
                           f"characters without {' '.join(WANDB_FORBIDDEN)}, e.g. {flag}{key}{sep}gac")
    for t in tags or ():
        if not str(t).strip() or len(str(t)) > WANDB_TAG_MAX:
            raise GacError(f"{flag}{'tag' if flag == '--' else 'tags'}: {t!r} is not a W&B tag; give 1 to "
                           f"{WANDB_TAG_MAX} characters")


def build_loggers(results_dir: str | os.PathLike, wandb_cfg: dict | None) -> list:
    loggers: list = [DiskLogger(results_dir)]
    if wandb_cfg:
        loggers.append(WandbLogger(results_dir, project=wandb_cfg.get("project", "gac"),
                                   entity=wandb_cfg.get("entity"), mode=wandb_cfg.get("mode", "offline"),
                                   tags=wandb_cfg.get("tags") or ()))
    return loggers


def _events(results_dir: str | os.PathLike, key) -> list[dict]:
    """The events of ``runs/<key>.jsonl`` that parse (a line cut by a kill mid-append, or not gac's, is passed over)."""
    p = Path(results_dir) / "runs" / f"{key}.jsonl"
    try:
        lines = p.read_bytes().splitlines()
    except OSError:
        return []
    out = []
    for ln in lines:
        try:
            ev = json.loads(ln.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError included
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def logged_to_wandb(results_dir: str | os.PathLike, record: dict) -> dict | None:
    """The ``wandb`` event of the run that logged exactly this record (same ``created`` stamp), or None."""
    for ev in reversed(_events(results_dir, record.get("key"))):
        if ev.get("event") == "wandb" and ev.get("created") == record.get("created"):
            return ev
    return None


RUN_ID = re.compile(r"[a-z0-9]{8}")  # the ids gac chooses (new_run_id); an event naming another is not gac's


def new_run_id() -> str:
    """A W&B run id (8 characters of [a-z0-9], as W&B's own), chosen before the run is opened so it can be recorded."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def opened_for_wandb(results_dir: str | os.PathLike, record: dict) -> dict | None:
    """The ``wandb_open`` event of a run a backfill opened for exactly this record and never recorded as logged (it
    was killed meanwhile), or None: a re-run resumes that run (its id) instead of opening a second one."""
    opened = None
    for ev in _events(results_dir, record.get("key")):
        if ev.get("created") != record.get("created"):
            continue
        if ev.get("event") == "wandb":  # logged (by that run, or live): nothing left open before this line
            opened = None
        elif ev.get("event") == "wandb_open" and isinstance(ev.get("run_id"), str) and RUN_ID.fullmatch(ev["run_id"]):
            opened = ev
    return opened


def _drop_partial_offline_runs(results_dir: str | os.PathLike, run_id: str) -> list[Path]:
    """Remove the offline run directories of ``run_id`` that a killed backfill left half-written under
    ``<results_dir>/wandb`` (the resumed run writes a complete one; `wandb sync offline-run-*` would upload both).
    Each is renamed to a temp name first, so a kill mid-removal leaves nothing `wandb sync` picks up."""
    import shutil

    from gac.io import temp_path

    gone = []
    for d in sorted((Path(results_dir) / "wandb").glob(f"offline-run-*-{run_id}")):
        if d.is_symlink() or not d.is_dir():
            continue
        tmp = temp_path(d)
        try:
            os.rename(d, tmp)
        except OSError as e:
            raise GacError(f"cannot move aside the unfinished offline W&B run {str(d)!r}: {e.strerror or e}; remove "
                           f"it (rm -r {d}) and re-run the backfill") from None
        shutil.rmtree(tmp, ignore_errors=True)
        gone.append(d)
    return gone


def backfill_wandb(results_dir: str | os.PathLike, records: list[dict], project: str = "gac",
                   entity: str | None = None, mode: str = "offline", tags=(), force: bool = False,
                   dry_run: bool = False) -> list[dict]:
    """Create a W&B run for every record that has none yet (skipped points, points run with the disk logger), the
    same run a live job would have made. Returns one row per record: ``{"key", "name", "action", "run_id"}``
    where action is ``logged``, ``has run`` (left alone; ``force`` logs it again) or ``would log`` (dry run).

    One writer per record, and idempotent across a kill: each record is logged under its job's lock (the lock a
    job of that key holds while it runs and logs), so two backfills at once, or a backfill and a job, never both log
    it: the second waits, then finds the record logged. The run's id is chosen and recorded (a ``wandb_open``
    event in ``runs/<key>.jsonl``) before the run is opened; a backfill killed before it recorded the ``wandb``
    event leaves that id, and the next backfill resumes the same run (offline: its half-written run directory is
    replaced) instead of logging the record into a second one.
    """
    from gac.results import ResultsStore
    from gac.results.lock import FileLock, describe_holder

    check_wandb_names(project, entity, tags, "--")
    store = ResultsStore(results_dir)
    rows = []
    logger = None if dry_run else WandbLogger(results_dir, project=project, entity=entity, mode=mode, tags=tags)
    for rec in records:
        key, job = rec["key"], dict(rec.get("job") or {})
        name = run_name(job, rec.get("overrides") or (), key)
        if logger is None:
            prior = logged_to_wandb(results_dir, rec)
            if prior and not force and not opened_for_wandb(results_dir, rec):
                rows.append({"key": key, "name": name, "action": "has run", "run_id": prior.get("run_id")})
            else:
                rows.append({"key": key, "name": name, "action": "would log", "run_id": None})
            continue
        store.check_layout(key)  # runs/<key>.jsonl a plain file: a link planted there is refused, not appended through
        # Waiting, not refusing: the holder is another backfill (seconds per record) or a job of this key, and the
        # record is either logged by it (then shown as "has run") or ours to log once it lets go.
        lock = FileLock(store.lock_path(key), what=f"record {key}")
        lock.acquire(on_wait=lambda h, key=key: log.info(
            "record %s is held by %s (a job or another W&B backfill); waiting for it", key, describe_holder(h)))
        try:
            rows.append(_backfill_one(logger, results_dir, rec, key, job, name, force))
        finally:
            lock.release()
    return rows


def _backfill_one(logger: WandbLogger, results_dir, rec: dict, key: str, job: dict, name: str, force: bool) -> dict:
    """Log one record under its lock (see :func:`backfill_wandb`)."""
    opened = opened_for_wandb(results_dir, rec)
    prior = logged_to_wandb(results_dir, rec)
    if opened is None and prior and not force:
        return {"key": key, "name": name, "action": "has run", "run_id": prior.get("run_id")}
    if opened is not None:
        run_id = opened["run_id"]
        dropped = _drop_partial_offline_runs(results_dir, run_id)
        log.info("record %s: resuming W&B run %s, which a backfill killed on %s pid %s opened%s", key, run_id,
                 opened.get("host"), opened.get("pid"), f" (its unfinished offline run {dropped[0].name} replaced)"
                 if dropped else "")
    else:
        run_id = new_run_id()
        append_event(results_dir, key, "wandb_open", run_id=run_id, run_name=name, mode=logger.mode,
                     project=logger.project, record=rec.get("_path"), created=rec.get("created"))
    experiment = job.get("experiment") or "default"
    logger.open(key, job, rec.get("config") or {}, rec.get("overrides") or (),
                group=job.get("sweep") or experiment, job_type=experiment, run_id=run_id)
    try:
        logger.run.summary["backfilled"] = True
        logger.log_record(rec)
    finally:
        logger.finish()
    return {"key": key, "name": name, "action": "logged", "run_id": run_id}
