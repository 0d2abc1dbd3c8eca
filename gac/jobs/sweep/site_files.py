"""The git-ignored per-machine files of ``conf/local/`` checked before anything composes them, so that a file that is
not YAML, not a mapping, or in the wrong place is one line naming the file and the fix instead of a Hydra traceback
or a cut message on every run:

* ``conf/local/default.yaml``: job and bench settings (``results_dir``, ...), merged over ``conf/config.yaml`` and
  ``conf/bench.yaml`` by every run (package ``_global_``: the ``# @package`` header may be left out; empty is fine);
* ``conf/local/slurm.yaml``: the site's Slurm settings (``partition``, ``account``, ``setup``, ...), the launcher's
  own keys, merged over the shipped ``conf/hydra/launcher/slurm_*.yaml`` by each of them (and only by them: a run
  with Hydra's basic launcher has no ``partition`` to set).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from gac.errors import GacError

SITE_FILE = "local/slurm.yaml"  # under the config dir: the site's Slurm launcher settings
LOCAL_FILE = "local/default.yaml"  # under the config dir: the machine's job settings


def check_site_files(conf_dir: str | os.PathLike) -> None:
    """``conf/local/default.yaml`` and ``conf/local/slurm.yaml`` under ``conf_dir``, where present, are UTF-8 YAML
    mappings in their place; raises :class:`GacError` naming the file and the fix."""
    root = Path(conf_dir)
    local = _read(root / LOCAL_FILE, LOCAL_FILE)
    launcher = (local.get("hydra") or {}).get("launcher") if isinstance(local.get("hydra"), dict) else None
    if launcher:
        keys = ", ".join(str(k) for k in launcher) if isinstance(launcher, dict) else "hydra.launcher"
        raise GacError(f"conf/{LOCAL_FILE} sets hydra.launcher ({keys}), which only a Slurm launcher has: every run "
                       f"without one (a run here, gac fetch, the bench) would fail on it. Move them, without the "
                       f"hydra: launcher: lines, to conf/{SITE_FILE}, which every slurm_* launcher loads over its own "
                       f"settings (conf/local/README.md)")
    site = _read(root / SITE_FILE, SITE_FILE)
    if "hydra" in site:
        raise GacError(f"conf/{SITE_FILE} holds the launcher's own keys (partition: gpu-h100, account: ...): remove "
                       f"its hydra: and launcher: levels and the '# @package' line (conf/local/README.md)")
    known = launcher_keys()
    for key in site:
        if known and str(key) not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise GacError(f"conf/{SITE_FILE}: {key!r} is not a Slurm launcher setting{hint} (known: "
                           f"{', '.join(sorted(known))}); for a raw sbatch option use additional_parameters: "
                           f"{{{key}: ...}}")


def launcher_keys() -> set[str]:
    """The settings of gac's Slurm launcher (:class:`gac.jobs.config.schema.GacSlurmConf`), empty without hydra-submitit."""
    from dataclasses import fields

    try:
        from gac.jobs.config.schema import GacSlurmConf
    except ImportError:  # pragma: no cover - hydra-submitit is a dependency
        return set()
    return {f.name for f in fields(GacSlurmConf) if not f.name.startswith("_")}


def _read(path: Path, name: str) -> dict:
    """The file's mapping ({} when absent or empty)."""
    import yaml

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise GacError(f"conf/{name} cannot be read ({e.strerror or e}); fix its permissions or remove it") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GacError(f"conf/{name} is not UTF-8 text (byte {e.start}); save it as UTF-8 or remove it") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise GacError(f"conf/{name} is not YAML{where} ({problem}); fix it (every run loads it) or remove "
                       f"it") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise GacError(f"conf/{name} holds a {type(doc).__name__}, not settings (key: value lines); fix it or "
                       f"remove it (conf/local/README.md)")
    return doc
