"""The Hydra apps beside the ``gac`` command line: the main job (``gac-run``), the side-by-side bench
(``gac-bench``) and the kernel dimension sweeps (``gac-profile-device``), installed as console scripts and run by
``experiments/*.py`` in a checkout. (:func:`gac.cli._command_modules` leaves this module out of ``gac``'s
sub-commands.)

Each reads the configs of :func:`gac.io.conf_dir` (the packaged ``gac.conf`` of a wheel, or a checkout's
``conf/``); Hydra's ``--config-dir DIR`` or ``hydra.searchpath=[file://DIR]`` adds a researcher's own configs.
The work lives in plain functions of the config (:mod:`gac.jobs.run.recipe`, :mod:`gac.jobs.bench.store_bench`,
:func:`gac.profiling.profile_device`) that tests call directly.
"""

from __future__ import annotations

import sys

from gac.cli import guard_closed_pipe
from gac.io import conf_dir


def check_argv(prog: str) -> None:
    """The command line's arguments UTF-8 and its ``--config-dir`` a directory of UTF-8 configs, before Hydra reads
    them: else exit code 2 and one line."""
    from gac.checks import check_utf8_args
    from gac.errors import GacError
    from gac.jobs.config.command_line import check_config_dir

    try:
        check_utf8_args(sys.argv[1:])
    except GacError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    check_config_dir(sys.argv[1:], prog)


def _hydra_main(config_name: str, task):
    import hydra

    return hydra.main(config_path=str(conf_dir()), config_name=config_name, version_base="1.3")(task)


def register_launcher() -> None:
    """The typed schema and gac's Slurm launcher, for an app that launches: the launcher's class is registered with
    Hydra's plugins by hand (Hydra's plugin discovery walks the ``hydra_plugins`` folders on ``sys.path`` and misses
    a package an editable install maps, so ``hydra/launcher=gac_slurm`` would be an unknown plugin class there). Done
    here, in the app, so that the config schema never imports the launcher, which imports the jobs."""
    from gac.jobs.config.schema import register

    register()
    try:
        from hydra_plugins.gac_launcher.gac_launcher import GacSlurmLauncher
    except ImportError:  # hydra-submitit-launcher is not installed: the local launcher alone
        return
    from hydra.core.plugins import Plugins

    Plugins.instance().register(GacSlurmLauncher)


def _run_task(cfg):
    from gac.jobs.run.experiment import run_from_hydra

    return run_from_hydra(cfg)


def run() -> None:
    """The one job: compress -> dimension sweep -> DP -> evaluate -> prefill latency -> record (``conf/config.yaml``)."""
    from gac.jobs.config.command_line import check_command_line
    from gac.jobs.run.experiment import interrupted
    guard_closed_pipe("experiments/run.py")  # `... --cfg job | head`: quiet, no BrokenPipeError traceback
    check_argv("experiments/run.py")
    register_launcher()  # the typed schema (gac_schema) that conf/config.yaml composes first, and the launcher
    try:
        check_command_line(sys.argv[1:])  # an unknown option or key: exit 2 and one line, before Hydra starts
        _hydra_main("config", _run_task)()
    except KeyboardInterrupt:  # Ctrl-C outside the job itself (composing, a sweep between points)
        sys.exit(interrupted())


def _bench_task(cfg):
    from gac.jobs.bench.store_bench import bench_from_hydra

    return bench_from_hydra(cfg)


def bench() -> None:
    """Side-by-side latency of a store's records in one process on one device (``gac bench`` as a Hydra app,
    ``conf/bench.yaml``: a Slurm launcher measures a stored sweep on a GPU node)."""

    guard_closed_pipe("experiments/bench.py")
    check_argv("experiments/bench.py")
    register_launcher()  # the Slurm launchers' settings (gac_slurm) and class
    try:
        _hydra_main("bench", _bench_task)()
    except KeyboardInterrupt:  # one line and exit code 130, not a traceback
        from gac.jobs.run.experiment import interrupted

        sys.exit(interrupted("experiments/bench.py", resumes=False))


def _profile_task(cfg) -> None:
    from omegaconf import OmegaConf

    from gac.errors import GacError

    try:
        _profile(OmegaConf.to_container(cfg, resolve=True))
    except GacError as e:  # bad input: one line and exit code 2, not Hydra's traceback
        print(f"experiments/profile_device.py: error: {e}", file=sys.stderr)
        sys.exit(2)


def _profile(c: dict) -> None:
    from gac.checks import check_environment
    from gac.profiling import profile_device

    check_environment()
    profile_device(
        out_dir=c["out_dir"],
        device=c["device"],
        dtype=c["dtype"],
        quick=bool(c["quick"]),
        sweeps=c["sweeps"],
        plan_overrides=c["plan"],
        protocol_overrides=c["protocol"],
        tolerance=float(c["tolerance"]),
        horizon=c["horizon"],
        figures=bool(c["figures"]),
        table_format=c["table_format"],
        num_threads=c["threads"],
    )


def profile_device() -> None:
    """Kernel dimension sweeps on this machine -> a HardwareProfile directory (``conf/profile.yaml``)."""
    guard_closed_pipe("experiments/profile_device.py")
    check_argv("experiments/profile_device.py")
    register_launcher()  # the Slurm launchers (gac_slurm), for a profile submitted with -m hydra/launcher=slurm_*
    _hydra_main("profile", _profile_task)()
