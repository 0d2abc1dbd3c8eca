"""The bridge between Hydra and the job: ``experiments/run.py`` (``gac-run``) calls :func:`run_from_hydra`, which
runs the job's recipe (:func:`gac.jobs.run.recipe.run_config`) on the composed config and prints its record
(:func:`format_record`). Tests and notebooks call :func:`gac.jobs.run.recipe.run_config` with a plain dict (for instance
from :func:`gac.jobs.config.command_line.compose_config`). A sweep's points are expanded and checked before launch by
:mod:`gac.jobs.sweep.points`; the command line itself by :mod:`gac.jobs.config.command_line`.
"""

from __future__ import annotations

import sys

from gac.errors import GacError
from gac.jobs.sweep.points import FAILED_POINTS


def run_from_hydra(cfg) -> dict | None:
    """The body of ``experiments/run.py``: a single run exits 2 with one line on bad input; in a multirun the
    error propagates so the launcher reports the job as failed (the store has its failure record)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from gac.jobs.run.recipe import run_config

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        container = from_launch_dir(OmegaConf.to_container(cfg, resolve=True), hc.runtime.cwd)
        record = run_config(container, list(hc.overrides.task), sweep_dir=hc.sweep.dir if multirun else None)
    except GacError as e:
        if not multirun:
            print(f"experiments/run.py: error: {e}", file=sys.stderr)
            sys.exit(2)
        if "BasicLauncher" not in str(hc.launcher.get("_target_", "")):
            raise  # a remote launcher (Slurm) reports the job as failed; the store has the failure record
        # in-process sweep: one line now, the other points still run, exit code 2 at the end (SweepCallback)
        point = " ".join(hc.overrides.task)
        print(f"experiments/run.py: error: [{point}]: {e}", file=sys.stderr)
        FAILED_POINTS.append((list(hc.overrides.task), str(e)))
        return None
    except KeyboardInterrupt:
        raise SystemExit(interrupted()) from None
    if not multirun:
        print(format_record(record))
    return record.get("metrics")


#: the settings that name a place to write: a relative one is taken from the directory the command ran in
LAUNCH_RELATIVE = ("results_dir", "save_model")


def from_launch_dir(container: dict, launch_dir: str) -> dict:
    """``container`` with a relative ``results_dir`` / ``save_model`` made absolute against ``launch_dir``
    (Hydra's ``hydra.runtime.cwd``, the directory the user ran the command from): with ``hydra.job.chdir=true`` a
    job runs in its ``hydra.run.dir``, and the results would land there instead."""
    import os

    out = dict(container)
    for key in LAUNCH_RELATIVE:
        v = out.get(key)
        if isinstance(v, str) and v and not os.path.isabs(os.path.expanduser(v)):
            out[key] = os.path.join(launch_dir, v)
    return out


INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C


def interrupted(prog: str = "experiments/run.py", resumes: bool = True) -> int:
    """Ctrl-C on a job: one line instead of a traceback, exit code 130. A job has recorded its attempt as
    interrupted (``work/<key>/attempts.json``) and kept its finished stages, so running it again resumes."""
    what = "re-run to resume (finished stages are kept)" if resumes else "re-run to start again (nothing was recorded)"
    print(f"{prog}: interrupted; {what}", file=sys.stderr)
    return INTERRUPTED_EXIT


def format_record(record: dict) -> str:
    job = record.get("job", {})
    head = ", ".join(f"{k}={job[k]}" for k in ("model", "compressor", "proxy", "strategy", "ratio", "gpu")
                     if job.get(k) is not None)
    why = {"busy": "skipped (an identical job is running: on_busy=skip): ",
           "finished by an identical job": "skipped (finished by an identical job this one waited for): "}
    lines = [(why.get(record.get("skip_reason"), "skipped (already done): ") if record.get("skipped") else "") + head]
    if record.get("params") is not None:
        by_unit = (record.get("plan") or {}).get("aligned_by_unit") or {}
        extra = ", ".join(f"{u}: {100 * by_unit[u]:.1f}%" for u in ("8", "16", "32") if u in by_unit)
        lines.append(f"  params {record['params']:,} / budget {record['budget']:,}, "
                     f"aligned {100 * record['aligned_fraction']:.1f}% at unit {job.get('unit')}"
                     + (f" (by unit {extra})" if extra else ""))
    for k, v in sorted((record.get("metrics") or {}).items()):
        if isinstance(v, float):
            lines.append(f"  {k:<24} {v:.4g}")
    lines += _task_data_lines(record)
    warning = ((record.get("evaluation") or {}).get("perplexity") or {}).get("warning")
    if warning:
        lines.append(f"  WARNING: {warning}")
    if record.get("_path"):
        lines.append(f"  record: {record['_path']}")
    return "\n".join(lines)


def _task_data_lines(record: dict) -> list[str]:
    """A line saying what a look-alike set's task items are (``model.task_files: enwiki``:
    PiQA-/HellaSwag-format items made from Wikipedia articles, not the datasets) when the record has task
    metrics of that set."""
    from gac.metrics import is_lookalike, task_data, task_data_note

    config = record.get("config") or {}
    model = config.get("model") if isinstance(config.get("model"), dict) else config  # or a bare JobSpec's
    data = task_data(model.get("task_files")) if "task_files" in model else None
    metrics = record.get("metrics") or {}
    tasks = [t for t in ("piqa", "hellaswag") if any(str(k).startswith(f"{t}_") for k in metrics)]
    if not (is_lookalike(data) and tasks):
        return []
    return [f"  {', '.join(f'{t}_*' for t in tasks)}: {task_data_note(data, tasks)}"]
