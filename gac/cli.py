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
        return _run(parser, args, sys.argv[1:] if argv is None else list(argv))
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


class _ClosedPipeSafe:
    """``sys.stdout`` for entry points that cannot stop at the first closed pipe (Hydra's, whose own error handler
    would print the traceback): once the reader has gone, output goes to /dev/null and the run goes on, its record
    written, instead of ending in a BrokenPipeError traceback."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _silence_stdout()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            _silence_stdout()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_closed_pipe() -> None:
    """Make ``python experiments/run.py ... | head`` end quietly (see :class:`_ClosedPipeSafe`)."""
    if not isinstance(sys.stdout, _ClosedPipeSafe) and sys.stdout is not None:
        sys.stdout = _ClosedPipeSafe(sys.stdout)


def repeated_option(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """A one-value option given twice on ``argv`` (argparse keeps the last without a word), said with both values;
    None when there is none. Repeatable options (``--plan``, ``--option``) and flags are left alone."""
    def index(p):
        return {s: a for a in p._actions for s in a.option_strings}

    cur, opts, seen = parser, index(parser), {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            break
        if tok.startswith("-") and len(tok) > 1 and not tok[1:2].isdigit():
            name, eq, value = tok.partition("=")
            a = opts.get(name)
            if a is None and name.startswith("--"):  # argparse accepts a unique prefix (--rat for --ratio)
                hits = {b for s, b in opts.items() if s.startswith(name)}
                a = hits.pop() if len(hits) == 1 else None
            if isinstance(a, argparse._StoreAction):
                if not eq and i + 1 < len(argv):
                    value, i = argv[i + 1], i + 1
                given = f"{name} {value}"
                if a.dest in seen:
                    return (f"{seen[a.dest]} and {given} both given (the last would win without a word); give "
                            f"{a.option_strings[-1]} once")
                seen[a.dest] = given
        else:
            for a in cur._actions:
                if isinstance(a, argparse._SubParsersAction) and tok in a.choices:
                    cur = a.choices[tok]
                    opts = index(cur)
                    break
        i += 1
    return None


def _run(parser, args, argv: list[str] | None = None) -> int:
    from gac.progress import is_quiet, quiet_libraries, quiet_scope

    quiet = args.quiet or is_quiet()
    level = logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO  # -q: warnings and errors only
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")

    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        twice = repeated_option(parser, argv or [])
        if twice:
            raise GacError(twice)
        with quiet_scope(quiet):
            quiet_libraries(verbose=args.verbose)
            return int(args._run(args) or 0)
    except GacError as e:
        print(f"{args._prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
