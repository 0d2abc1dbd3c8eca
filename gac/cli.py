"""The ``gac`` command line.

Sub-commands live in :mod:`gac.commands`, one module each, discovered at start-up. A module defines
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; its heavy imports happen inside
``run`` so that ``gac --help`` stays fast. Errors caused by input are :class:`gac.errors.GacError`:
printed as one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from gac import __version__, commands
from gac.errors import GacError


def _command_modules():
    mods = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"gac.commands.{info.name}"))
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gac", description="GPU-Aligned Compression: aligned dimensions under an exact parameter budget."
    )
    parser.add_argument("--version", action="version", version=f"gac {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at DEBUG level, lm-eval's warnings and the profiler's lines included")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bars, periodic progress lines, stage times or INFO log lines: warnings and errors only "
                             "(GAC_QUIET=1 does the same)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _prog=f"gac {mod.NAME}")
        _COMMANDS[f"gac {mod.NAME}"] = mod
    return parser


_COMMANDS: dict = {}  # "gac NAME" -> its module (for the Ctrl-C message)


def main(argv: list[str] | None = None) -> int:
    """Run ``gac ARGV``. Bad input: one line ``gac CMD: error: ...`` on stderr, exit code 2. Ctrl-C (at any point,
    start-up included): one line ``gac CMD: interrupted; ...``, exit code 130, never a traceback."""
    prog = "gac"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        prog = getattr(args, "_prog", prog)
        return _run(parser, args)
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted_message(prog)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gac align x.json | head`: the reader left; nothing more to say
        _silence_stdout()
        return 141


def interrupted_message(prog: str) -> str:
    """What Ctrl-C means for a command: whether a re-run resumes (its module sets ``RESUMES = True``) or starts again."""
    mod = _COMMANDS.get(prog)
    if mod is not None and getattr(mod, "RESUMES", False):
        return "interrupted; re-run to resume"
    return "interrupted; re-run the command to start again"


def _silence_stdout() -> None:
    import os

    try:  # point stdout at /dev/null so the interpreter's final flush does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _run(parser, args) -> int:
    from gac.progress import is_quiet, quiet_libraries, quiet_scope

    quiet = args.quiet or is_quiet()
    level = logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO  # -q: warnings and errors only
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")

    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        with quiet_scope(quiet):
            quiet_libraries(verbose=args.verbose)
            return int(args._run(args) or 0)
    except GacError as e:
        print(f"{args._prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
