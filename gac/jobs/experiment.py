"""The bridge between Hydra configs and the library: run one job from a config, expand and check a sweep.

``experiments/run.py`` calls :func:`run_from_hydra`; tests and notebooks call :func:`run_config` with a plain dict
(for instance from :func:`compose_config`). :class:`SweepCallback` (enabled in ``conf/config.yaml``) checks every
point of a multirun before anything is launched — an invalid value anywhere fails the whole sweep up front — and
ends it with its report (:mod:`gac.jobs.sweep_end`: each point's outcome, the bench, the table).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gac.errors import GacError
from gac.jobs.compose import CONF_DIR, compose

log = logging.getLogger(__name__)

_FAILED_POINTS: list[tuple[list[str], str]] = []  # (overrides, error) of in-process sweep points refused on bad input


def run_config(cfg: dict, overrides: Sequence[str] = (), sweep_dir: str | None = None) -> dict:
    """Validate ``cfg`` (a resolved config as a plain dict), run the job, return its record."""
    from gac.checks import check_environment
    from gac.jobs.config import job_from_config
    from gac.jobs.pipeline import run_job
    from gac.jobs.tracking import build_loggers
    from gac.progress import quiet_libraries, set_quiet
    from gac.results import ResultsStore

    check_environment()  # the environment of the node the job runs on, before any work
    if cfg.get("quiet") is not None:
        set_quiet(bool(cfg["quiet"]))
    quiet_libraries(verbose=bool(cfg.get("verbose", False)))
    spec, resolved = job_from_config(cfg)  # the config read once: the job, and what its record says ran
    if overrides and sweep_dir is None:  # a sweep's points were checked together when it started (SweepCallback)
        from gac.jobs.axes import check_overrides

        check_overrides(spec, cfg, overrides)  # a setting this job cannot use: refused before any work
    cfg = resolved
    if spec.sweep is None and sweep_dir is not None:
        spec.sweep = "/".join(Path(sweep_dir).parts[-2:])
    from gac.results.store import results_root

    results_dir = results_root(cfg.get("results_dir", "results"))
    store = ResultsStore(results_dir)
    loggers = build_loggers(results_dir, (cfg.get("logger") or {}).get("wandb"))
    save_model = cfg.get("save_model")
    return run_job(spec, store, config=cfg, overrides=overrides, force=bool(cfg.get("force", False)),
                   loggers=loggers, save_model=save_model, on_busy=str(cfg.get("on_busy", "wait")))


def run_from_hydra(cfg) -> dict | None:
    """The body of ``experiments/run.py``: a single run exits 2 with one line on bad input; in a multirun the
    error propagates so the launcher reports the job as failed (the store has its failure record)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        container = OmegaConf.to_container(cfg, resolve=True)
        record = run_config(container, list(hc.overrides.task), sweep_dir=hc.sweep.dir if multirun else None)
    except GacError as e:
        if not multirun:
            print(f"experiments/run.py: error: {e}", file=sys.stderr)
            sys.exit(2)
        if "BasicLauncher" not in str(hc.launcher.get("_target_", "")):
            raise  # a remote launcher (Slurm) reports the job as failed; the store has the failure record
        # in-process sweep: one line now, the other points still run, exit code 2 at the end (SweepCallback)
        point = " ".join(hc.overrides.task)
        print(f"experiments/run.py: error: [{point}]: {e}", file=sys.stderr)
        _FAILED_POINTS.append((list(hc.overrides.task), str(e)))
        return None
    except KeyboardInterrupt:
        raise SystemExit(interrupted()) from None
    if not multirun:
        print(format_record(record))
    return record.get("metrics")


INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C


def interrupted(prog: str = "experiments/run.py", resumes: bool = True) -> int:
    """Ctrl-C on a job: one line instead of a traceback, exit code 130. A job has recorded its attempt as
    interrupted (``work/<key>/attempts.json``) and kept its finished stages, so running it again resumes."""
    what = "re-run to resume (finished stages are kept)" if resumes else "re-run to start again (nothing was recorded)"
    print(f"{prog}: interrupted; {what}", file=sys.stderr)
    return INTERRUPTED_EXIT


