"""Stage outputs and attempts, beside the store: what a requeued or relaunched job resumes from.

Every finished stage leaves its output under ``<results_dir>/work/<key>/`` (the plan, each metric group) with the
attempt that wrote it (:class:`StageOutputs`); :class:`Attempt` is one run of the job over them, as a context
manager: it records its start, how far it got, and how it ended in ``attempts.json``, and keeps disk space in reserve
so that end can be written on a full disk.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gac.errors import GacError
from gac.hashing import digest, file_sha256
from gac.io import read_json, write_json_atomic
from gac.machine import utc_stamp
from gac.metrics import DECODE, PREFILL
from gac.results import ResultsStore

log = logging.getLogger(__name__)

class StageOutputs:
    """Stage outputs of one job under ``<results_dir>/work/<key>/`` (what a requeued job resumes from).

    ``attempts.json`` lists the job's attempts and, per stage output, the attempt that wrote it and the sha256 of
    the file it wrote; each output file names its key, stage and attempt. A job resumes only an output an attempt of
    this key wrote and nobody changed since, with the types its stage produces: a file planted or edited in the
    work directory is reported and recomputed, never trusted. A damaged ``attempts.json`` (not JSON, another shape)
    stops the job before any work with one line saying what to remove."""

    FILE_FORMAT = "gac-stage-output"

    def __init__(self, store: ResultsStore, key: str):
        self.dir = store.root / "work" / key
        self.key = key
        self.attempts: list[dict] = []
        self.outputs: dict[str, dict] = {}
        self.attempt_id: int | None = None

    @property
    def attempts_path(self) -> Path:
        return self.dir / "attempts.json"

    def _fix(self) -> str:
        return (f"remove the work directory (rm -r {self.dir}) and re-run: the point then starts again from its first "
                f"stage (nothing finished is lost: records live under records/)")

    def remove(self) -> None:
        import shutil

        if self.dir.is_symlink() or self.dir.is_file():
            self.dir.unlink()
        elif self.dir.exists():
            shutil.rmtree(self.dir)

    def load(self) -> None:
        """Read and check ``attempts.json`` and the directory's entries (before any work)."""
        if self.dir.is_symlink() or (self.dir.exists() and not self.dir.is_dir()):
            raise GacError(f"{str(self.dir)!r} is not a directory (gac keeps a job's finished stages there); "
                           f"{self._fix()}")
        if not self.dir.exists():
            return
        for entry in self.dir.iterdir():
            if entry.name.endswith(".json") and (entry.is_symlink() or not entry.is_file()):
                raise GacError(f"{str(entry)!r} is not a plain file (a link or a directory where a job writes a stage "
                               f"output); {self._fix()}")
        p = self.attempts_path
        if not p.exists():
            return
        try:
            doc = read_json(p, "attempts file", max_bytes=16 << 20)
        except GacError as e:
            raise GacError(f"{e}; {self._fix()}") from None
        problem = _attempts_problem(doc)
        if problem:
            raise GacError(f"attempts file {str(p)!r} {problem}; {self._fix()}")
        self.attempts = list(doc["attempts"])
        self.outputs = dict(doc.get("outputs") or {})

    def save(self) -> None:
        write_json_atomic(self.attempts_path, {"attempts": self.attempts, "outputs": self.outputs}, overwrite=True)

    def get(self, name: str):
        """The output of stage ``name`` if an attempt of this job wrote it and it is unchanged and well-formed."""
        p = self.dir / f"{name}.json"
        entry = self.outputs.get(name)
        if entry is None:
            if p.exists():
                log.warning("ignoring %s: no attempt of job %s wrote it (planted, copied or left by an older gac); "
                            "the stage runs again", p, self.key)
            return None
        try:
            data = p.read_bytes()
        except OSError as e:
            log.warning("cannot read the stage output %s (%s); the stage runs again", p, e.strerror or e)
            return None
        if digest(data, None) != entry["sha256"]:
            log.warning("ignoring %s: it changed since attempt %s of job %s wrote it (sha256 differs); the stage runs "
                        "again", p, entry["attempt"], self.key)
            return None
        try:
            doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except ValueError:
            doc = None
        why = (_stage_output_problem(name, doc["output"]) if isinstance(doc, dict) and doc.get("format") ==
               self.FILE_FORMAT and (doc.get("key"), doc.get("stage"), doc.get("attempt")) ==
               (self.key, name, entry["attempt"]) and "output" in doc else "it is not this job's stage output")
        if why:
            log.warning("ignoring %s: %s; the stage runs again", p, why)
            return None
        return doc["output"]

    def put(self, name: str, obj) -> None:
        doc = {"format": self.FILE_FORMAT, "key": self.key, "stage": name, "attempt": self.attempt_id, "output": obj}
        p = write_json_atomic(self.dir / f"{name}.json", doc, overwrite=True)
        self.outputs[name] = {"attempt": self.attempt_id, "sha256": file_sha256(p)}
        self.save()


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _attempts_problem(doc) -> str | None:
    """What makes ``doc`` not an ``attempts.json`` a job wrote (None when nothing does)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("attempts"), list):
        return f"holds a {type(doc).__name__}, not an object with a list of attempts"
    seen = set()
    for a in doc["attempts"]:
        if not isinstance(a, dict) or not isinstance(a.get("attempt"), int) or isinstance(a["attempt"], bool) \
                or a["attempt"] < 1 or a["attempt"] in seen:
            return "lists an attempt that is not an object with its own attempt number"
        seen.add(a["attempt"])
    outputs = doc.get("outputs", {})
    if not isinstance(outputs, dict):
        return "has 'outputs' that are not an object"
    for name, e in outputs.items():
        if not isinstance(e, dict) or e.get("attempt") not in seen or not isinstance(e.get("sha256"), str) \
                or len(e["sha256"]) != 64:
            return f"has an entry for the output {name!r} that names no attempt of this job or no sha256"
    return None


def _stage_output_problem(name: str, out) -> str | None:
    """Why ``out`` is not what stage ``name`` writes (types and plausible values), or None."""
    from gac.metrics import check_metrics, metric_problem

    if not isinstance(out, dict):
        return f"it holds a {type(out).__name__}, not the stage's object"
    try:
        if name == "ppl":
            why = metric_problem("ppl_x", out.get("ppl")) if out.get("ppl") is not None else "it has no perplexity"
            return f"its perplexity {why}" if why else None
        if name == "tasks":
            if not isinstance(out.get("results"), dict) or not isinstance(out.get("metrics"), dict):
                return "it lacks the task results and metrics"
            check_metrics(out["metrics"], "tasks")
            return None
        if name == "saved":
            if not (isinstance(out.get("path"), str) and isinstance(out.get("meta_sha256"), str)):
                return "it lacks the checkpoint's path and config hash"
            return None
        if name == "latency":
            for point, r in out.items():
                ms = r.get("median_ms") if isinstance(r, dict) else None
                why = metric_problem(DECODE if point == "decode" else PREFILL, ms) if ms is not None else "is missing"
                if why:
                    return f"its latency at {point!r} {why}"
            return None
    except GacError as e:
        return str(e)
    return None


def saved_output(path) -> dict:
    """The ``saved`` stage output of a checkpoint this job wrote at ``path``: its resolved path and the sha256 of its
    config file (which holds the weights' hashes), so a resumed job knows the checkpoint there is its own, unchanged."""
    from gac.compression.checkpoint_format import META_FILE

    p = Path(path).expanduser().resolve()
    return {"path": str(p), "meta_sha256": file_sha256(p / META_FILE)}


def saved_by_this_job(outputs: StageOutputs, path) -> bool:
    """Whether an earlier attempt of this job saved the checkpoint at ``path`` and it is unchanged since (a job
    preempted after its save resumes without refusing, or replacing, its own checkpoint)."""
    from gac.compression.checkpoint_format import META_FILE

    saved = outputs.get("saved")
    if saved is None or not (Path(path).expanduser() / META_FILE).is_file():  # never read a fifo or a directory
        return False
    try:
        return saved == saved_output(path)
    except OSError:  # no checkpoint config there (any more): not this job's checkpoint
        return False


class Attempt:
    """One attempt at the job ``key``: ``with Attempt(store, key) as attempt:`` reads the earlier attempts (marking
    those that never said how they ended as interrupted), adds this one as ``running``, and reserves disk space for
    its end; :meth:`enter` records each stage it reaches (a kill leaves how far it got), :meth:`end` how it ended.
    ``fresh`` (a forced re-run) drops the earlier stage outputs first. ``timings`` holds the seconds per stage this
    attempt measured (a resumed stage adds none), ``resumed`` the stages it took from an earlier attempt."""

    def __init__(self, store: ResultsStore, key: str, fresh: bool = False):
        self.outputs = StageOutputs(store, key)
        self.key = key
        self.fresh = fresh
        self.timings: dict = {}
        self.resumed: list = []
        self.entry: dict = {}
        self._root = store.root
        self._reserve = None

    @property
    def attempts(self) -> list[dict]:
        return self.outputs.attempts

    @property
    def stage(self) -> str | None:
        return self.entry.get("stage")

    def __enter__(self) -> Attempt:
        from gac.jobs.run.provenance import attempt_info

        out = self.outputs
        if self.fresh:  # a forced re-run measures everything again
            out.remove()
        out.load()  # a damaged attempts.json: one line saying what to remove, before any work
        for a in out.attempts:
            if a.get("outcome") in (None, "running"):
                a["outcome"] = "interrupted"  # killed (or its node lost) before it could say how it ended
        self.entry = {"attempt": max([a["attempt"] for a in out.attempts], default=0) + 1, **attempt_info(),
                      "ended": None, "outcome": "running"}
        from gac.io import SpaceReserve

        self._reserve = SpaceReserve(self._root, f"space-reserve-{self.key}").take()  # room to record the end
        out.attempts.append(self.entry)
        out.attempt_id = self.entry["attempt"]
        try:
            out.save()
        except BaseException:
            self.release_space()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.release_space()

    def release_space(self) -> None:
        """Give the reserved space back (on a full disk: for the record, the outcome or the failure record)."""
        if self._reserve is not None:
            self._reserve.release()

    def enter(self, stage: str) -> None:
        """The attempt reaches ``stage``: saved now, so a kill leaves how far it got."""
        self.entry.update(stage=stage, timings=dict(self.timings))
        self.outputs.save()

    def end(self, outcome: str, error: str | None = None) -> None:
        """How the attempt ended (``completed``, ``failed`` or ``interrupted``), with its timings and resumed stages."""
        self.entry.update(ended=utc_stamp(), outcome=outcome,
                          timings=dict(self.timings), resumed=list(self.resumed))
        if error:
            self.entry["error"] = error

    def fail(self, error: str, interrupted: bool = False) -> None:
        """End the attempt as failed (or interrupted) with ``error`` and save that, never raising: the job's own
        error comes first."""
        self.end("interrupted" if interrupted else "failed", error)
        try:
            self.outputs.save()
        except Exception as e:  # noqa: BLE001 - never mask the job's own error
            log.warning("could not update the attempts of %s: %s", self.key, e)

    def save_after_record(self) -> None:
        """Save ``attempts.json`` once the record is written: a bookkeeping file must not fail the job then."""
        try:
            self.outputs.save()
        except GacError as e:
            log.warning("could not update %s: %s", self.outputs.attempts_path, e)

    def write_record(self, write):
        """``write()`` (the record's write), retried once with the reserved space given back on a full disk."""
        from gac.io import DISK_FULL

        try:
            path = write()
        except GacError as e:
            if getattr(e, "errno", None) not in DISK_FULL:
                raise
            self.release_space()  # the record first: the reserved space is its last chance
            path = write()
        self.release_space()
        return path
