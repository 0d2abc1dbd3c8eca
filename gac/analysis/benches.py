"""A side-by-side bench (``gac bench``; its summaries are ``df.attrs["bench"]`` of
:func:`gac.analysis.load_results`) as a table's latency: which bench measured a table's rows, how its caption
names it, and its ratios as a long frame."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from gac.analysis.labels import DEFAULT_ENGINE, method_label, method_order
from gac.metrics import prefill_point


def latest_bench(bench: Sequence[Mapping] | None, model, covers: Callable[[Mapping], bool]) -> Mapping | None:
    """The latest bench summary of ``model`` (one naming no model counts for any) for which ``covers(summary)``
    holds, or None; the latest is the newest ``created``, then the last ``path``."""
    hits = [b for b in bench or () if (b.get("model") is None or str(b.get("model")) == str(model)) and covers(b)]
    if not hits:
        return None
    return max(hits, key=lambda b: (str(b.get("created") or ""), str(b.get("path") or "")))


def pick_bench(bench: Sequence[Mapping] | None, keys: Sequence[str], model, batch: int, seq_len) -> tuple | None:
    """The latest bench (summary, see :func:`gac.analysis.load.bench_summary`) of ``model`` that measured every
    record in ``keys`` at (``batch``, ``seq_len``): ``(summary, point)``, or None."""
    if not bench or not keys or seq_len is None:
        return None
    name = prefill_point(batch, seq_len)
    best = latest_bench(bench, model, lambda b: name in (b.get("points") or {})
                        and set(keys) <= set(b["points"][name]["variants"]))
    return None if best is None else (best, best["points"][name])


def bench_ratios(summary: Mapping) -> pd.DataFrame:
    """One side-by-side bench (a summary from ``df.attrs["bench"]``) as a long frame, one row per (measured
    record, point): ``method, compressor, strategy, ratio_param, key, batch, seq_len, ms, ratio, lo, hi,
    baseline_ms`` (``ratio``: latency / baseline latency, ``lo``/``hi`` its paired-bootstrap 95% interval).
    ``attrs``: ``source`` (for a caption), ``device``, ``model``."""
    rows = []
    for pt in (summary.get("points") or {}).values():
        for key, v in pt["variants"].items():
            comp, strat = v.get("compressor"), v.get("strategy")
            rows.append({"method": method_label(comp, strat) if comp is not None else (v.get("label") or key[:8]),
                         "compressor": comp, "strategy": strat, "ratio_param": v.get("ratio_param"), "key": key,
                         "batch": int(pt["batch"]), "seq_len": int(pt["seq_len"]), "ms": v["ms"],
                         "ratio": v["ratio"], "lo": v["lo"], "hi": v["hi"], "baseline_ms": pt["baseline_ms"]})
    cols = ["method", "compressor", "strategy", "ratio_param", "key", "batch", "seq_len", "ms", "ratio", "lo", "hi",
            "baseline_ms"]
    out = pd.DataFrame(rows, columns=cols)
    for c in ("ms", "ratio", "lo", "hi", "baseline_ms"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    out["_order"] = [method_order(c, s) for c, s in zip(out["compressor"], out["strategy"])]
    out = out.sort_values(["batch", "seq_len", "_order"], kind="stable").drop(columns="_order").reset_index(drop=True)
    out.attrs.update(source=bench_source(summary), device=summary.get("device"), model=summary.get("model"),
                     key=summary.get("key"))
    return out


def bench_source(summary: Mapping) -> str:
    """How a table's latency was measured, for its caption (the engine named when it is not torch)."""
    engine = summary.get("engine")
    run_by = "" if engine in (None, DEFAULT_ENGINE) else f" in {engine}"
    return (f"latency: side-by-side bench {str(summary.get('key'))[:8]} on {summary.get('device')} "
            f"({summary.get('device_type')}){run_by}, {summary.get('rounds')} interleaved rounds, paired bootstrap "
            f"95% CI over rounds")
