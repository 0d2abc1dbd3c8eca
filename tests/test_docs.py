"""The docs stay true to the repository: no merge-conflict marker in a tracked text file, every relative link in
README.md, docs/*.md and the other tracked markdown files resolves (file and heading anchor), and docs/cli.md is what
``gac <command> --help`` prints."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFLICT = re.compile(r"^(<<<<<<<|=======|>>>>>>>)( |$)", re.MULTILINE)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?")  # [label]: target
HTML = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")
FENCE = re.compile(r"^\s*(```|~~~)")


def _tracked_files() -> list[Path]:
    """Files git tracks; outside a git checkout (an unpacked sdist), every file under the root but hidden folders
    (.git, a .venv), caches and results."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        skip = ("__pycache__", "results", "multirun", "outputs")
        return [p for p in ROOT.rglob("*") if p.is_file()
                and not any(part.startswith(".") or part in skip for part in p.relative_to(ROOT).parts[:-1])]


def _doc_pages() -> list[Path]:
    """README.md, docs/*.md and every other tracked markdown file (CHANGELOG.md, the folders' READMEs)."""
    return sorted({ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                   *(p for p in _tracked_files() if p.suffix == ".md" and p.exists())})


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, duplicates numbered as GitHub does (x, x-1, x-2)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_github_slug():
    assert github_slug("Checking a node: `gac doctor`") == "checking-a-node-gac-doctor"
    assert github_slug("What PyTorch's SDPA does with head_dim") == "what-pytorchs-sdpa-does-with-head_dim"
    assert github_slug("Memory and time (details: [scale.md](scale.md))") == "memory-and-time-details-scalemd"


def test_no_merge_conflict_markers():
    bad = []
    for path in _tracked_files():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for m in CONFLICT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0).strip() or m.group(0)}")
    assert not bad, "unresolved merge-conflict markers:\n" + "\n".join(bad)


def test_relative_links_resolve():
    bad = []
    for page in _doc_pages():
        for n, line in _prose_lines(page.read_text(encoding="utf-8")):
            prose = re.sub(r"`[^`]*`", "", line)
            targets = [m.group(1) for m in (*LINK.finditer(prose), *HTML.finditer(prose))]
            targets += [m.group(1) for m in [REF_DEF.match(line)] if m]
            for target in targets:
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (page.parent / file_part).resolve() if file_part else page
                where = f"{page.relative_to(ROOT)}:{n}: ({target})"
                if not dest.exists():
                    bad.append(f"{where}: no such file")
                elif ROOT not in dest.parents and dest != ROOT:
                    bad.append(f"{where}: points outside the repository")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    bad.append(f"{where}: no heading with anchor #{anchor}")
    assert not bad, "broken relative links:\n" + "\n".join(bad)


def _gen_cli():
    spec = importlib.util.spec_from_file_location("gen_cli", ROOT / "docs" / "gen_cli.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cli_problems(gen, text: str) -> list[str]:
    """What docs/cli.md lacks against the parser: a (sub)command's section, a flag, or a help text (compared without
    whitespace: argparse wraps lines, at hyphens too)."""
    flat = lambda t: "".join(t.split())  # noqa: E731
    sections = {flat(s.split("\n", 1)[0]): flat(s) for s in text.split("\n## ")[1:]}
    missing = []
    for argv, parser, _ in gen.commands():
        name = "gac " + " ".join(argv)
        if flat(name) not in sections:
            missing.append(f"no section '## {name}'")
            continue
        for action in parser._actions:
            missing += [f"{name}: flag {opt}" for opt in action.option_strings if opt not in sections[flat(name)]]
            helptext = flat((action.help or "").replace("%%", "%"))
            if helptext and "%(" not in helptext and helptext not in sections[flat(name)]:
                missing.append(f"{name}: help of {action.dest!r}")
    return missing


def test_cli_reference_is_current():
    """Exactly what ``--help`` prints, on the Python version that rendered the file (argparse's layout differs
    between versions); on another version, every command, flag and help text is there."""
    gen = _gen_cli()
    text = (ROOT / "docs" / "cli.md").read_text()
    if gen.rendered_with(text) == gen.python_version():
        assert text == gen.render(), "docs/cli.md differs from `gac <command> --help`: run python docs/gen_cli.py"
    else:
        missing = _cli_problems(gen, text)
        assert not missing, "docs/cli.md is out of date (run python docs/gen_cli.py):\n" + "\n".join(missing)


def test_cli_reference_lists_every_command_and_flag():
    missing = _cli_problems(_gen_cli(), (ROOT / "docs" / "cli.md").read_text())
    assert not missing, "docs/cli.md is out of date (run python docs/gen_cli.py):\n" + "\n".join(missing)


@pytest.mark.parametrize("page", ["README.md"])
def test_front_door_is_short(page):
    n = len((ROOT / page).read_text(encoding="utf-8").splitlines())
    assert n <= 220, f"{page} has {n} lines; details belong in docs/"
