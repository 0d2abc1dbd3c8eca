"""Selecting records of a results store: the one rule for ``--where`` (``gac report``, ``gac bench``,
``gac wandb backfill``).

A filter is ``{field: wanted}``. ``field`` is a job field (:data:`JOB_FIELDS`), ``key``, a config path
(``align.window``, ``compressor.options.alpha``, optionally written ``config.align.window``), or else a record's
top-level number (``aligned_fraction``, ``params``, ``budget``), ``status``, ``created``, a metric name or a
provenance field. A record's value matches ``wanted`` (:func:`matches`) when

* a number (not a bool): ``wanted`` is a number, or text that reads as one, within a relative :data:`REL_TOL`
  (``math.isclose``). The wanted value is the decimal the config held (``ratio=0.15``), so it differs from the
  stored float by rounding only, whatever the magnitude: a relative tolerance holds for ``params=1234567890`` and
  for ``lr=1e-5`` alike, where an absolute one is too loose for the one and too tight for the other;
* a bool: ``true``/``false`` or ``1``/``0`` (``eval.ppl=1`` and ``eval.ppl=true`` both select ``eval.ppl: true``);
* absent (None, NaN): ``none``, ``null`` or the empty text;
* a list: JSON (``[1, 2]``), Hydra's ``[a,b]`` or a Python sequence, element by element by the same rule;
* anything else: its text.

A field given twice (:class:`AnyOf`, built by :func:`add_filter`) keeps either value (OR); different fields must
all match (AND).

A baseline record (the uncompressed model) passes a filter on what it does not depend on (:func:`baseline_passes`:
the compression settings, the sweep and experiment labels) when a compressed record of its model matches: one
baseline serves every sweep, ratio and method of its model. ``gac report``, ``gac bench`` and ``gac wandb
backfill`` all select by this rule (:func:`filter_keep`).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence

from gac.errors import GacError
from gac.registry import is_baseline

#: the record's ``job`` fields (what a sweep point is): filters on them read ``record["job"]``
JOB_FIELDS = ("model", "compressor", "proxy", "strategy", "ratio", "unit", "gpu", "seq_len", "experiment", "sweep")
#: top-level record fields a filter may name
RECORD_FIELDS = ("aligned_fraction", "params", "budget", "status", "created")
#: relative tolerance of a numeric match (see the module docstring)
REL_TOL = 1e-9
#: config keys (first component) that tell methods apart: a table's rows differ in them by design
METHOD_SETTINGS = ("compressor", "align", "proxy", "allocation", "model_compressor")
#: config keys (first component) the baseline does not depend on: a baseline fits any value of these
COMPRESSION_SETTINGS = METHOD_SETTINGS + ("ratio", "calibration")
#: job fields and labels the baseline does not depend on (``sweep``/``experiment``: one baseline serves every sweep)
BASELINE_FREE_FIELDS = ("sweep", "experiment", "key", "proxy", "strategy", "ratio", "unit")
#: a record without the field (unlike None, which is a value: ``--where proxy=none``)
MISSING = object()
_NONE_WORDS = ("none", "null", "")


class AnyOf(tuple):
    """A record filter's alternatives: ``--where compressor=asvd --where compressor=llm_pruner`` keeps the records
    whose compressor is either (repeated keys mean OR, different keys AND)."""

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


def parse_where(items: Sequence[str] | Mapping | None) -> dict:
    """``["compressor=asvd", "ratio=0.15"]`` (``--where`` items) or a nested dict (Hydra's ``+where.a.b=1``) ->
    ``{"compressor": "asvd", "ratio": "0.15"}``; a key given twice keeps either value: ``["compressor=asvd",
    "compressor=palu"]`` -> ``{"compressor": AnyOf(("asvd", "palu"))}``."""
    if not items:
        return {}
    out: dict = {}
    if isinstance(items, Mapping):
        def flat(d, prefix=""):
            for k, v in d.items():
                if isinstance(v, Mapping) and v:
                    flat(v, f"{prefix}{k}.")
                else:
                    out[f"{prefix}{k}"] = v

        flat(items)
        return out
    for item in items:
        k, sep, v = str(item).partition("=")
        if not sep or not k.strip():
            raise GacError(f"--where {item!r}: expected KEY=VALUE, e.g. --where compressor=asvd --where ratio=0.15")
        add_filter(out, k.strip(), v.strip())
    return out


# ---------------------------------------------------------------------------------------------- a record's value
def config_value(config, path: str):
    """The value at a dotted ``path`` of a config: nested (``{"align": {"window": 8}}``) or flat
    (``{"align.window": 8}``, the tidy frame's); :data:`MISSING` when absent."""
    path = path.removeprefix("config.")
    if not isinstance(config, Mapping):
        return MISSING
    if path in config:
        return config[path]
    cur = config
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return MISSING
        cur = cur[part]
    return cur


def lookup(rec: Mapping, field: str):
    """A store record's value of a filter ``field`` (see the module docstring), or :data:`MISSING`."""
    if field == "key":
        return rec.get("key", MISSING)
    if field in JOB_FIELDS:
        return (rec.get("job") or {}).get(field, MISSING)
    v = config_value(rec.get("config"), field)
    if v is not MISSING:
        return v
    if field in RECORD_FIELDS:
        return rec.get(field, MISSING)
    for part in ("metrics", "provenance"):
        d = rec.get(part)
        if isinstance(d, Mapping) and field in d:
            return d[field]
    return MISSING


# ---------------------------------------------------------------------------------------------- the match rule
def _is_none(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def is_number(v, finite: bool = False) -> bool:
    """Whether ``v`` is a number: a real number that is not a bool (numpy scalars included); with ``finite``, NaN
    and the infinities are not. The one rule of the store's checks, the filters and the frame's readers."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and (not finite or math.isfinite(v))


def number_of(v) -> float | None:
    """``v`` as a float when it is a number (:func:`is_number`) or text that reads as one; else None."""
    if is_number(v):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def same_number(a: float, b: float) -> bool:
    """Two numbers are the same setting: equal within the relative :data:`REL_TOL`."""
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=0.0)


def _items(want) -> list | None:
    """A wanted list: a Python sequence, JSON text (``[1, 2]``) or Hydra's ``[a,b]``; None if it is not one."""
    if isinstance(want, (list, tuple)):
        return list(want)
    if not isinstance(want, str):
        return None
    text = want.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        got = json.loads(text)
        if isinstance(got, list):
            return got
    except ValueError:
        pass
    inner = text[1:-1].strip()
    return [x.strip().strip("'\"") for x in inner.split(",")] if inner else []


def matches(value, want) -> bool:
    """Whether a record's ``value`` matches the ``wanted`` filter value (:class:`AnyOf`: any of them), by the rule
    of the module docstring. ``want`` may be text (the command line) or a typed value (Python, a Hydra dict)."""
    if value is MISSING:
        return False
    if isinstance(want, AnyOf):
        return any(matches(value, w) for w in want)
    if _is_none(value):
        return _is_none(want) or (isinstance(want, str) and want.strip().lower() in _NONE_WORDS)
    if _is_none(want):
        return False
    if isinstance(value, bool):
        w = str(int(want)) if isinstance(want, bool) else str(want).strip().lower()
        return w in (str(value).lower(), str(int(value)))
    if is_number(value):
        n = number_of(want)
        return n is not None and same_number(value, n)
    if isinstance(value, (list, tuple)):
        items = _items(want)
        return items is not None and len(items) == len(value) and all(matches(v, w) for v, w in zip(value, items))
    if isinstance(value, Mapping):
        if isinstance(want, str):
            try:
                want = json.loads(want)
            except ValueError:
                return False
        if not isinstance(want, Mapping):
            return False
        w = {str(k): x for k, x in want.items()}
        return set(w) == {str(k) for k in value} and all(matches(x, w[str(k)]) for k, x in value.items())
    if is_number(want):  # a text value against a typed number: compare as numbers when the text is one
        n = number_of(value)
        return n is not None and same_number(n, want)
    if isinstance(want, bool):
        return str(value).strip().lower() in (str(want).lower(), str(int(want)))
    return str(value) == str(want)


def baseline_passes(field: str) -> bool:
    """Whether a baseline record passes a filter on ``field`` whatever its value (the module docstring): a job field
    or label in :data:`BASELINE_FREE_FIELDS`, a config path under :data:`COMPRESSION_SETTINGS`."""
    f = str(field).removeprefix("config.")
    if f in JOB_FIELDS or f in RECORD_FIELDS or f == "key":
        return f in BASELINE_FREE_FIELDS
    return f.split(".", 1)[0] in COMPRESSION_SETTINGS


def filter_keep(values: Sequence, baselines: Sequence[bool], models: Sequence, field: str, want) -> list[bool] | None:
    """Which records pass the filter ``field=want``, given each record's value of ``field``, whether it is a
    baseline and its model: those whose value :func:`matches`, and a baseline on a field it does not depend on
    (:func:`baseline_passes`) when a compressed record of its model matches. None when no record matches (a
    baseline passing on such a field alone is no match)."""
    hits = [matches(v, want) for v in values]
    if not any(hits):
        return None
    if not baseline_passes(field):
        return hits
    matched = {str(m) for m, h, b in zip(models, hits, baselines) if h and not b}
    return [h or (b and str(m) in matched) for h, b, m in zip(hits, baselines, models)]


def is_baseline_record(rec: Mapping) -> bool:
    """Whether a store record is the uncompressed baseline (:func:`gac.registry.is_baseline` of its job)."""
    job = rec.get("job") or {}
    return is_baseline(job.get("compressor"), job.get("strategy"))


def describe_where(where: Mapping) -> str:
    """``{"compressor": AnyOf(("asvd", "palu")), "ratio": "0.15"}`` -> ``"compressor=asvd|palu, ratio='0.15'"``."""
    return ", ".join(f"{k}={str(v) if isinstance(v, AnyOf) else repr(v)}" for k, v in where.items())


# ---------------------------------------------------------------------------------------------- the query
def latest_per_key(records: Iterable[Mapping]) -> list[dict]:
    """One record per key: the latest ``created`` wins (a forced re-run sits beside the original)."""
    best: dict = {}
    for r in records:
        k = r.get("key")
        if k not in best or str(r.get("created", "")) >= str(best[k].get("created", "")):
            best[k] = r
    return list(best.values())


def select_records(records: Iterable[Mapping], where: Mapping | None = None, sweep: str | None = None,
                   experiment: str | None = None, keys: Sequence[str] | None = None) -> list[dict]:
    """The completed records matching every filter (the latest per key). Unknown filter keys and an empty
    selection are errors that name the keys and the values there are."""
    records = [r for r in records if r.get("status", "completed") == "completed"]
    if not records:
        raise GacError("the results store has no completed records; run the sweep first (python experiments/run.py -m ...)")
    filters = dict(where or {})
    if sweep is not None:
        filters["sweep"] = sweep
    if experiment is not None:
        filters["experiment"] = experiment
    for k in filters:
        if all(lookup(r, k) is MISSING for r in records):
            raise GacError(f"unknown filter key {k!r}: no record has it; use a job field ({', '.join(JOB_FIELDS)}), "
                           f"'key', or a config path such as compressor.options.alpha")
    out = records
    if keys:
        wanted = set(keys)
        out = [r for r in out if r.get("key") in wanted]
    for k, v in filters.items():
        keep = filter_keep([lookup(r, k) for r in out], [is_baseline_record(r) for r in out],
                           [lookup(r, "model") for r in out], k, v)
        out = [r for r, kept in zip(out, keep or ()) if kept]
    if not out:
        avail = {k: sorted({str(lookup(r, k)) for r in records if lookup(r, k) is not MISSING})[:12] for k in filters}
        what = describe_where(filters) or (f"{len(keys)} record keys" if keys else "no filter")
        raise GacError(f"no completed record matches {what}; values in the store: "
                       f"{'; '.join(f'{k}: {v}' for k, v in avail.items()) or 'none'}")
    return latest_per_key(out)
