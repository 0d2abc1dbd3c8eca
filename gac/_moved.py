"""Old import paths of modules that moved into packages (0.2): ``import gac.compress`` still works.

A meta-path finder maps each old dotted name to its new home and hands back *the same module object*, so
``gac.compress.compress_model is gac.compression.compress.compress_model`` and monkeypatching either name patches
both. Each first use of an old name warns once with a :class:`DeprecationWarning` naming the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module (or package prefix) -> new module
MOVED = {
    "gac.targets": "gac.align.targets",
    "gac.discovery": "gac.compression.discovery",
    "gac.importance": "gac.compression.importance",
    "gac.allocation": "gac.compression.allocation",
    "gac.compress": "gac.compression.compress",
    "gac.modules": "gac.compression.modules",
    "gac.checkpoint": "gac.compression.checkpoint",
    "gac.audit": "gac.compression.audit",
    "gac.compressors": "gac.compression.compressors",
    "gac.pipeline": "gac.jobs.pipeline",
    "gac.experiment": "gac.jobs.experiment",
    "gac.tracking": "gac.jobs.tracking",
}


def new_name(old: str) -> str | None:
    """The new dotted name of a moved module (``gac.compressors.asvd`` -> ``gac.compression.compressors.asvd``)."""
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix):]
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=real.submodule_search_locations is not None)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the import machinery overwrites __spec__; exec_module restores it
        return module

    def exec_module(self, module):
        real = module.__spec__.loader_state
        if real is not None:
            module.__spec__ = real


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
