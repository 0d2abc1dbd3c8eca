"""An append-only results store on a plain directory (works on any shared file system a Slurm cluster has).

Layout under ``results_dir``::

    .gac-store.json                  marks the directory as a store (what `gac launch status` looks for)
    records/<key>.json               one per COMPLETED job; created atomically, never replaced
    failures/<key>/<utc-time>.json   one per FAILED attempt (the error and traceback); never replaced
    locks/<key>.lock                 held while a job for <key> runs (gac.results.lock: host, pid, Slurm ids,
                                     heartbeat); a second identical job waits for it and then skips; a W&B
                                     backfill holds it while it logs the record of <key>
    locks/bench-<key>.lock           held while a bench measures and stores bench/<key>.json; a second waits
    runs/<key>.jsonl                 job events (started, stage, waiting, completed, failed; wandb_open: a W&B
                                     run's id recorded before it is opened, wandb: the run logged the record)
    work/<key>/                      finished stages of an unfinished job, and attempts.json (one entry per attempt,
                                     and the attempt and sha256 of each stage output: only those are resumed)
    cache/                           content-addressed artefacts (scores, factorizations, hardware profiles)
    bench/<key>.json                 one per side-by-side latency bench (gac bench; gac.jobs.bench.store_bench): never replaced,
                                     a forced re-measure goes beside it as bench/<key>.rerun-<utc-time>.json

``key`` is a hash of the resolved job config with the keys that do not change the result removed
(``results_dir``, ``force``, logger and launcher settings). A point is *done* if its record exists (and
*corrupt* if that record cannot be read), *failed* if it has failures and no record, *pending* otherwise
(``gac launch status`` adds *running* and *interrupted* from the lock). A re-launched sweep skips done points
unless forced; a forced re-run of a done point writes ``records/<key>.json`` only if absent — otherwise it goes to
``records/<key>.rerun-<utc-time>.json`` so nothing completed is ever overwritten. Every file is created with
mode 0666 minus the umask (readable by colleagues under the usual umask 022).

Readers trust a record because a job wrote it, not because of where it lies: ``record_problem`` (its key is its
file name, its job fields and metrics have the types and ranges a job writes) and no link out of the store, checked
by :meth:`ResultsStore.read_record` and :meth:`ResultsStore.iter_records` alike; a job checks its own record the same
way before publishing it (both in :mod:`gac.results.validate`). The key itself is :func:`gac.results.keys.config_key`.

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
                    "slurm_job_id", "hostname", "gac_version",
                    "checkout_moved": {"git_commit", "git_dirty"}}}  # only when the checkout moved during the job
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from gac.errors import GacError
from gac.io import check_writable, clean_temp_files, read_json, write_json_atomic
from gac.layout import CHECKPOINT_FILE, STORE_MARKER, STORE_OWN_DIRS, is_store, owned_directory
from gac.machine import file_stamp, utc_stamp
from gac.metrics import upgrade_record
from gac.results.validate import SCHEMA_VERSION, bench_problem, is_int, record_problem

MAX_RECORD_BYTES = 256 << 20  # a record is ~10-200 kB; a larger file is not one (and is not read into memory)


def results_path(path: str | os.PathLike) -> Path:
    """``path`` (a ``results_dir``, ``--results-dir``, a report's store) with ``~`` expanded, as every reader and
    writer of a store takes it."""
    return Path(os.path.expanduser(str(path)))


def results_root(path: str | os.PathLike) -> Path:
    """``path`` (a ``results_dir``) made absolute with links resolved (:func:`results_path` first); a looping link is
    a one-line :class:`GacError`."""
    try:
        root = results_path(path).resolve()
    except (RuntimeError, OSError) as e:  # Python < 3.13 raises RuntimeError for a link loop
        raise GacError(f"results directory {str(path)!r} cannot be resolved ({e}): a looping symbolic link? point "
                       f"results_dir / --results-dir at a real directory") from None
    check_path_length(root, "results directory", room=ROOM_IN_STORE)
    return root


#: the longest path a store adds under its root (``work/<key>/<stage>.json``, a re-run record's time-stamped name)
ROOM_IN_STORE = 96


def check_path_length(path: Path, what: str, room: int = 0) -> None:
    """``path`` (and ``room`` more characters under it) within the file system's limits on a name and a path
    (255 and 4096 bytes on Linux): else one line, not an ``OSError: File name too long`` once the work is done."""
    try:
        name_max = os.pathconf("/", "PC_NAME_MAX")
        path_max = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        name_max, path_max = 255, 4096
    long = next((p for p in path.parts if len(os.fsencode(p)) > name_max), None)
    size = len(os.fsencode(str(path))) + room
    if long is not None or size > path_max:
        shown = str(path) if len(str(path)) <= 80 else f"{str(path)[:60]}...{str(path)[-16:]}"
        why = (f"a name of {len(os.fsencode(long))} bytes, the file system's limit is {name_max}" if long is not None
               else f"{size} bytes with what gac writes under it, the limit is {path_max}")
        raise GacError(f"{what} {shown!r} is too long for this file system ({why}); choose a shorter path")


class CorruptRecord(GacError):
    """A record file that cannot be read as a gac record (damaged or edited by hand)."""


class ResultsStore:
    def __init__(self, root: str | os.PathLike):
        self.root = results_path(root)

    # ------------------------------------------------------------------------------------------------ the store
    def exists(self) -> bool:
        """Does ``root`` hold results to read (its marker, or one of its directories: a copy of records/ alone is read
        too)? :func:`gac.layout.is_store` with ``to_read`` (without it, the stricter rule of where outputs go)."""
        return self.root.is_dir() and is_store(self.root, to_read=True)

    def require(self) -> ResultsStore:
        """This store, or a :class:`GacError` when ``root`` is not one (a mistyped ``--results-dir``)."""
        if not self.root.exists() and self.root.is_symlink():
            raise GacError(f"results directory {str(self.root)!r} is a broken or looping symbolic link; point it at the "
                           f"results_dir your jobs wrote to (check --results-dir / results_dir)")
        if not self.root.exists():
            raise GacError(f"no results store at {str(self.root)!r}: the directory does not exist; check "
                           f"--results-dir / results_dir (nothing has run there yet?)")
        if not self.root.is_dir():
            raise GacError(f"{str(self.root)!r} is a file, not a results directory; check --results-dir / results_dir")
        if not self.exists():
            raise GacError(f"{str(self.root)!r} is not a gac results store (no {STORE_MARKER}, records/, failures/ or "
                           f"runs/ in it); check --results-dir / results_dir")
        self._check_marker()
        return self

    def _check_marker(self) -> None:
        """The store's marker, when there, is the one gac writes, of a store schema this gac reads: a store a newer
        gac made is not written to (nor read) by an older one."""
        marker = self.root / STORE_MARKER
        if not (marker.exists() or marker.is_symlink()):
            return
        fix = "if this directory is not a gac results store, choose another results_dir"
        try:
            doc = read_json(marker, "store marker", max_bytes=1 << 20)
        except GacError as e:
            raise GacError(f"{e}; gac writes it as {{\"format\": \"gac-results-store\", \"schema\": {SCHEMA_VERSION}}}: "
                           f"rewrite it so, or {fix}") from None
        if not isinstance(doc, dict) or doc.get("format") != "gac-results-store":
            raise GacError(f"store marker {str(marker)!r} is not one gac writes (no format 'gac-results-store'); {fix}")
        schema = doc.get("schema")
        if not is_int(schema) or schema < 1:
            raise GacError(f"store marker {str(marker)!r} has schema {schema!r}, not a store schema; {fix}")
        if schema > SCHEMA_VERSION:
            raise GacError(f"results store {str(self.root)!r} has schema {schema}, written by a newer gac (this one "
                           f"reads schema {SCHEMA_VERSION}); use the gac version that wrote it, or a newer one")

    def prepare_for_writing(self) -> None:
        """Before a job's work: the store is writable and has room (else a one-line GacError), it is marked as a
        store (a directory that holds a model instead is refused), and temp files that killed writers left behind
        are removed."""
        if (self.root.exists() or self.root.is_symlink()) and not self.root.is_dir():
            raise GacError(f"results directory {str(self.root)!r} is a file, not a directory; point results_dir at a "
                           f"directory (a new one is made)")
        self._check_marker()
        owner = owned_directory(self.root, itself=False)  # a store inside another's records/, or in a model
        if owner:
            raise GacError(f"results directory {str(self.root)!r} {owner}; point results_dir at a directory of its own")
        if self.root.is_dir() and not self.exists():
            model = [n for n in ("config.json", CHECKPOINT_FILE, "model.safetensors",
                                 "model.safetensors.index.json") if (self.root / n).exists()]
            if model:
                raise GacError(f"results directory {str(self.root)!r} holds a model ({model[0]}), not results; point "
                               f"results_dir at a directory of its own (the model goes in model.spec)")
        check_writable(self.root, "results directory")
        self.check_layout()
        check_writable(self.records_dir, "records directory")
        marker = self.root / STORE_MARKER
        if not marker.exists():
            try:
                write_json_atomic(marker, {"format": "gac-results-store", "schema": SCHEMA_VERSION})
            except GacError:
                if not marker.exists():
                    raise
        self.clean_leftovers()

    def check_layout(self, key: str | None = None) -> None:
        """The store's directories (and, for ``key``, its event log) are what gac makes them, not a file or a link
        out of the store put there by hand: else one line naming the entry and what to move."""
        for d in STORE_OWN_DIRS:
            self._require_dir(self.root / d, contained=d in ("records", "bench", "sweeps"))
        if key is not None:
            log = self.root / "runs" / f"{key}.jsonl"
            if log.is_symlink() or (log.exists() and not log.is_file()):
                raise GacError(f"{str(log)!r} is not a plain file (gac appends the job's events there); move it aside "
                               f"(mv {log} {log}.bak) and re-run")

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
        fix when it is not valid JSON or not a completed gac record for that key (:func:`record_problem`: its key
        is its file name, its job fields and metrics have the types and ranges a job writes)."""
        p = Path(path) if path is not None else self.record_path(key)
        want = key or p.name.split(".", 1)[0]
        return upgrade_record(self._read_checked(p, want, "completed", "result record", _fix(p)))

    def _read_checked(self, p: Path, want: str, status: str, what: str, fix: str) -> dict:
        self._check_inside(p, what, fix)
        try:
            rec = read_json(p, what, max_bytes=MAX_RECORD_BYTES)
        except GacError as e:
            if not p.exists() and not p.is_symlink():
                raise
            raise CorruptRecord(f"{e}; {fix}") from None
        problem = record_problem(rec, want, status)
        if problem:
            raise CorruptRecord(f"{what} {str(p)!r} {problem}; {fix}")
        return rec

    def _check_inside(self, p: Path, what: str, fix: str) -> None:
        """A record read through a symbolic link must stay inside the store: a link to a file elsewhere (another
        store, a planted copy) is refused, not followed; so is a dangling or looping link."""
        try:
            real = p.resolve(strict=True)
        except FileNotFoundError:
            if p.is_symlink():
                raise CorruptRecord(f"{what} {str(p)!r} is a dangling symbolic link; {fix}") from None
            return  # absent: the reader says so
        except (OSError, RuntimeError):
            raise CorruptRecord(f"{what} {str(p)!r} is a looping symbolic link; {fix}") from None
        root = self.root.resolve()
        if root not in real.parents:
            raise CorruptRecord(f"{what} {str(p)!r} is a symbolic link to {str(real)!r}, outside the store "
                                f"{str(root)!r} (gac does not follow links out of a store); {fix}")

    def _inside(self, p: Path) -> bool:
        try:
            return self.root.resolve() in p.resolve(strict=True).parents
        except (OSError, RuntimeError):
            return False

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
                  "created": utc_stamp(), **record}
        path = self.record_path(key)
        if path.exists():
            if not rerun:
                return path
            path = self.records_dir / f"{key}.rerun-{file_stamp()}.json"
        faults = ("record_write", "record_written")
        try:
            return write_json_atomic(path, record, faults=faults)
        except GacError:
            if not path.exists():
                raise
            if not rerun:
                return path
            return write_json_atomic(self.records_dir / f"{key}.rerun-{file_stamp()}.json", record, faults=faults)

    def write_failure(self, key: str, record: dict) -> Path:
        record = {"schema": SCHEMA_VERSION, "key": key, "status": "failed",
                  "created": utc_stamp(), **record}
        return write_json_atomic(self.failures_dir / key / f"{file_stamp()}.json", record)

    def iter_records(self, include_failures: bool = False) -> Iterator[dict]:
        """Every record (completed, re-runs included; optionally failures), in file-name order, each checked as
        :meth:`read_record` checks one (its file name is its key, plausible fields and metrics, no link out of the
        store): anything else under ``records/`` is a :class:`CorruptRecord` naming the file and the fix."""
        self._check_marker()
        self._require_dir(self.records_dir, contained=True)
        paths = sorted(self.records_dir.glob("*.json")) if self.records_dir.is_dir() else []
        for p in paths:
            rec = self._read_checked(p, _key_of_name(p.name), "completed", "result record", _fix(p))
            rec.setdefault("_path", str(p))
            yield upgrade_record(rec)
        if include_failures and self.failures_dir.is_dir():
            for p in sorted(self.failures_dir.glob("*/*.json")):
                rec = self._read_checked(p, p.parent.name, "failed", "failure record",
                                         f"move it out of the store (mv {p} {p}.corrupt)")
                rec.setdefault("_path", str(p))
                yield upgrade_record(rec)

    def _require_dir(self, d: Path, contained: bool = False) -> None:
        """``d`` is a directory or absent; ``contained``: a link there must stay inside the store (records/, bench/:
        what reports trust). work/, cache/ may live on another disk behind a link."""
        if (d.exists() or d.is_symlink()) and not d.is_dir() or contained and d.is_symlink() and not self._inside(d):
            raise GacError(f"{str(d)!r} is not a directory of this store (a file, or a link that is broken or leaves the "
                           f"store, where gac keeps {d.name}/); move it aside (mv {d} {d}.bak) and re-run, or choose "
                           f"another results_dir")

    # ------------------------------------------------------------------------------------------ sweep launches
    @property
    def sweeps_dir(self) -> Path:
        return self.root / "sweeps"

    def write_sweep(self, name: str, doc: dict) -> Path:
        """Record a Slurm sweep's launch (its points, array job and end-of-sweep job: ``gac launch status`` reads
        it) as ``sweeps/<name>.json``; never replaces one."""
        self._require_dir(self.sweeps_dir, contained=True)
        return write_json_atomic(self.sweeps_dir / f"{name}.json", doc)

    def iter_sweeps(self) -> Iterator[dict]:
        """The recorded sweep launches, newest first, each with ``_path``; an unreadable one is skipped (it only
        tells where a launch's jobs are)."""
        self._require_dir(self.sweeps_dir, contained=True)
        paths = sorted(self.sweeps_dir.glob("*.json"), reverse=True) if self.sweeps_dir.is_dir() else []
        for p in paths:
            if p.is_symlink() or not p.is_file():
                continue
            try:
                doc = read_json(p, "sweep launch", max_bytes=MAX_RECORD_BYTES)
            except GacError:
                continue
            if isinstance(doc, dict) and doc.get("kind") == "gac-sweep":
                doc["_path"] = str(p)
                yield doc

    # ------------------------------------------------------------------------------------------ bench records
    @property
    def bench_dir(self) -> Path:
        return self.root / "bench"

    def bench_path(self, key: str) -> Path:
        return self.bench_dir / f"{key}.json"

    def write_bench(self, key: str, doc: dict) -> Path:
        """Write a bench record atomically; never replaces one (a forced re-measure goes beside it)."""
        doc = {**doc, "key": key, "created": doc.get("created") or utc_stamp()}
        doc.pop("_path", None)
        doc.pop("skipped", None)
        self._require_dir(self.bench_dir, contained=True)
        path = self.bench_path(key)
        if path.exists():
            path = self.bench_dir / f"{key}.rerun-{file_stamp()}.json"
        try:
            return write_json_atomic(path, doc)
        except GacError:
            return write_json_atomic(self.bench_dir / f"{key}.rerun-{file_stamp()}.json", doc)

    def read_bench(self, key: str | None = None, path: str | os.PathLike | None = None) -> dict:
        """The bench record of ``key`` (or at ``path``), with ``_path``, checked as result records are: no link out
        of the store, strict JSON of a bounded size, and :func:`bench_problem` (its key is its file name, every
        latency and ratio a positive finite number); else a :class:`CorruptRecord` naming the file and the fix."""
        self._require_dir(self.bench_dir, contained=True)
        p = Path(path) if path is not None else self.bench_path(key)
        fix = f"move it out of {self.bench_dir} (mv {p} {p}.corrupt) and re-run `gac bench`"
        self._check_inside(p, "bench record", fix)
        try:
            doc = read_json(p, "bench record", max_bytes=MAX_RECORD_BYTES)
        except GacError as e:
            raise CorruptRecord(f"{e}; {fix}") from None
        problem = bench_problem(doc, key or _key_of_name(p.name))
        if problem:
            raise CorruptRecord(f"bench record {str(p)!r} {problem}; {fix}")
        doc.setdefault("_path", str(p))
        return doc

    def bench_paths(self, key: str) -> list[Path]:
        """The bench record of ``key`` and its forced re-measures."""
        if not self.bench_dir.is_dir():
            return []
        return sorted(p for p in self.bench_dir.glob(f"{key}*.json")
                      if p.name == f"{key}.json" or p.name.startswith(f"{key}.rerun-"))

    def bench_lock(self, key: str):
        """The lock a bench of ``key`` holds while it measures and stores (:class:`gac.results.lock.FileLock`, as a
        job holds its own: on a shared file system, between hosts)."""
        from gac.results.lock import FileLock

        return FileLock(self.locks_dir / f"bench-{key}.lock", what=f"bench {key}")

    def iter_bench(self) -> Iterator[dict]:
        """Every bench record (re-measures included), in file-name order; each with ``_path``, checked as
        :meth:`read_bench` checks one."""
        self._require_dir(self.bench_dir, contained=True)
        paths = sorted(self.bench_dir.glob("*.json")) if self.bench_dir.is_dir() else []
        for p in paths:
            yield self.read_bench(path=p)


def _key_of_name(name: str) -> str:
    """``<key>.json`` / ``<key>.rerun-<time>.json`` -> ``<key>``."""
    return name.split(".", 1)[0]


def _fix(p: Path) -> str:
    return f"move it aside (mv {p} {p}.corrupt) and re-run the point, or restore it from a backup"
