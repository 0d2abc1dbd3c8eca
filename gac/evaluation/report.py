"""One call that runs the evaluations asked for and returns a JSON-ready report (used by ``gac evaluate``)."""

from __future__ import annotations

import datetime
import logging
import os
import platform
import socket
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

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
    repo = Path(gac.__file__).resolve().parent.parent
    commit, dirty = None, None
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        if commit:
            status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout
            dirty = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "gac_version": gac.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": pkgs,
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def evaluate(model, tokenizer, *, ppl_source: str | os.PathLike | None = None, seq_len: int | None = None,
             ppl_batch_size: int = 1, tasks: Iterable[str] | None = None, limit: int | None = 200,
             task_files: Mapping[str, str | os.PathLike] | None = None, task_batch_size: int = 16,
             latency: bool = False, latency_batch: int = 1, latency_seq_len: int | None = None,
             decode_prompt_len: int = 128, decode_tokens: int = 128, warmup: int | None = None,
             iters: int | None = None, trials: int | None = None, decode_warmup: int | None = None,
             decode_iters: int | None = None) -> dict:
    """Run perplexity (if ``ppl_source``), lm-eval tasks (if ``tasks``) and latency (if ``latency``).

    ``warmup/iters/trials`` are the prefill protocol (None: 50/200/3 on CUDA, fewer on CPU); ``decode_warmup`` and
    ``decode_iters`` count whole generations of ``decode_tokens`` tokens (trials shared).
    Returns ``{"perplexity", "tasks", "latency", "metrics"}`` where ``metrics`` is flat (``ppl``, ``piqa_acc``,
    ``piqa_acc_norm``, ..., ``prefill_ms``, ``decode_ms_per_token``), the names the results store uses.
    """
    from gac.evaluation.latency import decode_latency, prefill_latency
    from gac.evaluation.perplexity import model_max_length, perplexity
    from gac.evaluation.tasks import evaluate_tasks, parse_tasks

    out: dict = {"perplexity": None, "tasks": None, "latency": None, "metrics": {}}
    names = parse_tasks(tasks) if tasks else []
    if ppl_source is not None:
        out["perplexity"] = perplexity(model, tokenizer, ppl_source, seq_len=seq_len, batch_size=ppl_batch_size)
        out["metrics"]["ppl"] = out["perplexity"]["ppl"]
    if names:
        out["tasks"] = evaluate_tasks(model, tokenizer, names, limit=limit, local_files=task_files,
                                      batch_size=task_batch_size)
        for t, r in out["tasks"].items():
            out["metrics"][f"{t}_acc"] = r["acc"]
            out["metrics"][f"{t}_acc_norm"] = r["acc_norm"]
    if latency:
        s = latency_seq_len
        if s is None:
            limit_len = model_max_length(model)
            s = 1024 if limit_len is None else min(1024, limit_len)
        pre = prefill_latency(model, batch=latency_batch, seq_len=s, warmup=warmup, iters=iters, trials=trials)
        dec = decode_latency(model, batch=latency_batch, prompt_len=decode_prompt_len, new_tokens=decode_tokens,
                             warmup=decode_warmup, iters=decode_iters, trials=trials)
        out["latency"] = {"prefill": pre, "decode": dec}
        out["metrics"]["prefill_ms"] = pre["median_ms"]
        out["metrics"]["decode_ms_per_token"] = dec["median_ms"]
    return out


def format_table(report: dict, model_info: dict | None = None) -> str:
    """A plain-text table of a report from :func:`evaluate`."""
    lines = []
    if model_info:
        lines.append(f"model {model_info['name']} ({model_info['architecture']}, {model_info['params'] / 1e6:.2f}M "
                     f"params, {model_info['dtype']})")
    lines.append(f"{'metric':<34} {'value':>12} {'stderr':>9} {'n':>8}")
    p = report.get("perplexity")
    if p:
        lines.append(f"{'ppl [' + p['source'] + ', S=' + str(p['seq_len']) + ']':<34} {p['ppl']:>12.3f} "
                     f"{'':>9} {p['n_windows']:>8}")
    for t, r in (report.get("tasks") or {}).items():
        for k in ("acc", "acc_norm"):
            se = r.get(f"{k}_stderr")
            lines.append(f"{t + ' ' + k:<34} {r[k]:>12.4f} {'' if se is None else f'{se:.4f}':>9} {r['n']:>8}")
    lat = report.get("latency")
    if lat:
        pre, dec = lat["prefill"], lat["decode"]
        lines.append(f"{'prefill ms [b=' + str(pre['batch']) + ', S=' + str(pre['seq_len']) + ']':<34} "
                     f"{pre['median_ms']:>12.3f} {'':>9} {pre['n_samples']:>8}")
        lines.append(f"{'decode ms/token [' + str(dec['new_tokens']) + ' new]':<34} {dec['median_ms']:>12.3f} "
                     f"{'':>9} {dec['n_samples']:>8}")
        lines.append(f"  latency on {pre['device_name']} ({pre['device']}), {pre['dtype']}, attention "
                     f"{pre['attn_implementation']}, SDPA backend {', '.join(pre['sdpa_backend'] or ['?'])}; "
                     f"{pre['timer']}, warm-up {pre['warmup']}, iters {pre['iters']}, trials {pre['trials']}, "
                     f"spread {pre['spread_pct']:.1f}%")
    return "\n".join(lines)
