"""An append-only results store on a plain directory (works on any shared file system a Slurm cluster has).

Layout under ``results_dir``::

    records/<key>.json               one per COMPLETED job; created atomically, never replaced
    failures/<key>/<utc-time>.json   one per FAILED attempt (the error and traceback); never replaced
    cache/                           content-addressed artefacts (scores, factorizations) — see gac.results.cache
    bench/<key>.json                 one per side-by-side latency bench (gac bench; gac.jobs.bench): never replaced,
                                     a forced re-measure goes beside it as bench/<key>.rerun-<utc-time>.json

``key`` is a hash of the resolved job config with the keys that do not change the result removed
(``results_dir``, ``force``, logger and launcher settings). A point is *done* if its record exists, *failed*
if it has failures and no record, *pending* otherwise. A re-launched sweep skips done points unless forced;
a forced re-run of a done point writes ``records/<key>.json`` only if absent — otherwise it goes to
``records/<key>.rerun-<utc-time>.json`` so nothing completed is ever overwritten.

Record (``SCHEMA_VERSION`` 1) — the fields analysis code may rely on::

    {"schema": 1, "key": str, "status": "completed", "created": iso-time,
     "job": {"model", "compressor", "proxy", "strategy", "ratio", "unit", "gpu", "seq_len", "experiment",
             "sweep"},             # flat identifiers; compressor "none" and strategy "baseline" for the original
     "metrics": {name: float},      # e.g. ppl_wikitext2, piqa_acc, piqa_acc_norm, hellaswag_acc,
                                    # hellaswag_acc_norm, prefill_ms, decode_ms_per_token (missing = not run)
     "aligned_fraction": float, "params": int, "budget": int,
     "plan": {...Plan.to_json()...} | null,
     "timings": {stage: seconds}, "stages": {"resumed": [stage], "prepare_cached": bool | null},
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
from gac.io import read_json, write_json_atomic

SCHEMA_VERSION = 1
NON_SEMANTIC_KEYS = frozenset({"results_dir", "force", "logger", "launcher", "hydra", "wandb", "slurm", "work_dir"})


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


class ResultsStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

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

    def status(self, key: str) -> str:
        if self.is_done(key):
            return "done"
        fdir = self.failures_dir / key
        if fdir.is_dir() and any(fdir.glob("*.json")):
            return "failed"
        return "pending"

    def write_record(self, key: str, record: dict) -> Path:
        """Write a completed record; never replaces one (a re-run goes beside it)."""
        record = {"schema": SCHEMA_VERSION, "key": key, "status": "completed",
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
        path = self.record_path(key)
        if path.exists():
            path = self.records_dir / f"{key}.rerun-{_utc_stamp()}.json"
        try:
            return write_json_atomic(path, record)
        except GacError:
            return write_json_atomic(self.records_dir / f"{key}.rerun-{_utc_stamp()}.json", record)

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
            yield rec

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
