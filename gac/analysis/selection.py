"""Which records of the tidy frame a table holds: completed records, one value per axis (:func:`resolve`), the
latest re-run per key, ``where`` filters (the rule of :mod:`gac.results.query`, plus a baseline's free pass on the
settings it does not depend on), and the setting groups that keep records of different settings apart.

Only re-runs of the same job (one record key) collapse to the latest ``created``; records that differ in any other
setting (``align.window``, ``eval.limit``, ...) are never merged into one row: a table that would mix them raises a
:class:`GacError` naming the setting (filter with ``where={"align.window": 8}``, ``sweep``, ``experiment``), and
:func:`setting_groups` splits them (what ``gac report`` does).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import pandas as pd

from gac.analysis.labels import compressor_label, is_baseline
from gac.errors import GacError
from gac.results.query import (
    COMPRESSION_SETTINGS,
    METHOD_SETTINGS,
    MISSING,
    AnyOf,
    config_value,
    filter_keep,
    is_number,
    matches,
    same_number,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- selection
def completed(df: pd.DataFrame) -> pd.DataFrame:
    if "status" not in df.columns:
        return df
    return df[df["status"].fillna("completed") == "completed"]


def distinct_values(s: pd.Series) -> list:
    """The distinct non-missing values of a column, sorted."""
    return sorted({v for v in s.tolist() if v is not None and not (isinstance(v, float) and math.isnan(v))},
                  key=lambda v: (str(type(v)), v))


def match_column(s: pd.Series, value) -> pd.Series:
    """Which cells of ``s`` match ``value`` (:func:`gac.results.query.matches`)."""
    return s.map(lambda v: matches(v, value)).astype(bool)


def resolve(df: pd.DataFrame, field: str, value, what: str) -> tuple[pd.DataFrame, object]:
    """Filter ``df`` on ``field == value``; with ``value=None`` the field must be unambiguous."""
    if value is not None:
        out = df[match_column(df[field], value)]
        if out.empty:
            raise GacError(f"{what}: no records with {field}={value!r}; available: {distinct_values(df[field])}")
        return out, value
    vals = distinct_values(df[field])
    if len(vals) > 1:
        raise GacError(f"{what}: the records hold several {field}s {vals}; choose one ({field}=...)")
    return df, (vals[0] if vals else None)


def resolve_point(df: pd.DataFrame, model, gpu, seq_len, what: str) -> tuple[pd.DataFrame, object, object, object]:
    """The completed records of one (model, gpu, seq_len) point: :func:`completed`, then :func:`resolve` of each
    (a None must be unambiguous). Returns ``(df, model, gpu, seq_len)``."""
    df = completed(df)
    df, model = resolve(df, "model", model, what)
    df, gpu = resolve(df, "gpu", gpu, what)
    df, seq_len = resolve(df, "seq_len", seq_len, what)
    return df, model, gpu, seq_len


def latest_per_key(df: pd.DataFrame) -> pd.DataFrame:
    """One row per record ``key``: the latest ``created`` wins. Only re-runs of the *same* job share a key (a
    forced re-run goes beside the original record); records of different configs never replace each other."""
    if df.empty:
        return df
    order = df.assign(_created=df["created"].fillna("").astype(str), _path=df["path"].fillna("").astype(str))
    order = order.sort_values(["_created", "_path"], kind="stable")
    dup = order.duplicated(["key"], keep="last")
    if dup.any():
        log.info("%d older record(s) superseded by a later re-run of the same job (same key)", int(dup.sum()))
    return order[~dup].drop(columns=["_created", "_path"])


# ---------------------------------------------------------------------------------------------- settings
#: config keys (first component) that tell methods apart: they differ between a table's rows by design; a baseline
#: row fits any value of :data:`~gac.results.query.COMPRESSION_SETTINGS` (one baseline serves every sweep of its model)
ROW_SETTINGS = METHOD_SETTINGS
_FRAME_FILTERS = ("sweep", "experiment", "key", "proxy", "strategy", "compressor", "ratio", "model", "gpu",
                  "seq_len", "unit")
#: a latency-budget plan's budget (frame columns of its record's ``latency_budget`` block): part of every slot, so
#: plans at different budgets are different rows (named by their budget), not a setting that splits the table
LATENCY_BUDGET_SLOT = ("budget_kind", "latency_reference", "latency_share", "latency_budget_ms")
#: settings a latency-against-S figure may span (its records measured different points)
LATENCY_AXES = ("seq_len", "eval.latency_seq_lens", "eval.latency_batches")
_ANY = object()  # a setting that does not apply to a row (a baseline's compression setting, an absent key)


def _top(field: str) -> str:
    return field.split(".", 1)[0]


def _setting(row: Mapping, field: str, baseline: bool):
    """A row's value of ``field`` (a config key such as ``eval.limit``, or ``key``), or :data:`_ANY`."""
    if field == "key":
        return _ANY if baseline else str(row.get("key"))
    if baseline and _top(field) in COMPRESSION_SETTINGS:
        return _ANY
    cfg = row.get("config")
    if not isinstance(cfg, Mapping) or field not in cfg:
        return _ANY
    v = cfg[field]
    return tuple(v) if isinstance(v, list) else v


