"""One call that runs the evaluations asked for and returns a JSON-ready report (used by ``gac evaluate``)."""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from gac.io import host, utc_stamp

log = logging.getLogger(__name__)


def provenance(device: str | None = None) -> dict:
    """Where a result came from: gac version, git commit and dirty flag, package versions, host, date."""
    import importlib.metadata as md

    import gac

    pkgs = {}
    for name in ("torch", "transformers", "lm_eval", "tokenizers", "datasets", "numpy"):
        try:
            pkgs[name] = md.version(name.replace("_", "-"))
        except md.PackageNotFoundError:
            pkgs[name] = None
    commit, dirty = checkout()
    return {
        "gac_version": gac.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": pkgs,
        "python": platform.python_version(),
        "hostname": host(),
        "device": device,
        "date": utc_stamp(),
    }


def checkout() -> tuple[str | None, bool | None]:
    """``(git_commit, git_dirty)`` of the checkout gac runs from; ``(None, None)`` outside one (a wheel)."""
    import gac

    repo = Path(gac.__file__).resolve().parent.parent
    commit = git_commit(repo)
    return commit, git_dirty(repo) if commit else None


def git_commit(repo: str | os.PathLike) -> str | None:
    """The commit the checkout ``repo`` is at (``git rev-parse HEAD``); None without git or outside a checkout."""
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_dirty(repo: str | os.PathLike) -> bool | None:
    """Whether tracked files of the checkout ``repo`` differ from its commit; None when git cannot tell."""
    try:
        return bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None


def evaluate(model, tokenizer, *, ppl_source: str | os.PathLike | None = None, seq_len: int | None = None,
             ppl_batch_size: int = 1, ppl_max_windows: int | None = None, tasks: Iterable[str] | None = None, limit: int | None = 200,
             task_files: Mapping[str, str | os.PathLike] | None = None, task_batch_size: int = 16,
             latency: bool = False, latency_batch: int = 1, latency_seq_len: int | None = None,
             decode_prompt_len: int = 128, decode_tokens: int = 128, warmup: int | None = None,
             iters: int | None = None, trials: int | None = None, decode_warmup: int | None = None,
             decode_iters: int | None = None) -> dict:
    """Run perplexity (if ``ppl_source``), lm-eval tasks (if ``tasks``) and latency (if ``latency``).

    ``warmup/iters/trials`` are the prefill protocol (None: 50/200/3 on CUDA, fewer on CPU); ``decode_warmup`` and
    ``decode_iters`` count whole generations of ``decode_tokens`` tokens (trials shared). ``ppl_max_windows``
    scores only the first windows of the perplexity text (None: all of it).
    Returns ``{"perplexity", "tasks", "lm_eval", "latency", "metrics"}`` where ``metrics`` is flat, with the names
    the results store uses (:mod:`gac.metrics`: ``ppl_<dataset>``, ``piqa_acc``, ``piqa_acc_norm``, ...,
    ``prefill_ms``, ``decode_ms_per_token``) and ``lm_eval`` is lm-eval's own results layout.
    """
    from gac.evaluation.latency import decode_latency, prefill_latency
    from gac.evaluation.perplexity import model_max_length, perplexity
    from gac.evaluation.tasks import evaluate_tasks, parse_tasks
    from gac.metrics import DECODE, PREFILL, PREFILL_SPREAD, ppl_metric

    out: dict = {"perplexity": None, "tasks": None, "lm_eval": None, "latency": None, "metrics": {}}
    names = parse_tasks(tasks) if tasks else []
    if names and task_files:  # an item longer than the context: now, not after the perplexity and the other items
        from gac.evaluation.tasks import check_item_lengths

        for t in names:
            if t in task_files:
                check_item_lengths(t, task_files[t], tokenizer, model_max_length(model), limit)
    if ppl_source is not None:
        out["perplexity"] = perplexity(model, tokenizer, ppl_source, seq_len=seq_len, batch_size=ppl_batch_size,
                                       max_windows=ppl_max_windows)
        out["metrics"][ppl_metric(out["perplexity"]["source"])] = out["perplexity"]["ppl"]
    if names:
        res = evaluate_tasks(model, tokenizer, names, limit=limit, local_files=task_files, batch_size=task_batch_size,
                             layout=True)
        out["tasks"], out["lm_eval"] = res["tasks"], res["lm_eval"]
        out["metrics"].update(res["metrics"])
    if latency:
        s = latency_seq_len
        if s is None:
            limit_len = model_max_length(model)
            s = 1024 if limit_len is None else min(1024, limit_len)
        pre = prefill_latency(model, batch=latency_batch, seq_len=s, warmup=warmup, iters=iters, trials=trials)
        dec = decode_latency(model, batch=latency_batch, prompt_len=decode_prompt_len, new_tokens=decode_tokens,
                             warmup=decode_warmup, iters=decode_iters, trials=trials)
        out["latency"] = {"prefill": pre, "decode": dec}
        out["metrics"][PREFILL] = pre["median_ms"]
        if pre.get("trials", 1) > 1 and pre.get("spread_pct") is not None:
            out["metrics"][PREFILL_SPREAD] = pre["spread_pct"]
        out["metrics"][DECODE] = dec["median_ms"]
    return out


def spread_note(r: dict) -> str:
    """``"trials 3, spread 4.1% across trials"``, or ``"n=1 trial (no spread)"`` from a single trial."""
    if (r.get("trials") or 0) > 1 and r.get("spread_pct") is not None:
        return f"trials {r['trials']}, spread {r['spread_pct']:.1f}% across trials"
    return "n=1 trial (no spread)"


def format_table(report: dict, model_info: dict | None = None,
                 task_data: str | Mapping[str, str] | None = None) -> str:
    """A plain-text table of a report from :func:`evaluate`; rows are named as the records name metrics.
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
    lat = report.get("latency")
    if lat:
        pre, dec = lat["prefill"], lat["decode"]
        lines.append(f"{PREFILL:<34} {pre['median_ms']:>12.3f} {'':>9} {pre['n_samples']:>8}")
        lines.append(f"{DECODE:<34} {dec['median_ms']:>12.3f} {'':>9} {dec['n_samples']:>8}")
        lines.append(f"  prefill at batch {pre['batch']}, S={pre['seq_len']}; decode {dec['new_tokens']} new tokens")
        lines.append(f"  latency on {pre['device_name']} ({pre['device']}), {pre['dtype']}, attention "
                     f"{pre['attn_implementation']}, SDPA backend {', '.join(pre['sdpa_backend'] or ['?'])}; "
                     f"{pre['timer']}, warm-up {pre['warmup']}, iters {pre['iters']}, {spread_note(pre)}")
    return "\n".join(lines)
