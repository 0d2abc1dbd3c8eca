"""Write docs/cli.md from the ``gac`` parser's own ``--help`` output.

``python docs/gen_cli.py`` rewrites the file; ``python docs/gen_cli.py --check`` exits 1 when it is out of date
(tests/test_docs.py runs the same comparison). Help text is rendered at a fixed width so the file does not depend on
the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from pathlib import Path

WIDTH = "100"
CLI_MD = Path(__file__).resolve().parent / "cli.md"

HEADER = """\
# CLI reference

Generated from `gac <command> --help` by `python docs/gen_cli.py` with Python {python}'s argparse (do not edit by
hand: `tests/test_docs.py` fails when this file and the parser disagree; re-run the script after changing a command).

Every command exits with code 2 and one line naming the problem and the fix on bad input (the catalogue,
[bad-input.md](bad-input.md), is a table that `tests/test_bad_input.py` executes row by row). Ctrl-C ends a `gac`
command with one line (`interrupted; ...`) and exit code 130; a closed pipe (`gac align a.json | head`) ends it
quietly with 141. `gac -q COMMAND` (`quiet=true` for `experiments/run.py`, or `GAC_QUIET=1`) silences progress bars,
progress lines and stage times (`gac -q` its INFO log lines too: warnings and errors stay); `gac -v COMMAND`
(`verbose=true`) shows DEBUG logs, lm-eval's warnings and the profiler's lines.

The Hydra entry points take overrides, not flags (the config groups:
[sweeps-and-store.md](sweeps-and-store.md#config-groups)). Each is an installed console script and, in a checkout,
the same thing as a script under `experiments/`; `--config-dir DIR` adds a directory of your own configs:

```
gac-run [-m] [OVERRIDES...]            # = python experiments/run.py; the job, -m for a sweep
gac-bench [-m] [results_dir=DIR] [experiment=E] [sweep=S] [+where.KEY=VALUE] [device=D] [...]   # = experiments/bench.py
gac-profile-device device=cuda|cpu [quick=true] out_dir=DIR                                       # = experiments/profile_device.py
python -m tools.extract_published GAC_CHECKOUT [--out DIR] [--check-only]
```
"""


def _help(argv: list[str]) -> str:
    """What ``gac ARGV --help`` prints, at WIDTH columns."""
    from gac.cli import main

    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*argv, "--help"])
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip() + "\n"


def commands(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()):
    """Every (sub)command as (argv, its parser, its one-line help), depth first, in the parser's order."""
    from gac.cli import build_parser

    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                argv = (*prefix, name)
                yield argv, sub, helps.get(name, "")
                yield from commands(sub, argv)


def python_version() -> str:
    """argparse's layout changes between Python versions: the file says which one rendered it."""
    return "{}.{}".format(*sys.version_info[:2])


def rendered_with(text: str) -> str | None:
    """The Python version a docs/cli.md text was rendered with."""
    m = re.search(r"with Python (\d+\.\d+)'s argparse", text)
    return m.group(1) if m else None


def render() -> str:
    parts = [HEADER.replace("{python}", python_version()), "\n## Commands\n\n| command | what it does |\n|---|---|\n"]
    cmds = list(commands())
    for argv, _, text in cmds:
        name = "gac " + " ".join(argv)
        anchor = "gac-" + "-".join(argv)
        cell = (text or "").replace("|", "\\|")
        parts.append(f"| [`{name}`](#{anchor}) | {cell} |\n")
    parts.append("\n## gac\n\n```\n" + _help([]) + "```\n")
    for argv, _, _ in cmds:
        parts.append(f"\n## gac {' '.join(argv)}\n\n```\n" + _help(list(argv)) + "```\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not CLI_MD.exists() or CLI_MD.read_text() != text:
            print(f"{CLI_MD} is out of date: run python docs/gen_cli.py", file=sys.stderr)
            return 1
        return 0
    CLI_MD.write_text(text)
    print(f"wrote {CLI_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
