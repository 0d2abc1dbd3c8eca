"""An append-only results store on a plain directory (works on any shared file system a Slurm cluster has).

Layout under ``results_dir``::

    .gac-store.json                  marks the directory as a store (what `gac launch status` looks for)
    records/<key>.json               one per COMPLETED job; created atomically, never replaced
    failures/<key>/<utc-time>.json   one per FAILED attempt (the error and traceback); never replaced
    locks/<key>.lock                 held while a job for <key> runs (gac.results.lock: host, pid, Slurm ids,
                                     heartbeat); a second identical job waits for it and then skips
    runs/<key>.jsonl                 job events (started, stage, waiting, completed, failed)
    work/<key>/                      finished stages of an unfinished job, and attempts.json (one entry per attempt)
    cache/                           content-addressed artefacts (scores, factorizations, hardware profiles)
    bench/<key>.json                 one per side-by-side latency bench (gac bench; gac.jobs.bench): never replaced,
                                     a forced re-measure goes beside it as bench/<key>.rerun-<utc-time>.json

``key`` is a hash of the resolved job config with the keys that do not change the result removed
(``results_dir``, ``force``, logger and launcher settings). A point is *done* if its record exists (and
*corrupt* if that record cannot be read), *failed* if it has failures and no record, *pending* otherwise
(``gac launch status`` adds *running* and *interrupted* from the lock). A re-launched sweep skips done points
unless forced; a forced re-run of a done point writes ``records/<key>.json`` only if absent — otherwise it goes to
``records/<key>.rerun-<utc-time>.json`` so nothing completed is ever overwritten. Every file is created with
mode 0666 minus the umask (readable by colleagues under the usual umask 022).

Record (``SCHEMA_VERSION`` 1) — the fields analysis code may rely on::

    {"schema": 1, "key": str, "status": "completed", "created": iso-time,
     "job": {"model", "compressor", "proxy", "strategy", "ratio", "unit", "gpu", "seq_len", "experiment",
             "sweep"},             # flat identifiers; compressor "none" and strategy "baseline" for the original
     "metrics": {name: float},      # flat, named by gac.metrics: ppl_<dataset> (ppl_wikitext2, ppl_tiny),
                                    # <task>_<metric>[_<filter>] (piqa_acc, piqa_acc_norm, piqa_acc_stderr, ...),
                                    # prefill_ms (the job's own point), prefill_ms@<S> / prefill_ms@b<B>_<S> (other
                                    # points), prefill_ms_spread (trials > 1 only), decode_ms_per_token;
                                    # missing = not run. Older names are mapped on reading (upgrade_metrics).
     "evaluation": {"perplexity": {...}, "tasks": {task: {...}}, "latency": {point: {...}},
                    "lm_eval": {"results": {task: {"metric,filter": value, "alias"}}, "versions": {task: v},
                                "n-samples": {task: {"original", "effective"}}, "higher_is_better": {...},
                                "configs": {task: {"num_fewshot", "output_type", ...}}, "sources": {task: "hub" | file}}},
     "aligned_fraction": float, "params": int, "budget": int,
     "plan": {...Plan.to_json()...} | null,
     "timings": {stage: seconds},   # measured by the attempt that wrote the record (every stage <= total_s)
     "attempts": [{"attempt", "host", "pid", "slurm_job_id", "slurm_restart_count", "started", "ended",
                   "outcome": "completed" | "failed" | "interrupted", "error", "timings", "resumed"}],
     "stages": {"resumed": [stage], "prepare_cached": bool | null},
     "config": {...resolved config...}, "overrides": [str],
     "provenance": {"git_commit", "git_dirty", "packages": {name: version}, "device", "seed", "date",
                    "slurm_job_id", "hostname", "gac_version"}}
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from gac.errors import GacError
from gac.io import check_writable, clean_temp_files, read_json, write_json_atomic
from gac.metrics import upgrade_record

SCHEMA_VERSION = 1
MARKER = ".gac-store.json"
STORE_DIRS = ("records", "failures", "runs", "work", "locks")
NON_SEMANTIC_KEYS = frozenset({"results_dir", "force", "on_busy", "logger", "launcher", "hydra", "wandb", "slurm", "work_dir"})


def _canonical(obj):
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer():
        return int(obj) if abs(obj) < 2**53 else obj
    return obj


def config_key(config: dict, ignore: frozenset[str] = NON_SEMANTIC_KEYS) -> str:
    """A stable 16-hex-digit key of a resolved config (top-level non-semantic keys ignored)."""
    payload = {k: v for k, v in config.items() if k not in ignore}
    text = json.dumps(_canonical(payload), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _utc_stamp() -> str:
    t = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


class CorruptRecord(GacError):
    """A record file that cannot be read as a gac record (damaged or edited by hand)."""


class ResultsStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # ------------------------------------------------------------------------------------------------ the store
    def exists(self) -> bool:
        """Does ``root`` look like a results store (its marker, or one of its directories)?"""
        return self.root.is_dir() and ((self.root / MARKER).is_file() or any((self.root / d).is_dir()
                                                                               for d in STORE_DIRS))

    def require(self) -> ResultsStore:
        """This store, or a :class:`GacError` when ``root`` is not one (a mistyped ``--results-dir``)."""
        if not self.root.exists():
            raise GacError(f"no results store at {str(self.root)!r}: the directory does not exist; check "
                           f"--results-dir / results_dir (nothing has run there yet?)")
        if not self.exists():
            raise GacError(f"{str(self.root)!r} is not a gac results store (no {MARKER}, records/, failures/ or "
                           f"runs/ in it); check --results-dir / results_dir")
        return self

    def prepare_for_writing(self) -> None:
        """Before a job's work: the store is writable and has room (else a one-line GacError), it is marked as a
        store, and temp files that killed writers left behind are removed."""
        check_writable(self.root, "results directory")
        check_writable(self.records_dir, "records directory")
        marker = self.root / MARKER
        if not marker.exists():
            try:
                write_json_atomic(marker, {"format": "gac-results-store", "schema": SCHEMA_VERSION})
            except GacError:
                if not marker.exists():
                    raise
        self.clean_leftovers()

    def clean_leftovers(self, key: str | None = None) -> list[Path]:
        """Remove temp files of writers that are gone (killed mid-write) under records/, cache/ and, for ``key``,
        work/<key>/ and failures/<key>/. Files a live writer may still be filling are never touched."""
        removed = clean_temp_files(self.records_dir) + clean_temp_files(self.cache_dir, recursive=True)
        removed += clean_temp_files(self.root)
        if key is not None:
            removed += clean_temp_files(self.root / "work" / key) + clean_temp_files(self.failures_dir / key)
        return removed

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    def lock_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lock"

    def lock(self, key: str):
        """The lock a job for ``key`` holds while it runs (:class:`gac.results.lock.FileLock`)."""
        from gac.results.lock import FileLock

        return FileLock(self.lock_path(key), what=f"job {key}")

    @property
    def records_dir(self) -> Path:
        return self.root / "records"

    @property
    def failures_dir(self) -> Path:
        return self.root / "failures"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def record_path(self, key: str) -> Path:
        return self.records_dir / f"{key}.json"

    def is_done(self, key: str) -> bool:
        return self.record_path(key).exists()

    def read_record(self, key: str | None = None, path: str | os.PathLike | None = None) -> dict:
        """The record of ``key`` (or at ``path``), checked: raises :class:`CorruptRecord` naming the file and the
        fix when it is not valid JSON or not a completed gac record for that key."""
        p = Path(path) if path is not None else self.record_path(key)
        fix = (f"move it aside (mv {p} {p}.corrupt) and re-run the point, or restore it from a backup")
        try:
            rec = read_json(p, "result record")
        except GacError as e:
            if not p.exists():
                raise
            raise CorruptRecord(f"{e}; {fix}") from None
        want = key or p.name.split(".", 1)[0]
        problem = None
        if not isinstance(rec, dict):
            problem = f"holds a {type(rec).__name__}, not a record object"
        elif rec.get("key") != want:
            problem = f"has key {rec.get('key')!r}, its file name says {want!r}"
        elif rec.get("status") != "completed" or not isinstance(rec.get("job"), dict):
            problem = "is not a completed gac record (status / job missing)"
        if problem:
            raise CorruptRecord(f"result record {str(p)!r} {problem}; {fix}")
        return upgrade_record(rec)

    def status(self, key: str) -> str:
        """``done``, ``corrupt`` (a record that cannot be read), ``failed`` or ``pending``."""
        if self.is_done(key):
            try:
                self.read_record(key)
            except CorruptRecord:
                return "corrupt"
            return "done"
        if self.failure_paths(key):
            return "failed"
        return "pending"

    def failure_paths(self, key: str) -> list[Path]:
        fdir = self.failures_dir / key
        return sorted(fdir.glob("*.json")) if fdir.is_dir() else []

    def record_paths(self, key: str) -> list[Path]:
        """The record of ``key`` and its forced re-runs."""
        if not self.records_dir.is_dir():
            return []
        return sorted(p for p in self.records_dir.glob(f"{key}*.json")
                      if p.name == f"{key}.json" or p.name.startswith(f"{key}.rerun-"))

    def write_record(self, key: str, record: dict, rerun: bool = True) -> Path:
        """Write a completed record; never replaces one. A forced re-run (``rerun``) goes beside an existing
        record; otherwise an existing record (written meanwhile by an identical job) is kept and its path
        returned, so a key never gets two records by accident."""
        record = {"schema": SCHEMA_VERSION, "key": key, "status": "completed",
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
        path = self.record_path(key)
        if path.exists():
            if not rerun:
                return path
            path = self.records_dir / f"{key}.rerun-{_utc_stamp()}.json"
        faults = ("record_write", "record_written")
        try:
            return write_json_atomic(path, record, faults=faults)
        except GacError:
            if not path.exists():
                raise
            if not rerun:
                return path
            return write_json_atomic(self.records_dir / f"{key}.rerun-{_utc_stamp()}.json", record, faults=faults)

    def write_failure(self, key: str, record: dict) -> Path:
        record = {"schema": SCHEMA_VERSION, "key": key, "status": "failed",
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
        return write_json_atomic(self.failures_dir / key / f"{_utc_stamp()}.json", record)

    def iter_records(self, include_failures: bool = False) -> Iterator[dict]:
        """Every record (completed, re-runs included; optionally failures), in file-name order."""
        paths = sorted(self.records_dir.glob("*.json")) if self.records_dir.is_dir() else []
        if include_failures and self.failures_dir.is_dir():
            paths += sorted(self.failures_dir.glob("*/*.json"))
        for p in paths:
            rec = read_json(p, "result record")
            if not isinstance(rec, dict) or "key" not in rec:
                raise GacError(f"result record {str(p)!r} is not a gac record (no 'key'); move it out of {self.root}")
            rec.setdefault("_path", str(p))
            yield upgrade_record(rec)

    # ------------------------------------------------------------------------------------------ bench records
    @property
    def bench_dir(self) -> Path:
        return self.root / "bench"

    def bench_path(self, key: str) -> Path:
        return self.bench_dir / f"{key}.json"

    def write_bench(self, key: str, doc: dict) -> Path:
        """Write a bench record atomically; never replaces one (a forced re-measure goes beside it)."""
        doc = {**doc, "key": key, "created": doc.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        doc.pop("_path", None)
        doc.pop("skipped", None)
        path = self.bench_path(key)
        if path.exists():
            path = self.bench_dir / f"{key}.rerun-{_utc_stamp()}.json"
        try:
            return write_json_atomic(path, doc)
        except GacError:
            return write_json_atomic(self.bench_dir / f"{key}.rerun-{_utc_stamp()}.json", doc)

    def iter_bench(self) -> Iterator[dict]:
        """Every bench record (re-measures included), in file-name order; each with ``_path``."""
        paths = sorted(self.bench_dir.glob("*.json")) if self.bench_dir.is_dir() else []
        for p in paths:
            doc = read_json(p, "bench record")
            if not isinstance(doc, dict) or doc.get("kind") != "bench" or "variants" not in doc:
                raise GacError(f"bench record {str(p)!r} is not a gac bench record; move it out of {self.bench_dir}")
            doc.setdefault("_path", str(p))
            yield doc


class AnyOf(tuple):
    """A record filter's alternatives: ``--where compressor=asvd --where compressor=llm_pruner`` keeps the records
    whose compressor is either (repeated keys mean OR, different keys AND), in ``gac bench`` and ``gac report``."""

    def __str__(self) -> str:
        return "|".join(str(v) for v in self)


def add_filter(where: dict, key: str, value) -> None:
    """Add ``key=value`` to the filter dict ``where``; a key given again adds an alternative (:class:`AnyOf`)."""
    if key not in where:
        where[key] = value
        return
    old = where[key]
    values = tuple(old) if isinstance(old, AnyOf) else (old,)
    if value not in values:
        values += (value,)
    where[key] = AnyOf(values) if len(values) > 1 else values[0]

