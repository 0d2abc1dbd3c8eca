"""A multirun's points, expanded and checked before anything is launched: :func:`expand_sweep` (the override list
of every point, in the order of Hydra's basic sweeper), :func:`sweep_points` (each point composed and validated)
and :class:`SweepCallback` (enabled in ``conf/config.yaml``), which checks every point of a multirun before launch
(an invalid value anywhere fails the whole sweep up front) and ends it with its report (:mod:`gac.jobs.sweep.end`:
each point's outcome, the bench, the table).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from gac.errors import GacError
from gac.jobs.config.command_line import compose_config, group_options, is_swept, parse_overrides
from gac.jobs.config.compose import CONF_DIR

log = logging.getLogger(__name__)

FAILED_POINTS: list[tuple[list[str], str]] = []  # (overrides, error) of in-process sweep points refused on bad input


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
                options = group_options(str(CONF_DIR)).get(o.key_or_group)
                if options is None:
                    raise GacError(f"{o.input_line}: glob(...) sweeps the options of a config group ("
                                   f"{', '.join(sorted(group_options(str(CONF_DIR))))}); list the values of a key "
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


def is_hydra_override(override: str) -> bool:
    """Whether ``override`` sets Hydra's own config (``hydra/launcher=slurm_h100``, ``hydra.launcher.partition=x``):
    applied to every job of a sweep as it is, never swept."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def hydra_overrides_of(config) -> list[str]:
    """The hydra overrides a running sweep was launched with (``hydra.overrides.hydra``)."""
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.select(config, "hydra.overrides.hydra", default=None) or []]


def compose_point(job: Sequence[str], hydra_overrides: Sequence[str] = (),
                  config_dir: str | os.PathLike | None = None, return_hydra_config: bool = False):
    """One point of a sweep composed as Hydra composes its job: the launch's hydra overrides (its launcher, with the
    site's ``conf/local/slurm.yaml``, and ``hydra.launcher.*``) and the point's own overrides. The one way gac
    composes a point: the sweep check, ``gac fetch``, ``gac launch status`` and the Slurm launcher all use it."""
    return compose_config([*hydra_overrides, *job], config_dir=config_dir, return_hydra_config=return_hydra_config)


def sweep_points(overrides: Sequence[str], config_dir: str | os.PathLike | None = None,
                 sweeper_params: dict | None = None, hydra_overrides: Sequence[str] = ()) -> list[dict]:
    """Every point of the sweep ``overrides`` describes (experiment sweeper params included), each composed as
    Hydra will (:func:`compose_point`) and validated: ``{"overrides", "config", "spec", "key"}``; a point's
    ``overrides`` are its task overrides, as Hydra's job has them. Raises :class:`GacError` naming the first bad point.

    ``overrides``: a command line (hydra overrides among them are applied to every point); ``hydra_overrides``: the
    launch's own, where the caller has them apart (a running app). ``sweeper_params``: the sweep's
    ``hydra.sweeper.params`` when the caller has them; otherwise they are read from the config the non-swept
    overrides compose to."""
    from omegaconf import OmegaConf

    from gac.jobs.config.axes import check_sweep
    from gac.jobs.config.build import spec_from_config

    hydra = [*hydra_overrides, *(o for o in overrides if is_hydra_override(o))]
    task = [o for o in overrides if not is_hydra_override(o)]
    if sweeper_params is None:
        primary = compose_point([o for o in task if not is_swept(o)], hydra, config_dir=config_dir,
                                return_hydra_config=True)
        sweeper_params = _sweeper_params(primary)
    points = []
    for job in expand_sweep(task, sweeper_params):
        try:
            cfg = compose_point(job, hydra, config_dir=config_dir)
            container = OmegaConf.to_container(cfg, resolve=True)
            spec = spec_from_config(container)
        except GacError as e:
            raise GacError(f"sweep point [{' '.join(job)}]: {e}") from None
        points.append({"overrides": job, "config": container, "spec": spec, "key": spec.key})
    check_sweep(points, config_dir)  # an axis a point cannot use (gac.jobs.config.axes)
    return points


def _sweeper_params(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.get("params") else {}


try:  # Hydra is a hard dependency, but keep `import gac.jobs.sweep.points` cheap to fail clearly
    from hydra.experimental.callback import Callback as _Callback
except ImportError:  # pragma: no cover
    _Callback = object


class SweepCallback(_Callback):
    """Checks a multirun's every point before launch; ends it with its report (:mod:`gac.jobs.sweep.end`): here for
    an in-process sweep, from the end-of-sweep Slurm job's report for a Slurm one."""

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            points = sweep_points(list(config.hydra.overrides.task), sweeper_params=_sweeper_params(config),
                                  hydra_overrides=hydra_overrides_of(config))
            if (config.get("bench") or {}).get("after_sweep"):
                from gac.jobs.bench.store_bench import check_bench_overrides

                check_bench_overrides(list(config.bench.get("overrides") or []))
            if _is_slurm(config):  # the launcher's own values (numbers, env names), before asking the cluster
                from gac.jobs.sweep.slurm_site import check_values

                check_values(_launcher_settings(config))
        except GacError as e:
            print(f"experiments/run.py: error: {e}\nnothing was launched.", file=sys.stderr)
            sys.exit(2)
        if _is_slurm(config):
            from gac.jobs.run.inputs import check_sweep_offline
            from gac.jobs.sweep.slurm_site import check_slurm

            try:
                check_slurm(_launcher_settings(config), gpu=(config.get("gpu") or {}).get("name"))
                check_sweep_offline([p["spec"] for p in points], list(config.hydra.overrides.task))
            except GacError as e:
                print(f"experiments/run.py: error: {e}", file=sys.stderr)
                sys.exit(2)
        log.info("sweep checked: %d points", len(points))
        from gac.jobs.sweep.end import note_points

        self._points = [{"overrides": p["overrides"], "key": p["key"]} for p in points]
        note_points(config.hydra.sweep.dir, self._points)  # for the Slurm launcher's end-of-sweep job

    def on_multirun_end(self, config, **kwargs) -> None:
        from gac.jobs.sweep.end import finish_sweep, submitted, sweep_plan, unfinished

        plan = submitted(config.hydra.sweep.dir)
        if plan is not None:  # a Slurm sweep: its end-of-sweep job did (or will do) the bench, table and report
            if plan.get("end_failed"):  # said by the launcher, with the job's log
                sys.exit(1)
            line = unfinished(plan)
            if line:
                print(f"experiments/run.py: error: {line}", file=sys.stderr)
                sys.exit(1)
            return
        errors = {frozenset(point): e for point, e in FAILED_POINTS}
        report = finish_sweep(sweep_plan(config, getattr(self, "_points", [])), errors)
        print("\n" + report["text"])
        if FAILED_POINTS:
            n = len(FAILED_POINTS)
            FAILED_POINTS.clear()
            print(f"experiments/run.py: error: {n} point(s) of the sweep failed (each named above); the other points "
                  f"ran. Fix them and re-launch: finished points are skipped", file=sys.stderr)
            sys.exit(2)


def _is_slurm(config) -> bool:
    return str(config.hydra.launcher.get("_target_", "")).endswith("SlurmLauncher")


def _launcher_settings(config) -> dict:
    """hydra.launcher as a plain mapping (values that do not resolve outside a job, such as the submitit folder's,
    stay as written: none of them is a site setting)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(config.hydra.launcher, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation only a running job can resolve
        return OmegaConf.to_container(config.hydra.launcher, resolve=False)
