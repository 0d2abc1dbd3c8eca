"""The plain-text table ``gac evaluate`` prints of a report from :func:`gac.evaluation.suite.evaluate`."""

from __future__ import annotations

from collections.abc import Mapping


def spread_note(r: dict) -> str:
    """``"trials 3, spread 4.1% across trials"``, or ``"n=1 trial (no spread)"`` from a single trial."""
    if (r.get("trials") or 0) > 1 and r.get("spread_pct") is not None:
        return f"trials {r['trials']}, spread {r['spread_pct']:.1f}% across trials"
    return "n=1 trial (no spread)"


def format_table(report: dict, model_info: dict | None = None,
                 task_data: str | Mapping[str, str] | None = None) -> str:
    """A plain-text table of a report from :func:`gac.evaluation.suite.evaluate`; rows are named as the records name metrics.
    ``task_data``: what the tasks were scored on (:func:`gac.metrics.task_data`; one value, or ``{task:
    data}``): after the task rows, one line per look-alike set says what its items are (``piqa_acc`` on
    ``enwiki`` scored PiQA-format items made from Wikipedia articles, not PiQA); one per local file names
    it."""
    from gac.metrics import DECODE, OWN_TASK_FILES, PREFILL, is_lookalike, ppl_metric, task_data_note

    lines = []
    if model_info:
        lines.append(f"model {model_info['name']} ({model_info['architecture']}, {model_info['params'] / 1e6:.2f}M "
                     f"params, {model_info['dtype']})")
    lines.append(f"{'metric':<34} {'value':>12} {'stderr':>9} {'n':>8}")
    p = report.get("perplexity")
    if p:
        lines.append(f"{ppl_metric(p['source']):<34} {p['ppl']:>12.3f} {'':>9} {p['n_windows']:>8}")
        total = p.get("n_windows_total")
        part = f", the first {p['n_windows']} of {total} windows" if total and total > p["n_windows"] else ""
        lines.append(f"  perplexity on {p['source']}, windows of S={p['seq_len']}{part}")
        if p.get("warning"):
            lines.append(f"  WARNING: {p['warning']}")
    metrics = report.get("metrics") or {}
    for t, r in (report.get("tasks") or {}).items():
        for name, value in r.get("metrics", {}).items():
            se = r.get("metrics", {}).get(f"{name}_stderr") if not name.endswith("_stderr") else None
            if name.endswith("_stderr"):
                continue
            flat = f"{t}_{name}"
            value = metrics.get(flat, value)
            lines.append(f"{flat:<34} {value:>12.4f} {'' if se is None else f'{se:.4f}':>9} "
                         f"{'' if r.get('n') is None else r['n']:>8}")
    tasks = report.get("tasks") or {}
    data = {t: task_data.get(t) if isinstance(task_data, Mapping) else task_data for t in tasks}
    for d in dict.fromkeys(d for d in data.values() if is_lookalike(d)):
        mine = [t for t, v in data.items() if v == d]
        lines.append(f"  {', '.join(mine)}: {task_data_note(d, mine)}")
    for t, d in data.items():
        if d == OWN_TASK_FILES and tasks[t].get("source") not in (None, "hub"):
            lines.append(f"  {t}: items from the local file {tasks[t]['source']}")
    lat = report.get("latency") or {}
    pres = [(k, r) for k, r in lat.items() if k not in ("decode", "skipped")]
    for i, (name, pre) in enumerate(pres):  # the first point is the main one (prefill_ms)
        lines.append(f"{PREFILL if i == 0 else name:<34} {pre['median_ms']:>12.3f} {'':>9} {pre['n_samples']:>8}")
    dec = lat.get("decode")
    if dec:
        lines.append(f"{DECODE:<34} {dec['median_ms']:>12.3f} {'':>9} {dec['n_samples']:>8}")
    if pres:
        pre = pres[0][1]
        lines.append(f"  prefill at batch {pre['batch']}, S={pre['seq_len']}"
                     + (f"; decode {dec['new_tokens']} new tokens" if dec else ""))
        lines.append(f"  latency on {pre['device_name']} ({pre['device']}), {pre['dtype']}, attention "
                     f"{pre['attn_implementation']}, SDPA backend {', '.join(pre['sdpa_backend'] or ['?'])}; "
                     f"{pre['timer']}, warm-up {pre['warmup']}, iters {pre['iters']}, {spread_note(pre)}")
    if lat.get("skipped"):
        lines.append(f"  latency: {lat['skipped']}")
    return "\n".join(lines)
