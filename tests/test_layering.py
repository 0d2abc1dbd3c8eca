"""The layering of gac: a package never imports one above it, the packages' table of allowed imports is itself
acyclic, and no two modules import each other, directly or through others (lazy imports included)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "gac"

# What each package may import (besides itself). Foundations: errors, io, faults; the named fixture models
# (find and load them, build what needs no evaluation) sit below the text sources that name their files, both below
# compression; models (any model or a gac checkpoint) above it; training (tiny from its recipe) evaluates what it
# trains, so it sits above evaluation.
# layout: the names of the directories and files gac makes and recognises (below io, which reads it);
# checks: seeds, threads, numbers from the environment; metrics: names; progress: bars/lines; dtypes: the "auto" rule;
# devices: the device check, GPU names; registry: names; untrusted: no code from data; stats: the bench's paired interval;
# hashing: digests and file hashes; machine: the host, its processes, its locks, time stamps; provenance: gac's
# version and checkout, package versions, host and date; transformers_lock: one transformers build at a time;
# hub: the Hugging Face hub's address, whether it answers, the token, its caches
BASE = {"errors", "io", "layout", "hashing", "machine", "faults", "metrics", "progress", "dtypes", "devices", "registry",
        "untrusted", "stats", "checks", "provenance", "transformers_lock", "hub", "(gac)"}
ALLOWED = {
    "align": BASE,
    "results": BASE,
    "fixtures": BASE,
    "text": BASE | {"fixtures"},  # "tiny" and "enwiki" name fixture files
    "compression": BASE | {"align", "text", "fixtures"},
    "models": BASE | {"compression", "fixtures"},
    "evaluation": BASE | {"align", "compression", "text", "fixtures", "models"},
    "export": BASE | {"align", "compression", "fixtures", "models"},  # a checkpoint as files serving engines run
    "engines": BASE | {"align", "compression", "fixtures", "models", "evaluation", "export"},  # a model run by an engine
    "training": BASE | {"fixtures", "text", "evaluation"},
    "profiling": BASE | {"align", "evaluation"},
    "predict": BASE | {"align", "compression", "evaluation", "profiling"},  # kernel data + shapes -> GPU latency
    "analysis": BASE | {"align", "results", "profiling"},
    "jobs": BASE | {"align", "compression", "text", "fixtures", "models", "evaluation", "profiling", "predict",
                    "results", "analysis", "engines"},
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


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_table_of_allowed_imports_is_acyclic():
    graph = {pkg: set(allowed) - {pkg} for pkg, allowed in ALLOWED.items()}
    cycles = _sccs(graph)
    assert not cycles, "the layering table allows package circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: every package the wheel ships (pyproject's packages): a circle through any of them is a circle
SHIPPED = (ROOT, ROOT.parent / "hydra_plugins")


def module_graph() -> dict[str, dict[str, str]]:
    """``{module: {imported module: "path:line"}}`` over every module the wheel ships (gac/ and hydra_plugins/),
    function-level imports included.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; an import of a name that is
    not a module goes to the nearest module above it. Importing a submodule is not counted as importing its
    package's ``__init__``."""
    paths = {_module_name(p): p for top in SHIPPED for p in sorted(top.rglob("*.py"))}

    def nearest(name: str) -> str:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, dict[str, str]] = {}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges: dict[str, str] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                shipped = name.split(".")[0] in {top.name for top in SHIPPED}
                dst = nearest(name) if shipped else ""
                if dst and dst != mod:
                    edges.setdefault(dst, f"{path.relative_to(ROOT.parent)}:{node.lineno}")
        graph[mod] = edges
    return graph


def test_no_import_circle_between_modules():
    graph = module_graph()
    cycles = _sccs({m: set(e) for m, e in graph.items()})
    lines = []
    for c in cycles:
        lines.append(" <-> ".join(c))
        lines += [f"    {a} imports {b} ({graph[a][b]})" for a in c for b in sorted(graph[a]) if b in c]
    assert not cycles, "import circles between modules:\n" + "\n".join(lines)


def test_no_private_name_is_imported_across_modules():
    """A name another module imports is public (no leading underscore): what is shared is said to be shared."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gac"):
                bad += [f"{path.relative_to(ROOT.parent)}:{node.lineno} {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, "private names imported from another module: " + ", ".join(bad)
