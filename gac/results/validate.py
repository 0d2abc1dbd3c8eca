"""What a record and a bench record must be for a reader to trust them: :func:`record_problem` (its key is its file
name, its job fields and metrics have the types and ranges a job writes, its time is no later than a day ahead) and
:func:`bench_problem`. Every reader of a store applies them, and a job checks its own record the same way before
writing it."""

from __future__ import annotations

import time

from gac.machine import parse_stamp
from gac.registry import BASELINE
from gac.results.query import is_number

SCHEMA_VERSION = 1

def is_int(v) -> bool:
    """An integer as JSON gives it back: an int (not a bool) or an integral float."""
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()


def record_problem(rec, key: str, status: str = "completed") -> str | None:
    """What makes ``rec`` not a ``status`` gac record of ``key`` (None when nothing does): the checks every reader
    of a store applies, so that a record a job did not write (a copy under another name, a planted minimal file, a
    hand-edited metric) is refused instead of shown. A job checks its own record the same way before writing it."""
    if not isinstance(rec, dict):
        return f"holds a {type(rec).__name__}, not a record object"
    if rec.get("key") != key:
        return f"has key {rec.get('key')!r}, its file name says {key!r} (a record copied or renamed by hand)"
    if rec.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
        return f"has schema {rec.get('schema')!r}; this gac reads schema {SCHEMA_VERSION} (upgrade gac)"
    if rec.get("status") != status:
        return f"has status {rec.get('status')!r}, not {status!r}"
    job = rec.get("job")
    if not isinstance(job, dict):
        return "has no 'job' object (not a gac record)"
    for f in ("model", "compressor", "strategy"):
        if not isinstance(job.get(f), str) or not job.get(f):
            return f"has job.{f} {job.get(f)!r}, not a name (not a complete gac record)"
    for f in ("proxy", "gpu", "experiment", "sweep"):
        if job.get(f) is not None and not isinstance(job.get(f), str):
            return f"has job.{f} {job.get(f)!r}, not a name"
    ratio = job.get("ratio")
    if ratio is not None and not (is_number(ratio, finite=True)
                                  and (0 < ratio < 1 or ratio == 0 and job["compressor"] == BASELINE)):
        return f"has job.ratio {ratio!r}, not a number in (0, 1)"  # 0: a baseline as older gac wrote it
    for f in ("unit", "seq_len"):
        v = job.get(f)
        if v is not None and not (is_int(v) and v > 0):
            return f"has job.{f} {v!r}, not a positive integer"
    if status != "completed":
        return None
    from gac.metrics import metric_problem

    metrics = rec.get("metrics")
    if not isinstance(metrics, dict):
        return f"has 'metrics' of type {type(metrics).__name__}, not an object of numbers"
    for k, v in metrics.items():
        why = metric_problem(k, v)
        if why:
            return f"has metric {k!r} that {why}"
    af = rec.get("aligned_fraction")
    if af is not None and not (is_number(af, finite=True) and 0 <= af <= 1):
        return f"has aligned_fraction {af!r}, not a number in [0, 1]"
    for f in ("params", "budget"):
        v = rec.get(f)
        if v is not None and not (is_int(v) and v >= 0):
            return f"has {f} {v!r}, not a non-negative integer"
    timings = rec.get("timings")
    if timings is not None:
        if not isinstance(timings, dict):
            return f"has 'timings' of type {type(timings).__name__}, not an object"
        for k, v in timings.items():
            if not (is_number(v, finite=True) and v >= 0):
                return f"has timing {k!r} {v!r}, not a number of seconds >= 0"
    for f in ("plan", "config", "provenance", "evaluation", "stages"):
        if rec.get(f) is not None and not isinstance(rec.get(f), dict):
            return f"has {f!r} of type {type(rec.get(f)).__name__}, not an object"
    if not isinstance(rec.get("created"), str) or not _is_time_stamp(rec["created"]):
        return f"has 'created' {rec.get('created')!r}, not a time stamp (ISO 8601, e.g. 2025-01-01T00:00:00Z)"
    ahead = _seconds_ahead(rec["created"])
    if ahead is not None and ahead > MAX_CLOCK_AHEAD_S:
        return (f"has 'created' {rec['created']!r}, {ahead / 86400:,.1f} days in the future (the clock of the host that "
                f"wrote it is wrong, or it was edited): it would supersede every later re-run of its point")
    return None


