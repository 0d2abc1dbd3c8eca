"""Where the Hydra configs live and how gac composes one outside a running app (tests, notebooks, ``gac launch
status``, the after-sweep bench): the one place that calls Hydra's compose API, and :func:`hydra_text`, Hydra's
error as one line."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gac.io import conf_dir

CONF_DIR = conf_dir()  # the packaged configs in a wheel, the checkout's conf/ otherwise


def conf_root(config_dir: str | os.PathLike | None = None) -> Path:
    """``config_dir`` resolved, :data:`CONF_DIR` when None."""
    return Path(config_dir or CONF_DIR).resolve()


def compose(config_name: str, overrides: Sequence[str] = (), config_dir: str | os.PathLike | None = None,
            return_hydra_config: bool = False):
    """``<config_dir>/<config_name>.yaml`` (default :data:`CONF_DIR`) composed with ``overrides``, an OmegaConf
    ``DictConfig``. Inside a running Hydra app (already initialised) its own search path is used. Hydra's and
    OmegaConf's exceptions pass through: each caller turns them into its own one-line error."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)
    with initialize_config_dir(config_dir=str(conf_root(config_dir)), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def hydra_text(e: BaseException) -> str:
    """Hydra's (or OmegaConf's) error whole, on one line, with its cause: ``In 'local/slurm': ConfigKeyError raised
    while composing config: Key 'partiton' not in 'GacSlurmConf'; full_key: hydra.launcher.partiton; ...`` (its
    first line alone names no key). The config search path Hydra appends to a missing config is left out."""
    def one_line(text: str) -> str:
        out = ""
        for ln in (x.strip() for x in text.strip().split("Config search path:")[0].splitlines()):
            if ln:
                out += (" " if not out or out.endswith((":", ".")) else "; ") + ln
        return out.strip()

    msg = one_line(str(e)) or type(e).__name__
    cause = e.__cause__ or e.__context__
    why = one_line(str(cause)) if cause is not None else ""
    if why and why not in msg:  # "Error merging override x=y" says why only in its cause
        msg = f"{msg}: {why}"
    return msg
