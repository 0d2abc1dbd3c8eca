"""The package layering of ``gac/__init__.py``: a package never imports one above it (lazy imports included)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gac"

# What each package may import (besides itself). Foundations: errors, io, faults, _moved; the utilities data/fixtures
# (text sources, the embedded tiny model) sit below compression; models (any model or a gac checkpoint) above it.
BASE = {"errors", "io", "faults", "_moved", "metrics", "progress", "dtypes", "registry", "(gac)"}  # metrics: names; progress: bars/lines; dtypes: the "auto" rule; registry: names
ALLOWED = {
    "align": BASE,
    "results": BASE,
    "data": BASE | {"fixtures"},
    "fixtures": BASE | {"data", "evaluation"},  # building tiny trains and evaluates it
    "compression": BASE | {"align", "data", "fixtures"},
    "models": BASE | {"compression", "fixtures"},
    "evaluation": BASE | {"align", "compression", "data", "fixtures", "models"},
    "profiling": BASE | {"align", "evaluation"},
    "predict": BASE | {"align", "compression", "evaluation", "profiling"},  # kernel data + shapes -> GPU latency
    "analysis": BASE | {"align", "results", "profiling"},
    "jobs": BASE | {"align", "compression", "data", "fixtures", "models", "evaluation", "profiling", "predict",
                    "results", "analysis"},
    "launch": BASE | {"jobs", "results"},
}


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 else rel.stem


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names] if node.module == "gac" else [node.module]
            yield from ((n, node.lineno) for n in names)
        elif isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)


def _edges():
    for path in sorted(ROOT.rglob("*.py")):
        src = _package(path)
        for name, line in _imports(path):
            parts = name.split(".")
            if parts[0] != "gac":
                continue
            dst = parts[1] if len(parts) > 1 else "(gac)"
            if dst in ("__version__",):
                dst = "(gac)"
            if dst != src:
                yield src, dst, f"{path.relative_to(ROOT.parent)}:{line}"


def test_no_package_imports_one_above_it():
    bad = [f"{where}: {src} imports {dst}" for src, dst, where in _edges()
           if src in ALLOWED and dst not in ALLOWED[src]]
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_every_package_has_a_rule():
    """A new package must be placed in the layering (or it is one of the top-level entry points)."""
    top = {"commands", "cli", "__init__"}
    packages = {_package(p) for p in ROOT.rglob("*.py")} - top - BASE
    assert packages <= set(ALLOWED), f"packages without a layering rule: {sorted(packages - set(ALLOWED))}"


@pytest.mark.parametrize("old,new", [("gac.compress", "gac.compression.compress"),
                                     ("gac.compressors.asvd", "gac.compression.compressors.asvd"),
                                     ("gac.targets", "gac.align.targets"), ("gac.pipeline", "gac.jobs.pipeline"),
                                     ("gac.checkpoint", "gac.compression.checkpoint")])
def test_old_import_paths_still_work(old, new):
    import importlib
    import sys
    import warnings

    sys.modules.pop(old, None)  # an earlier test may have imported the old name: import it afresh
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)
    assert mod is importlib.import_module(new)
    assert mod.__spec__.name == new  # the real module keeps its identity