def format_record(record: dict) -> str:
    job = record.get("job", {})
    head = ", ".join(f"{k}={job[k]}" for k in ("model", "compressor", "proxy", "strategy", "ratio", "gpu")
                     if job.get(k) is not None)
    why = {"busy": "skipped (an identical job is running: on_busy=skip): ",
           "finished by an identical job": "skipped (finished by an identical job this one waited for): "}
    lines = [(why.get(record.get("skip_reason"), "skipped (already done): ") if record.get("skipped") else "") + head]
    if record.get("params") is not None:
        by_unit = (record.get("plan") or {}).get("aligned_by_unit") or {}
        extra = ", ".join(f"{u}: {100 * by_unit[u]:.1f}%" for u in ("8", "16", "32") if u in by_unit)
        lines.append(f"  params {record['params']:,} / budget {record['budget']:,}, "
                     f"aligned {100 * record['aligned_fraction']:.1f}% at unit {job.get('unit')}"
                     + (f" (by unit {extra})" if extra else ""))
    for k, v in sorted((record.get("metrics") or {}).items()):
        if isinstance(v, float):
            lines.append(f"  {k:<24} {v:.4g}")
    lines += _task_data_lines(record)
    warning = ((record.get("evaluation") or {}).get("perplexity") or {}).get("warning")
    if warning:
        lines.append(f"  WARNING: {warning}")
    if record.get("_path"):
        lines.append(f"  record: {record['_path']}")
    return "\n".join(lines)


def _task_data_lines(record: dict) -> list[str]:
    """A line saying what a look-alike set's task items are (``model.task_files: enwiki``:
    PiQA-/HellaSwag-format items made from Wikipedia articles, not the datasets) when the record has task
    metrics of that set."""
    from gac.metrics import is_lookalike, task_data, task_data_note

    config = record.get("config") or {}
    model = config.get("model") if isinstance(config.get("model"), dict) else config  # or a bare JobSpec's
    data = task_data(model.get("task_files")) if "task_files" in model else None
    metrics = record.get("metrics") or {}
    tasks = [t for t in ("piqa", "hellaswag") if any(str(k).startswith(f"{t}_") for k in metrics)]
    if not (is_lookalike(data) and tasks):
        return []
    return [f"  {', '.join(f'{t}_*' for t in tasks)}: {task_data_note(data, tasks)}"]


# ----------------------------------------------------------------------------------------------------- sweeps


def compose_config(overrides: Sequence[str] = (), config_dir: str | os.PathLike | None = None,
                   return_hydra_config: bool = False):
    """Compose ``conf/config.yaml`` with ``overrides`` outside any running app (tests, notebooks, status)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from gac.jobs.schema import register

    register()  # conf/config.yaml composes the typed schema first
    d = str(Path(config_dir or CONF_DIR).resolve())
    parsed = parse_overrides(overrides)
    _check_experiment_override(parsed)
    _check_required_groups(parsed, d)
    try:
        return compose("config", overrides, config_dir=d, return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as e:
        raise GacError(_hydra_message(e, parsed, d)) from None


def parse_overrides(overrides: Sequence[str]) -> list:
    """Hydra's own parse of command-line overrides (its public parser), a syntax error as one :class:`GacError`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except Exception as e:  # hydra.errors.OverrideParseException; its text names the bad override
        raise GacError(f"cannot parse the overrides {list(overrides)}: {str(e).strip().splitlines()[0]}"
                       f"{_parse_hint(list(overrides))}") from None


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
    groups = _group_options(conf_dir)
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
    """Hydra's error (its first line), with a close-match suggestion when an override names an unknown group option
    or an unknown key. The culprit is found from the parsed overrides and the config tree, not from Hydra's text."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    cause = e.__cause__
    if cause is not None and str(cause).strip():  # "Error merging override x=y" says why only in its cause
        why = str(cause).strip().splitlines()[0]
        if why not in msg:
            msg = f"{msg}: {why}"
    groups = _group_options(conf_dir)
    if "could not be converted to Integer" in msg:  # seed=1e20: a float where the schema wants an integer
        for o in parsed:
            if o.input_line in msg:
                return f"{msg}; give {o.key_or_group} a whole number (e.g. {o.key_or_group}=0)"
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


def _is_list_key(path: str, conf_dir: str) -> bool:
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.select(compose("config", [], config_dir=conf_dir), path)
    except Exception:  # noqa: BLE001 - a courtesy hint only
        return False
    return OmegaConf.is_list(node)


def _group_options(conf_dir: str) -> dict[str, list[str]]:
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
        groups = sorted(_group_options(conf_dir)) if not parent else []
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
    values (``a,b``, ``range(...)``) are left to :class:`SweepCallback`, which checks every point."""
    flags = [a for a in argv if a.startswith("-")]
    if any(f not in ("-m", "--multirun") for f in flags):
        return
    overrides = [a for a in argv if not a.startswith("-")]
    if flags:
        overrides = [o for o in overrides if not _is_swept(o)]
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


