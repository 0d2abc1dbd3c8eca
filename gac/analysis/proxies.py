"""How the importance proxies compare, from the tidy results frame (:func:`gac.analysis.load_results`): the
dims each proxy's plan chose (Figure 2), how many are misaligned, unaligned against GAC per proxy; and how aligned
each method's chosen dims are.

The filters and what a table may hold are the package's rule (:mod:`gac.analysis`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from gac.align.candidates import DEFAULT_UNIT
from gac.analysis.labels import baseline_mask, compressor_label, method_label, method_order, proxy_order
from gac.analysis.load import plan_dims
from gac.analysis.method_table import ALIGN_COL, table5
from gac.analysis.selection import completed, distinct_values, filter_settings, one_setting, resolve
from gac.errors import GacError
from gac.registry import BASELINE_LABEL


def proxy_dims(
    df: pd.DataFrame,
    *,
    model: str | None = None,
    compressor: str | None = None,
    ratio: float | None = None,
    strategy: str = "unaligned",
    unit: int = DEFAULT_UNIT,
    where: Mapping[str, object] | None = None,
) -> pd.DataFrame:
    """The plan dims of one (model, compressor, ratio, strategy) per proxy, one row per target (see
    :func:`gac.analysis.plan_dims`): what Figure 2 scatters."""
    what = "proxy comparison"
    df = completed(df)
    df = df[df["dims"].map(lambda d: isinstance(d, Mapping) and len(d) > 0)]
    df = df[df["strategy"].astype(str) == str(strategy)]
    if df.empty:
        raise GacError(f"{what}: no records with a plan and strategy {strategy!r}; proxy comparison needs "
                       f"allocation runs that saved their plan")
    df, model = resolve(df, "model", model, what)
    df, ratio = resolve(df, "ratio", ratio, what)
    df, compressor = resolve(df, "compressor", compressor, what)
    df = one_setting(filter_settings(df, where, what), what, slot=("proxy",), axes=("proxy",))
    return plan_dims(df, unit=unit)


def proxy_comparison(dims: pd.DataFrame, units: Sequence[int] = (8, 16, 32)) -> pd.DataFrame:
    """Misaligned fraction per proxy (rows) from :func:`proxy_dims`: ``targets`` and ``misaligned <u> (%)``
    for each unit in ``units``."""
    rows = []
    for proxy in proxy_order(dims["proxy"]):
        g = dims[dims["proxy"].astype(str) == proxy]
        r = {"targets": float(len(g))}
        for u in units:
            r[f"misaligned {u} (%)"] = 100.0 * float((g["dim"] % u != 0).mean())
        rows.append((proxy, r))
    out = pd.DataFrame([r for _, r in rows], index=pd.Index([p for p, _ in rows], name="Proxy"))
    out.attrs["formats"] = {"targets": "{:.0f}", **{f"misaligned {u} (%)": "{:.0f}%" for u in units}}
    return out


def proxy_quality(
    df: pd.DataFrame,
    *,
    model: str | None = None,
    gpu: str | None = None,
    compressor: str | None = None,
    ratio: float | None = None,
    seq_len: int | None = None,
) -> pd.DataFrame:
    """Per proxy, unaligned against GAC at the same budget: the Table 5 columns of one (model, compressor, ratio)
    for each proxy (rows ``(proxy, method)``; no baseline row, columns nothing measured are dropped). Raises
    :class:`GacError` when no record of it measured quality (the proxy comparison ran with ``eval=none``)."""
    what = "proxy quality"
    df = completed(df)
    comp = df[~baseline_mask(df)]
    comp, model = resolve(comp, "model", model, what)
    comp, compressor = resolve(comp, "compressor", compressor, what)
    comp, ratio = resolve(comp, "ratio", ratio, what)
    parts, formats, notes = [], {}, []
    for proxy in proxy_order(distinct_values(comp["proxy"])):
        t = table5(comp[comp["proxy"].astype(str) == str(proxy)], model=model, gpu=gpu, ratio=ratio,
                   seq_len=seq_len, compressors=[compressor], proxy=str(proxy), baseline_row=False)
        formats.update(t.attrs["formats"])
        notes.append((t.attrs.get("task_note") or "", t.attrs.get("task_columns") or []))
        t = t.drop(index=BASELINE_LABEL, errors="ignore")
        t.index = pd.MultiIndex.from_tuples([(str(proxy), m) for m in t.index], names=["Proxy", "Method"])
        parts.append(t)
    if not parts:
        raise GacError(f"{what}: no {compressor} records for {model} at ratio {ratio}")
    out = pd.concat(parts)
    measured = [c for c in out.columns if c != ALIGN_COL and out[c].notna().any()]
    if not measured:
        raise GacError(f"{what}: no record measured perplexity, tasks or latency (eval=none); run the proxy "
                       f"comparison with eval=default for its quality columns")
    out = out[[ALIGN_COL] + measured]
    out.attrs["formats"] = {c: f for c, f in formats.items() if c in out.columns}
    note = "; ".join(dict.fromkeys(n for n, cols in notes if n and any(c in out.columns for c in cols)))
    out.attrs["caption"] = (f"Proxy comparison: {compressor_label(compressor)} on {model} at ratio {float(ratio):g}, "
                            f"unaligned against GAC at the same budget, per proxy")
    if note:
        out.attrs["caption"] += f" ({note})"
    return out


def alignment_table(dims: pd.DataFrame, units: Sequence[int] = (8, 16, 32)) -> pd.DataFrame:
    """Per method (rows, from :func:`gac.analysis.plan_dims`): ``targets``, ``dense`` (left unfactorised) and the
    share of chosen dims that are multiples of each unit, ``aligned <u> (%)``; where d* is known, also the mean
    ``|d - d*|``."""
    rows = []
    pairs = sorted(dict.fromkeys(zip(dims["compressor"].astype(str), dims["strategy"].astype(str))),
                   key=lambda cs: method_order(*cs))
    for c, s in pairs:
        g = dims[(dims["compressor"].astype(str) == c) & (dims["strategy"].astype(str) == s)]
        r = {"targets": float(len(g)), "dense": float(g["dense"].sum()) if "dense" in g.columns else math.nan}
        for u in units:
            r[f"aligned {u} (%)"] = 100.0 * float((g["dim"] % u == 0).mean())
        if "d_star" in g.columns and g["d_star"].notna().any():
            r["mean |d - d*|"] = float((g["dim"] - g["d_star"]).abs().mean())
        rows.append((method_label(c, s), r))
    out = pd.DataFrame([r for _, r in rows], index=pd.Index([m for m, _ in rows], name="Method"))
    out.attrs["formats"] = {"targets": "{:.0f}", "dense": "{:.0f}", "mean |d - d*|": "{:.2f}",
                            **{f"aligned {u} (%)": "{:.0f}%" for u in units}}
    return out
