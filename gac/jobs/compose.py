"""Where the Hydra configs live and how gac composes one outside a running app (tests, notebooks, ``gac launch
status``, the after-sweep bench): the one place that calls Hydra's compose API."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gac.io import conf_dir

CONF_DIR = conf_dir()  # the packaged configs in a wheel, the checkout's conf/ otherwise


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
    with initialize_config_dir(config_dir=str(Path(config_dir or CONF_DIR).resolve()), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)