def _is_swept(override: str) -> bool:
    value = override.split("=", 1)[-1]
    return "," in value or value.startswith(("range(", "choice(", "glob(", "interval(", "tag("))


def expand_sweep(overrides: Sequence[str], sweeper_params: dict | None = None) -> list[list[str]]:
    """The override list of every job of a multirun: the cartesian product of the swept values, in the order of
    Hydra's basic sweeper (the experiment's sweeper params first, then the command line; the last key varies
    fastest). Built on Hydra's public override parser: ``a,b``, ``range(...)``, ``choice(...)``, ``glob(...)``."""
    import itertools

    from hydra.core.override_parser.types import ValueType

    params = [f"{k}={v}" for k, v in (sweeper_params or {}).items()]
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    params = [p for p in params if p.split("=", 1)[0] not in given] + list(overrides)
    parsed = parse_overrides(params)
    axes = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override() and o.key_or_group == "experiment":  # each experiment is a sweep of its own
            values = o.sweep_string_iterator() if o.value_type != ValueType.GLOB_CHOICE_SWEEP else ()
            cmds = "; ".join(f"python experiments/run.py -m experiment={v}" for v in values) or (
                "python experiments/run.py -m experiment=NAME, once per experiment")
            raise GacError(f"{o.input_line}: each experiment is a sweep of its own (its hydra.sweeper.params), which "
                           f"a sweep over experiment would drop, running one default job per name instead; run each "
                           f"experiment in its own -m command: {cmds}")
        if o.is_sweep_override():
            if o.is_interval_sweep():
                raise GacError(f"{o.input_line}: an interval sweep needs an optimising sweeper; list the values "
                               f"(a,b,c) or use range(...)")
            if o.value_type == ValueType.GLOB_CHOICE_SWEEP:  # glob(*) picks among a config group's options, which only the config tree knows
                options = _group_options(str(CONF_DIR)).get(o.key_or_group)
                if options is None:
                    raise GacError(f"{o.input_line}: glob(...) sweeps the options of a config group ("
                                   f"{', '.join(sorted(_group_options(str(CONF_DIR))))}); list the values of a key "
                                   f"(a,b,c) or use range(...)")
                chosen = o.value().filter(options)
                if not chosen:
                    raise GacError(f"{o.input_line} matches none of the {o.key_or_group} options "
                                   f"({', '.join(options)})")
                axes.append([f"{key}={v}" for v in chosen])
                continue
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([f"{key}={o.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*axes)]


def sweep_points(overrides: Sequence[str], config_dir: str | os.PathLike | None = None,
                 sweeper_params: dict | None = None) -> list[dict]:
    """Every point of the sweep ``overrides`` describes (experiment sweeper params included), each validated:
    ``{"overrides", "config", "spec", "key"}``. Raises :class:`GacError` naming the first bad point.

    ``sweeper_params``: the sweep's ``hydra.sweeper.params`` when the caller has them (a running app); otherwise
    they are read from the config the non-swept overrides compose to."""
    from omegaconf import OmegaConf

    from gac.jobs.axes import check_sweep
    from gac.jobs.config import spec_from_config

    if sweeper_params is None:
        primary = compose_config(overrides=[o for o in overrides if not _is_swept(o)],
                                 config_dir=config_dir, return_hydra_config=True)
        sweeper_params = _sweeper_params(primary)
    points = []
    for job in expand_sweep(overrides, sweeper_params):
        try:
            cfg = compose_config(job, config_dir=config_dir)
            container = OmegaConf.to_container(cfg, resolve=True)
            spec = spec_from_config(container)
        except GacError as e:
            raise GacError(f"sweep point [{' '.join(job)}]: {e}") from None
        points.append({"overrides": job, "config": container, "spec": spec, "key": spec.key})
    check_sweep(points, config_dir)  # an axis a point cannot use (gac.jobs.axes)
    return points


def _sweeper_params(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.get("params") else {}


try:  # Hydra is a hard dependency, but keep `import gac.jobs.experiment` cheap to fail clearly
    from hydra.experimental.callback import Callback as _Callback
except ImportError:  # pragma: no cover
    _Callback = object


class SweepCallback(_Callback):
    """Checks a multirun's every point before launch; ends it with its report (:mod:`gac.jobs.sweep_end`): here for
    an in-process sweep, from the end-of-sweep Slurm job's report for a Slurm one."""

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            points = sweep_points(list(config.hydra.overrides.task), sweeper_params=_sweeper_params(config))
            if (config.get("bench") or {}).get("after_sweep"):
                from gac.jobs.bench import check_bench_overrides

                check_bench_overrides(list(config.bench.get("overrides") or []))
        except GacError as e:
            print(f"experiments/run.py: error: {e}\nnothing was launched.", file=sys.stderr)
            sys.exit(2)
        if config.hydra.launcher.get("_target_", "").endswith("SlurmLauncher"):
            from gac.jobs.inputs import check_sweep_offline
            from gac.jobs.site import check_slurm

            try:
                check_slurm(_launcher_settings(config), gpu=(config.get("gpu") or {}).get("name"))
                check_sweep_offline([p["spec"] for p in points], list(config.hydra.overrides.task))
            except GacError as e:
                print(f"experiments/run.py: error: {e}", file=sys.stderr)
                sys.exit(2)
        log.info("sweep checked: %d points", len(points))
        from gac.jobs.sweep_end import note_points

        self._points = [{"overrides": p["overrides"], "key": p["key"]} for p in points]
        note_points(config.hydra.sweep.dir, self._points)  # for the Slurm launcher's end-of-sweep job

    def on_multirun_end(self, config, **kwargs) -> None:
        from gac.jobs.sweep_end import finish_sweep, submitted, sweep_plan

        plan = submitted(config.hydra.sweep.dir)
        if plan is not None:  # a Slurm sweep: its end-of-sweep job did (or will do) the bench, table and report
            if plan.get("end_failed"):  # said by the launcher, with the job's log
                sys.exit(1)
            report = plan.get("report")
            if report and report.get("failed"):
                n, first = len(report["failed"]), report["failed"][0]
                print(f"experiments/run.py: error: {n} point(s) of the sweep did not finish, the first "
                      f"[{' '.join(first['overrides'])}]: {first['detail']} (each is named above and in "
                      f"{report.get('report')}); the table holds the others. Fix them and re-launch: finished points "
                      f"are skipped", file=sys.stderr)
                sys.exit(1)
            return
        errors = {frozenset(point): e for point, e in _FAILED_POINTS}
        report = finish_sweep(sweep_plan(config, getattr(self, "_points", [])), errors)
        print("\n" + report["text"])
        if _FAILED_POINTS:
            n = len(_FAILED_POINTS)
            _FAILED_POINTS.clear()
            print(f"experiments/run.py: error: {n} point(s) of the sweep failed (each named above); the other points "
                  f"ran. Fix them and re-launch: finished points are skipped", file=sys.stderr)
            sys.exit(2)


def _launcher_settings(config) -> dict:
    """hydra.launcher as a plain mapping (values that do not resolve outside a job, such as the submitit folder's,
    stay as written: none of them is a site setting)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(config.hydra.launcher, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation only a running job can resolve
        return OmegaConf.to_container(config.hydra.launcher, resolve=False)
