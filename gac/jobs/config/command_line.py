"""The command line of ``experiments/run.py`` and the overrides of any Hydra compose, checked before Hydra runs:
an unknown group option or key, a value given twice, an interpolation that does not resolve, a directory that
cannot be created each exit with code 2 and one line (with close matches) instead of Hydra's multi-line error
(:func:`check_command_line`, :func:`compose_config`, :func:`parse_overrides`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gac.errors import GacError
from gac.jobs.config.compose import compose, conf_root, hydra_text


def compose_config(overrides: Sequence[str] = (), config_dir: str | os.PathLike | None = None,
                   return_hydra_config: bool = False):
    """Compose ``conf/config.yaml`` with ``overrides`` outside any running app (tests, notebooks, status)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from gac.jobs.config.schema import register
    from gac.jobs.sweep.site_files import check_site_files

    register()  # conf/config.yaml composes the typed schema first
    d = str(conf_root(config_dir))
    check_site_files(d)
    parsed = parse_overrides(overrides)
    _check_experiment_override(parsed)
    _check_required_groups(parsed, d)
    try:
        return compose("config", overrides, config_dir=d, return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as e:
        raise GacError(_hydra_message(e, parsed, d)) from None
    except UnicodeDecodeError as e:  # Hydra reads a config file that is not UTF-8 and does not say which
        check_utf8_configs(d)
        raise GacError(f"a config file under {d} is not UTF-8 text ({e.reason}); save it as UTF-8") from None


def check_utf8_configs(conf_dir: str | os.PathLike) -> None:
    """Every ``*.yaml`` under ``conf_dir`` UTF-8 text, else one line naming the first that is not (Hydra's own
    answer is a ``UnicodeDecodeError`` traceback naming no file). Three levels deep: config groups, not a whole
    home directory given as ``--config-dir``."""
    root = Path(conf_dir)
    for f in sorted(f for pattern in ("*.yaml", "*/*.yaml", "*/*/*.yaml") for f in root.glob(pattern)):
        try:
            f.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise GacError(f"config file {str(f)!r} is not UTF-8 text (byte {e.start}: {e.reason}); save it as "
                           f"UTF-8") from None
        except OSError:
            continue  # unreadable: Hydra names it


def parse_overrides(overrides: Sequence[str]) -> list:
    """Hydra's own parse of command-line overrides (its public parser), a syntax error as one :class:`GacError`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception as e:  # hydra.errors.OverrideParseException; its text names the bad override
        raise GacError(f"cannot parse the overrides {list(overrides)}: {str(e).strip().splitlines()[0]}"
                       f"{_parse_hint(list(overrides))}") from None
    for o in parsed:
        _check_no_huge_integer(o)
    return parsed


def _check_no_huge_integer(o) -> None:
    """An integer no float holds (hundreds of digits) is no setting: OmegaConf's conversion of it to a float key
    would end in an OverflowError traceback, so it is refused by name here."""
    def ints(v):
        if isinstance(v, int) and not isinstance(v, bool):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                yield from ints(x)
        elif isinstance(v, dict):
            for x in v.values():
                yield from ints(x)
        elif hasattr(v, "list"):  # a sweep over choices: each of them
            yield from ints(v.list)

    try:
        values = list(ints(o.value()))
    except Exception:  # noqa: BLE001 - a value only Hydra can expand (an interval sweep): Hydra judges it
        return
    for v in values:
        if abs(v) >= 2**1023:
            raise GacError(f"override {o.key_or_group}=...: an integer of about {round(v.bit_length() * 0.30103)} digits "
                           f"is no setting (a number gac reads is below 1e308); give the value the key means")


def _parse_hint(overrides: list[str]) -> str:
    """The usual cause of a parse error, said: a value with a space the shell split in two, or shell quoting lost."""
    for o in overrides:
        if o != o.strip():
            return f"; {o!r} has spaces around it: write {o.strip()!r}"
    for i, o in enumerate(overrides):
        if "=" not in o and not o.startswith(("~", "-")) and i > 0 and "=" in overrides[i - 1]:
            prev = overrides[i - 1]
            key, _, value = prev.partition("=")
            return (f"; {o!r} is not KEY=VALUE: if it is the rest of {key}'s value (a path with a space), quote the "
                    f"whole override for the shell: '{key}=\"{value} {o}\"'")
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and "~" in value and not value.startswith(("'", '"')):
            fix = f"'{key}=\"{value}\"'" if "/" in value else f"{key}={value.replace('~', '')} or '{key}=\"{value}\"'"
            return (f"; '~' in a value must be quoted for Hydra inside shell quotes: write {fix} (unquoted, '~' only "
                    f"deletes a key: ~{key.lstrip('+~')})")
        if sep and any(c in value for c in " ()[]{}:,'\"") and not value.startswith(("[", "{", "'", '"')):
            return (f"; a value with spaces or special characters must be quoted for Hydra inside shell quotes: "
                    f"'{key}=\"{value}\"'")
    return ""


def _check_experiment_override(parsed) -> None:
    for o in parsed:
        if o.key_or_group == "experiment" and o.is_add():
            raise GacError(f"write experiment={o.value()} without '+': experiment is a config group with a default "
                           f"in conf/config.yaml, which '+experiment=' clashes with")


def _check_required_groups(parsed, conf_dir: str) -> None:
    """A config group set to null fails inside Hydra with a ValueError traceback: say what to give instead (one of
    its options; for a group every job needs, model, compressor, align, ..., its default)."""
    import yaml

    try:
        defaults = (yaml.safe_load((Path(conf_dir) / "config.yaml").read_text()) or {}).get("defaults") or []
    except (OSError, yaml.YAMLError):
        return
    required = {k: v for d in defaults if isinstance(d, dict) for k, v in d.items()
                if v is not None and not str(k).startswith(("optional", "override"))}
    groups = group_options(conf_dir)
    for o in parsed:
        if o.key_or_group not in groups or o.is_delete() or o.is_sweep_override() or o.value() is not None:
            continue
        options = ", ".join(groups[o.key_or_group])
        if o.key_or_group in required:
            raise GacError(f"{o.input_line}: every job needs a {o.key_or_group} config; pick one of {options} (the "
                           f"default: {o.key_or_group}={required[o.key_or_group]})")
        raise GacError(f"{o.input_line}: {o.key_or_group} is unset unless given; leave the override out, or pick "
                       f"one of {options}")


def _hydra_message(e: Exception, parsed, conf_dir: str) -> str:
    """Hydra's error (whole, on one line, its cause kept), with a close-match suggestion when an override names an
    unknown group option or an unknown key. The culprit is found from the parsed overrides and the config tree, not
    from Hydra's text."""
    msg = hydra_text(e)
    for o in parsed:  # a misspelt Slurm launcher setting: the close match among the launcher's own
        leaf = o.key_or_group.removeprefix("hydra.launcher.")
        if leaf != o.key_or_group and "." not in leaf and f"Key '{leaf}' not in" in msg:
            import difflib

            from gac.jobs.sweep.site_files import launcher_keys

            close = difflib.get_close_matches(leaf, sorted(launcher_keys()), n=3, cutoff=0.6)
            if close:
                return f"{msg}; did you mean {' or '.join(repr(f'hydra.launcher.{c}') for c in close)}?"
    groups = group_options(conf_dir)
    if "could not be converted to Integer" in msg:  # seed=1e20: a float where the schema wants an integer
        for o in parsed:
            if o.input_line in msg:
                example = _default_of(o.key_or_group, conf_dir)  # a value the config takes (0 may not be one)
                example = example if isinstance(example, int) and not isinstance(example, bool) else 1
                return f"{msg}; give {o.key_or_group} a whole number (e.g. {o.key_or_group}={example})"
    if "could not be converted to Float" in msg:  # align.latency_budget_ms=5ms: the unit is in the key's name
        for o in parsed:
            if o.input_line in msg:
                unit = " in milliseconds, without a unit" if o.key_or_group.endswith("_ms") else " alone"
                return f"{msg}; give {o.key_or_group} a number{unit} (e.g. {o.key_or_group}=5)"
    if "Cannot assign str to Dict" in msg:  # model.max_memory=40GB: a mapping of device to size
        for o in parsed:
            if o.input_line in msg:
                return (f"{msg}; {o.key_or_group} is a mapping: set one entry at a time, e.g. "
                        f"'+{o.key_or_group}.0=40GiB +{o.key_or_group}.cpu=100GiB'")
    if "ListConfig" in msg or "list or tuple" in msg:  # eval.tasks=piqa: Hydra wants a list
        for o in parsed:
            text = o.get_value_element_as_str() if not o.is_delete() else ""
            if o.key_or_group in msg and not text.startswith("["):
                return (f"{msg.rstrip('.')}; {o.key_or_group} is a list: write '{o.key_or_group}=[{text}]' (quoted "
                        f"for the shell)")
    if msg.startswith("Ambiguous value for argument"):  # a,b without -m
        for o in parsed:
            if o.is_sweep_override():
                key, text = o.key_or_group, o.input_line.split("=", 1)[-1]
                if _is_list_key(key, conf_dir):
                    return f"{msg}; {key} is a list: write '{key}=[{text}]' (quoted for the shell)"
                return f"{msg}; {text} sweeps {key}: add -m (python experiments/run.py -m {o.input_line})"
    for o in parsed:
        if o.is_delete() or o.is_sweep_override():
            continue
        name = o.key_or_group
        if name in groups:
            option = str(o.value())
            if option not in groups[name] and option != "null":
                return _unknown_option(name, option, groups[name], msg)
    for o in parsed:
        if o.is_delete() or o.is_add() or o.is_force_add() or o.key_or_group in groups:
            continue
        if "/" in o.key_or_group or o.key_or_group.startswith("hydra."):
            continue
        if not _key_exists(o.key_or_group, conf_dir, [x.input_line for x in parsed if x.key_or_group in groups]):
            return _unknown_key(o.key_or_group, conf_dir)
    return msg


def _default_of(path: str, conf_dir: str):
    """The value of ``path`` in the config composed without overrides (None where it has none or does not compose)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(compose("config", [], config_dir=conf_dir), path)
    except Exception:  # noqa: BLE001 - a courtesy hint only
        return None


def _is_list_key(path: str, conf_dir: str) -> bool:
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.select(compose("config", [], config_dir=conf_dir), path)
    except Exception:  # noqa: BLE001 - a courtesy hint only
        return False
    return OmegaConf.is_list(node)


def group_options(conf_dir: str) -> dict[str, list[str]]:
    root = Path(conf_dir)
    return {g.name: sorted(p.stem for p in g.glob("*.yaml")) for g in sorted(root.iterdir()) if g.is_dir()
            and g.name != "hydra"}


def _unknown_option(group: str, option: str, known: list[str], hydra_msg: str) -> str:
    import difflib

    close = difflib.get_close_matches(option, known, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {group} {option!r}{hint} known {group} options: {', '.join(known)} (hydra: {hydra_msg})"


def _key_exists(path: str, conf_dir: str, group_overrides: list[str]) -> bool:
    from omegaconf import OmegaConf

    try:
        cfg = compose("config", group_overrides, config_dir=conf_dir)
    except Exception:  # noqa: BLE001 - the groups themselves fail: no key can be judged
        return True
    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return node is not None and hasattr(node, "keys") and leaf in node


def _unknown_key(path: str, conf_dir: str) -> str:
    """An unknown config key with the close matches among the keys the config has at that level."""
    import difflib

    parent, _, leaf = path.rpartition(".")
    try:
        from omegaconf import OmegaConf

        with_hydra = compose("config", [], config_dir=conf_dir)
        node = OmegaConf.select(with_hydra, parent) if parent else with_hydra
        known = sorted(str(k) for k in node) if node is not None and hasattr(node, "keys") else []
        groups = sorted(group_options(conf_dir)) if not parent else []
        known = sorted(set(known) | set(groups))
    except Exception:  # noqa: BLE001 - the suggestion is a courtesy; the error stands without it
        known = []
    close = difflib.get_close_matches(leaf, known, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(f'{parent}.{c}' if parent else c) for c in close)}?" if close else ""
    where = f"under {parent!r}" if parent else "at the top level"
    if close:  # a typo of a known key: the fix is that key (a new key under a typed group is refused anyway)
        return f"unknown config key {path!r}{hint} (known {where}: {', '.join(known)})"
    return (f"unknown config key {path!r} (known {where}: {', '.join(known) or '?'}); to add a new key on "
            f"purpose write +{path}=...")


def check_command_line(argv: Sequence[str]) -> None:
    """Compose what ``experiments/run.py ARGV`` asks for before Hydra does, so that an unknown group option or
    key exits with code 2 and one line (with suggestions) instead of Hydra's multi-line error and code 1.

    Only plain runs and ``-m`` sweeps are checked (``--help``, ``--cfg`` and the like are Hydra's own); swept
    values (``a,b``, ``range(...)``) are left to :class:`gac.jobs.sweep.points.SweepCallback`, which checks every point."""
    flags = [a for a in argv if a.startswith("-")]
    if any(f not in ("-m", "--multirun") for f in flags):
        return
    overrides = [a for a in argv if not a.startswith("-")]
    if flags:
        overrides = [o for o in overrides if not is_swept(o)]
    try:
        launcher = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "hydra/launcher"]
        if launcher and not flags and launcher[-1].split("=", 1)[1] != "local":
            raise GacError(f"{launcher[-1]} applies to multiruns only: without -m this job would run here, on this "
                           f"machine; add -m to submit it (python experiments/run.py -m {' '.join(overrides)})")
        _check_given_once(argv)
        from gac.checks import check_environment

        check_environment()
        cfg = compose_config(overrides)
        _check_resolves(cfg)
        _check_hydra_dirs(overrides)
    except GacError as e:
        print(f"experiments/run.py: error: {e}", file=sys.stderr)
        sys.exit(2)


def check_config_dir(argv: Sequence[str], prog: str) -> None:
    """Hydra's ``--config-dir DIR`` (``-cd DIR``) names an existing directory of UTF-8 configs, else exit code 2 and
    one line: Hydra's own answer to a missing one or a file is three lines and exit code 1, to a non-UTF-8 file a
    traceback."""
    for i, a in enumerate(argv):
        flag, sep, value = a.partition("=")
        if flag not in ("--config-dir", "-cd"):
            continue
        if not sep:
            if i + 1 >= len(argv):
                continue  # Hydra's argparse says a value is missing
            value = argv[i + 1]
        path = Path(os.path.expanduser(value))
        if path.is_dir():
            try:
                check_utf8_configs(path)
            except GacError as e:
                print(f"{prog}: error: {e}", file=sys.stderr)
                sys.exit(2)
        else:
            what = "is a file, not a directory" if path.exists() else "does not exist"
            print(f"{prog}: error: {flag} {value}: {what}; give the directory that holds your own config groups "
                  f"(e.g. DIR with DIR/model/my_model.yaml), or leave {flag} out", file=sys.stderr)
            sys.exit(2)


def _check_given_once(argv: Sequence[str]) -> None:
    """Each key (or config group) set once: ``ratio=0.2 ratio=0.3`` would silently keep the last."""
    seen: dict[str, str] = {}
    for a in argv:
        if a.startswith("-") or "=" not in a:
            continue
        key = a.split("=", 1)[0].lstrip("+~")
        if key in seen:
            raise GacError(f"{seen[key]} and {a} both set {key} (Hydra would keep the last without a word); give "
                           f"{key} once (to run both values, sweep them with -m and {key}=A,B)")
        seen[key] = a


def _check_resolves(cfg) -> None:
    """Every interpolation of the job's config that can be resolved before the app starts resolves
    (``results_dir=${oc.env:NOPE}`` fails here, not in a traceback once the job runs). ``${hydra:...}`` values are
    Hydra's own, known only inside the running app, and left to it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def leaves(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from leaves(v, f"{prefix}[{i}]")
        else:
            yield prefix, node

    for key, raw in leaves(OmegaConf.to_container(cfg, resolve=False)):
        if not isinstance(raw, str) or "${" not in raw or "${hydra:" in raw or key.startswith("hydra"):
            continue
        try:
            OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException as e:
            why = str(e).strip().splitlines()[0]
            if "HydraConfig was not set" in why:  # through another key, a value only the running app knows
                continue
            raise GacError(f"config: {key}={raw} does not resolve ({why}); set what it names (an environment "
                           f"variable: export it) or give {key} a plain value") from None


def _check_hydra_dirs(overrides: Sequence[str]) -> None:
    """``hydra.run.dir`` / ``hydra.sweep.dir`` given on the command line can be created (Hydra would fail with a
    traceback before the job, or after the sweep was planned): the nearest existing parent takes a new directory."""
    import tempfile

    for o in overrides:
        key, sep, value = o.partition("=")
        if not sep or key.lstrip("+") not in ("hydra.run.dir", "hydra.sweep.dir") or "${" in value:
            continue
        d = Path(value.strip("'\"")).expanduser()
        if d.is_dir():
            continue
        parent = d
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        try:
            if not parent.is_dir():
                raise NotADirectoryError(20, "Not a directory")
            os.rmdir(tempfile.mkdtemp(prefix=".gac-probe-", dir=parent))
        except OSError as e:
            raise GacError(f"{key.lstrip('+')}={value}: cannot create a directory under {str(parent)!r} "
                           f"({e.strerror or e}); choose a directory you can write to") from None


def is_swept(override: str) -> bool:
    value = override.split("=", 1)[-1]
    return "," in value or value.startswith(("range(", "choice(", "glob(", "interval(", "tag("))

