"""The ``gac`` command line.

Sub-commands live in :mod:`gac.commands`, one module each, discovered at start-up. A module defines
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; its heavy imports happen inside
``run`` so that ``gac --help`` stays fast. Errors caused by input are :class:`gac.errors.GacError`:
printed as one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import pkgutil
import sys

from gac import __version__, commands
from gac.checks import check_utf8_args
from gac.errors import GacError

_NOT_COMMANDS = {"hydra_apps"}  # the Hydra entry points (gac-run, gac-bench, gac-profile-device) live beside them


def _command_modules():
    mods = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_COMMANDS:
            continue
        mods.append(importlib.import_module(f"gac.commands.{info.name}"))
    return mods


class _UsageError(Exception):
    """An argument argparse refuses (a missing one, ``--seed 1e20`` for an integer): one line, not the usage."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse, its errors raised (one line and exit code 2 in :func:`main`) instead of printed with the usage;
    sub-command parsers are of the same class."""

    def error(self, message):
        raise _UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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


def _dash_value_hint(message: str, argv: list[str]) -> str:
    """argparse's "expected one argument" for a value that starts with '-' (``--sensitivity-limit -1h``): argparse
    read the value as a flag; say how to give it."""
    import re

    m = re.match(r"argument (\S+?)(?:/(\S+))?: expected one argument", message)
    if not m:
        return ""
    flags = {m[1], m[2]} - {None}
    for i, a in enumerate(argv[:-1]):
        if a in flags and argv[i + 1].startswith("-"):
            return f" (argparse read {argv[i + 1]!r} as a flag): write {a}={argv[i + 1]}"
    return ""


def main(argv: list[str] | None = None) -> int:
    """Run ``gac ARGV``. Bad input: one line ``gac CMD: error: ...`` on stderr, exit code 2. Ctrl-C (at any point,
    start-up included): one line ``gac CMD: interrupted; ...``, exit code 130, never a traceback."""
    prog = "gac"
    saved = sys.stdout
    guard = guard_closed_pipe()
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except _UsageError as e:
            where = e.prog
            if where == parser.prog:  # unrecognized arguments are the top parser's to report: name the command
                with contextlib.suppress(_UsageError):
                    where = getattr(parser.parse_known_args(argv)[0], "_prog", where)
            print(f"{where}: error: {e}{_dash_value_hint(str(e), sys.argv[1:] if argv is None else argv)}; see "
                  f"{where} --help", file=sys.stderr)
            return 2
        prog = getattr(args, "_prog", prog)
        if guard is not None:
            guard.prog = prog
        try:
            check_utf8_args(sys.argv[1:] if argv is None else argv)  # before any work: see check_utf8_args
            if sys.stdout is None:  # `gac demo >&-`: Python drops a closed stdout; every print went nowhere, exit 0
                raise GacError("stdout is closed (>&-): gac prints its results and summaries there; redirect it to a "
                               "file or to /dev/null instead (> out.txt)")
        except GacError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        rc = _run(parser, args, sys.argv[1:] if argv is None else list(argv))
        if guard is not None:
            guard.flush()  # the output still buffered: a full disk says so now, not at exit with a traceback
            if guard.failed:
                return 2
            if guard.closed:
                return 141
        return rc
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted_message(prog)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gac align x.json | head`: the reader left; nothing more to say
        _silence_stdout()
        return 141
    finally:
        if guard is not None:
            sys.stdout = saved


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
    """``sys.stdout`` that survives where its output cannot go: once the reader of a pipe has gone, output goes to
    /dev/null quietly and the run goes on (its record written) instead of ending in a BrokenPipeError traceback; when
    stdout cannot be written (a full disk, a quota, an I/O error), one line says so on stderr, once, the rest of
    the output is dropped and :attr:`failed` holds why (``gac`` then exits 2; a job's record is written either
    way)."""

    def __init__(self, stream, prog: str = "gac"):
        self._stream = stream
        self.prog = prog
        self.failed: str | None = None
        self.closed = False  # the reader of a pipe left

    def _lost(self, e: OSError) -> None:
        self.closed = self.closed or isinstance(e, BrokenPipeError)
        if not isinstance(e, BrokenPipeError) and self.failed is None:
            self.failed = e.strerror or str(e)
            print(f"{self.prog}: error: cannot write the output to stdout ({self.failed}); free space where it goes "
                  f"or send it elsewhere", file=sys.stderr)
        _silence_stdout()

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as e:
            self._lost(e)
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as e:
            self._lost(e)
            with contextlib.suppress(OSError, ValueError):  # what is still buffered goes to /dev/null, not a traceback
                self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_closed_pipe(prog: str = "gac") -> _ClosedPipeSafe | None:
    """Make ``... | head`` end quietly and stdout on a full disk one line (see :class:`_ClosedPipeSafe`); returns
    the guard now in ``sys.stdout`` (None when there is no stdout), or None when one was already there."""
    if isinstance(sys.stdout, _ClosedPipeSafe) or sys.stdout is None:
        return None
    sys.stdout = _ClosedPipeSafe(sys.stdout, prog)
    return sys.stdout


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
        from gac.checks import check_environment

        check_environment()  # GAC_LOCK_STALE_S=abc: one line now, not a traceback where it is first read
        with quiet_scope(quiet):
            quiet_libraries(verbose=args.verbose)
            return int(args._run(args) or 0)
    except GacError as e:
        print(f"{args._prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