MAX_CLOCK_AHEAD_S = 86400  # clocks on a cluster differ by seconds; a time zone mistake by hours; more is no clock


def _is_time_stamp(text: str) -> bool:
    """An ISO 8601 date and time, as gac writes ``created`` (``2025-01-01T00:00:00Z``): queries and "the latest
    record wins" compare them as text, which a free-form string would silently reorder."""
    return parse_stamp(text) is not None


def _seconds_ahead(created: str) -> float | None:
    """How far the record time ``created`` (``2025-01-03T00:00:00Z``) lies after now; None when it is no such time."""
    t = parse_stamp(created)
    return None if t is None else t - time.time()


def bench_problem(doc, key: str) -> str | None:
    """What makes ``doc`` not a gac bench record of ``key`` (None when nothing does)."""
    if not isinstance(doc, dict) or doc.get("kind") != "bench" or not isinstance(doc.get("variants"), list):
        return "is not a gac bench record (kind 'bench' with a list of variants)"
    if doc.get("key") != key:
        return f"has key {doc.get('key')!r}, its file name says {key!r} (a bench record copied or renamed by hand)"
    points = doc.get("points")
    if not isinstance(points, list) or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                               and is_int(p.get("batch")) and is_int(p.get("seq_len"))
                                               for p in points):
        return "has 'points' that are not a list of {name, batch, seq_len}"
    for v in doc["variants"]:
        if not isinstance(v, dict) or not isinstance(v.get("points") or {}, dict):
            return "has a variant that is not an object with its points"
        for name, e in (v.get("points") or {}).items():
            if not isinstance(e, dict):
                return f"has point {name!r} of a variant that is not an object"
            ms = e.get("median_ms")
            if not (is_number(ms, finite=True) and ms > 0):
                return f"has a median latency {ms!r} at {name!r}, not a number of ms > 0"
            why = _bench_numbers_problem(e, f" at {name!r}")
            if why:
                return why
        why = _bench_numbers_problem(v, f" of variant {v.get('label')!r}")
        if why:
            return why
        if v.get("median_ms") is not None and not (is_number(v["median_ms"], finite=True) and v["median_ms"] > 0):
            return f"has a median latency {v['median_ms']!r} of variant {v.get('label')!r}, not a number of ms > 0"
        dec = v.get("decode")
        if dec is not None and not (isinstance(dec, dict) and is_number(dec.get("ms_per_token"), finite=True)
                                    and dec["ms_per_token"] > 0 and not _bench_numbers_problem(dec, "")):
            return f"has a decode entry of variant {v.get('label')!r} without a positive ms_per_token and ratio"
    # what `gac bench` shows of a stored record: every variant measured at every point, the device and protocol
    names = [p["name"] for p in points]
    for v in doc["variants"]:
        if not isinstance(v.get("label"), str) or not isinstance(v.get("baseline"), bool):
            return "has a variant without a label or a baseline flag"
        missing = [n for n in names if n not in (v.get("points") or {})]
        if missing:
            return f"has variant {v['label']!r} without the point(s) {missing} the record lists"
    dev, prot, boot = doc.get("device"), doc.get("protocol"), doc.get("bootstrap")
    if not (isinstance(dev, dict) and isinstance(dev.get("name"), str) and isinstance(dev.get("type"), str)):
        return "has no 'device' object with its name and type"
    if not isinstance(prot, dict) or not isinstance(boot, dict) or not isinstance(doc.get("dtype"), str):
        return "has no 'protocol', 'bootstrap' or 'dtype' as a bench writes them"
    return None


_BENCH_RATIOS = ("ratio_to_baseline", "ratio_to_unaligned", "flops_ratio", "alignment_efficiency")


def _bench_numbers_problem(e: dict, where: str) -> str | None:
    """What is wrong with the ratios and intervals of one bench entry (a point, a variant or its decode), if
    anything: each present ratio a positive finite number, each interval two finite numbers."""
    for f in _BENCH_RATIOS:
        if e.get(f) is not None and not (is_number(e[f], finite=True) and e[f] > 0):
            return f"has {f} {e[f]!r}{where}, not a positive number"
    for f in ("ratio_ci95", "ratio_to_unaligned_ci95"):
        ci = e.get(f)
        if ci is not None and not (isinstance(ci, list) and len(ci) == 2
                                   and all(is_number(x, finite=True) for x in ci)):
            return f"has {f} {ci!r}{where}, not two numbers"
    return None