def show_value(v) -> str:
    if isinstance(v, AnyOf):
        return "|".join(show_value(x) for x in v)
    if isinstance(v, tuple):
        return "[" + ",".join(str(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe_setting(setting: Mapping) -> str:
    """``{"align.window": 8, "eval.limit": 50}`` -> ``"align.window=8, eval.limit=50"``."""
    return ", ".join(f"{k}={show_value(v)}" for k, v in setting.items())


def _same(a, b) -> bool:
    if a is _ANY or b is _ANY:
        return True
    if is_number(a) and is_number(b):
        return same_number(a, b)
    return show_value(a) == show_value(b)


def setting_groups(df: pd.DataFrame, slot: Sequence[str] = ("compressor", "strategy"),
                   axes: Sequence[str] = ()) -> list[tuple[dict, pd.DataFrame]]:
    """Split records into groups that may share one table, without dropping any.

    Re-runs of the same key are collapsed first (the latest wins: :func:`latest_per_key`). Within one group,
    every *slot* (a table row: the ``slot`` columns, e.g. compressor and strategy) holds at most one record, and
    every config setting outside :data:`ROW_SETTINGS` and ``axes`` (the table's own axes, e.g. ``ratio`` in a
    ratio sweep) has one value (a baseline row fits any value of :data:`COMPRESSION_SETTINGS`). A setting that
    distinguishes records (``align.window`` 1 vs 8, ``eval.limit`` 50 vs 200) splits the records; records that
    collide without any differing setting (no config, e.g. a W&B export) are split by ``key``.

    Returns ``[(setting, frame)]``: ``setting`` is ``{field: value}`` of what tells this group from the others
    (``{}`` when there is one group); a baseline record may sit in several groups.
    """
    df = latest_per_key(df)
    if df.empty:
        return [({}, df)]
    slot = tuple(slot) + tuple(c for c in LATENCY_BUDGET_SLOT if c in df.columns and c not in slot)
    recs = df.to_dict("records")
    is_base = [is_baseline(r["compressor"], r["strategy"]) for r in recs]
    fields = sorted({f for r in recs for f in (r.get("config") or {})})
    axes = {str(a) for a in axes}

    def differs(rows: list[int], field: str) -> bool:
        vals = [_setting(recs[i], field, is_base[i]) for i in rows]
        vals = [v for v in vals if v is not _ANY]
        return any(not _same(vals[0], v) for v in vals[1:])

    everyone = list(range(len(recs)))
    split = [f for f in fields if _top(f) not in ROW_SETTINGS and f not in axes and _top(f) not in axes
             and differs(everyone, f)]
    slots: dict[tuple, list[int]] = {}
    for i, r in enumerate(recs):
        if not is_base[i]:
            slots.setdefault(tuple(show_value(r.get(c)) for c in slot), []).append(i)
    split += [f for f in fields if f not in split and _top(f) in ROW_SETTINGS
              and any(len(rows) > 1 and differs(rows, f) for rows in slots.values())]

    collide: set[int] = set()  # rows whose slot holds 2+ records (only these need "key" to tell them apart)

    def value(i: int, f: str):
        if f == "key" and i not in collide:
            return _ANY
        return _setting(recs[i], f, is_base[i])

    def grouped(split):
        sigs = list(dict.fromkeys(tuple(value(i, f) for f in split) for i in everyone))
        # a signature with a wildcard where another has a value, and agreeing elsewhere, is covered by it
        keep = [s for s in sigs if not any(t != s and all(a is _ANY or (b is not _ANY and _same(a, b))
                                                          for a, b in zip(s, t)) for t in sigs)]
        out = []
        for s in keep:
            rows = [i for i in everyone if all(_same(value(i, f), v) for f, v in zip(split, s))]
            out.append(({f: v for f, v in zip(split, s) if v is not _ANY}, rows))
        return out

    groups = grouped(split)
    clash = [srows for _, rows in groups for srows in slots.values() if len(set(rows) & set(srows)) > 1]
    if clash:  # the same slot twice without a config that tells them apart (e.g. a W&B export without config)
        collide = {i for srows in clash for i in srows}
        groups = grouped(split + ["key"])
    if not split and len(groups) == 1:
        return [({}, df)]
    return [(setting, df.iloc[rows]) for setting, rows in groups]


def frame_value(row: Mapping, field: str, columns) -> object:
    """A frame row's value of a filter ``field``: its column (job fields, ``key``, metrics, ...), else its config
    path in the row's flat ``config`` (:data:`gac.results.query.MISSING` when absent): the value
    :func:`gac.results.query.lookup` reads from the store record."""
    if field in columns and field != "config":
        return row.get(field)
    return config_value(row.get("config"), field)


def filter_settings(df: pd.DataFrame, where: Mapping[str, object] | None, what: str) -> pd.DataFrame:
    """Keep the records whose frame column or config setting ``field`` matches the value, for each item of
    ``where`` (``{"sweep": "s1"}``, ``{"align.window": 8}``), by the one selection rule of
    :func:`gac.results.query.filter_keep` (``gac bench`` and ``gac wandb backfill`` select by it too): a baseline
    record passes on the settings it does not depend on when a compressed record of its model matches."""
    if not where:
        return df

    def keep(frame: pd.DataFrame, field: str, value):
        rows = frame.to_dict("records")
        return filter_keep([frame_value(r, field, frame.columns) for r in rows],
                           [is_baseline(r["compressor"], r["strategy"]) for r in rows], [r.get("model") for r in rows],
                           field, value)

    known = {f for c in df["config"] if isinstance(c, Mapping) for f in c} if "config" in df.columns else set()
    out = df
    for field, value in where.items():  # one filter after the other, as gac.results.query.select_records applies them
        field = str(field)
        if field not in _FRAME_FILTERS and field not in df.columns and field.removeprefix("config.") not in known:
            raise GacError(f"{what}: no records have a setting {field!r}; filter by a config key such as "
                           f"{sorted(known)[:3]} or by {', '.join(_FRAME_FILTERS[:2])}")
        if keep(df, field, value) is None:  # only baselines would pass (they fit any value of a compression setting)
            raise GacError(f"{what}: no records match {field}={show_value(value)}; values in the records: "
                           f"{_values_of(df, field)}")
        hit = keep(out, field, value) if len(out) else None
        out = out[pd.Series(hit, index=out.index)] if hit is not None else out.iloc[:0]
    if out.empty:
        raise GacError(f"{what}: no records match {describe_setting(where)}; check the filter values")
    return out


def _values_of(df: pd.DataFrame, field: str) -> list[str]:
    if field in df.columns and field != "config":
        return [show_value(v) for v in distinct_values(df[field])]
    vals = {show_value(v) for c in df["config"] for v in (config_value(c, field),) if v is not MISSING}
    return sorted(vals)


def one_setting(df: pd.DataFrame, what: str, slot: Sequence[str] = ("compressor", "strategy"),
                axes: Sequence[str] = ()) -> pd.DataFrame:
    """The records as one table's rows, or a :class:`GacError` naming the settings that tell them apart (choose
    with ``where=``; ``gac report`` writes one table per setting instead)."""
    groups = setting_groups(df, slot, axes)
    if len(groups) == 1:
        return groups[0][1]
    fields = list(dict.fromkeys(f for s, _ in groups for f in s))
    options = "; ".join(describe_setting(s) for s, _ in groups)
    raise GacError(f"{what}: the records differ in {', '.join(fields)} ({options}) and would be mixed in one "
                   f"table; choose one with where={{{fields[0]!r}: ...}} (gac report: --where KEY=VALUE, --sweep, "
                   f"--experiment; without a filter it writes one table per setting)")


def one_proxy(rows: pd.DataFrame, proxy, what: str) -> pd.DataFrame:
    """Keep one proxy per compressor: ``proxy`` as str (all compressors) or ``{compressor: proxy}``."""
    parts = []
    for comp, g in rows.groupby("compressor", sort=False):
        want = proxy.get(comp) if isinstance(proxy, Mapping) else proxy
        if want is not None:
            g = g[g["proxy"].astype(str) == str(want)]
        vals = distinct_values(g["proxy"])
        if len(vals) > 1:
            raise GacError(f"{what}: {compressor_label(comp)} has runs with several proxies {vals}; choose one "
                           f"(proxy=... or proxy={{{comp!r}: ...}})")
        parts.append(g)
    return pd.concat(parts) if parts else rows

