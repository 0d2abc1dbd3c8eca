"""Where a result came from: gac's version and checkout (git commit, dirty flag), the package versions, the host and
the date. One definition for the records (:mod:`gac.jobs.run.provenance` adds a job's seed and Slurm ids), ``gac
evaluate``'s report, the bench records, ``gac doctor`` and the checkpoints' ``provenance`` block."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from gac.machine import host, utc_stamp


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
