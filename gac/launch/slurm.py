"""gac's Slurm launcher: hydra-submitit's, with the end of the sweep as a Slurm job and the environment a job needs.

``conf/hydra/launcher/slurm_*.yaml`` select it (``_target_: gac.launch.slurm.SlurmLauncher``, the settings of
``gac_slurm``: hydra-submitit's ``submitit_slurm`` plus ``wait`` and ``env``). A launch:

1. resolves the site settings against ``sinfo`` (:func:`gac.jobs.sweep.slurm_site.check_slurm`: a ``gpu=h100`` job on a mixed
   partition asks for the typed GRES of its GPU);
2. writes the variables named in ``env`` that are set here (caches, ``HF_TOKEN``, proxies, ``HF_ENDPOINT``,
   ``HF_HUB_OFFLINE``) into a file only the user can read, which every job sources before ``srun`` (and exports
   ``SLURM_EXPORT_ENV=ALL``, so that ``srun`` passes them on where the site submits with ``--export=NONE``): a token
   or a proxy password never lands in the job script;
3. submits the points as one array, then the end of the sweep (:func:`gac.jobs.sweep.end.end_job`: each point's
   outcome, the bench, the table, the report) as one more job that depends on the array with ``afterany``: it runs
   when every task has ended, however it ended; it removes the environment file;
4. records the launch in the store (``sweeps/``: ``gac launch status`` reads it) and prints where the report will be;
5. with ``wait: true`` (the default) waits for the end-of-sweep job and prints its report; with ``wait: false``
   returns at once. Either way the sweep goes on in Slurm if this process ends: log off and come back.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher

from gac.errors import GacError
from gac.jobs.sweep.slurm_site import ENV_FILE_VAR, env_names
from gac.machine import file_stamp

log = logging.getLogger(__name__)

#: the job script's line that sources the launch's environment file (an absolute path): a job that cannot read it
#: (removed, or a node that does not mount the sweep directory) stops there, rather than run without the caches and
#: the token it was launched with
ENV_FILE_LINE = ('. {path} || {{ echo "gac: cannot read the launch\'s environment file" {path} "(the caches, HF_TOKEN, '
                 'the proxies); re-launch the sweep" >&2; exit 1; }}')
#: the end-of-sweep job's time limit (minutes) when the sweep has no bench: the outcomes, the table and the report
END_TIMEOUT_MIN = 30


class SlurmLauncher(_SubmititSlurmLauncher):
    """hydra-submitit's Slurm launcher with an end-of-sweep job, the job environment and site resolution (module
    docstring)."""

    def __init__(self, wait: bool = True, env: Sequence[str] | None = None, end_gpu: bool | None = None,
                 **params) -> None:
        self.wait = bool(wait)
        self.env = [str(v) for v in (env or [])]
        self.end_gpu = end_gpu
        super().__init__(**params)

    def launch(self, job_overrides, initial_job_idx):
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides
        from omegaconf import OmegaConf

        from gac.jobs.sweep.slurm_site import check_slurm, check_values

        config = self.config
        prog = _PROGS.get(OmegaConf.select(config, "hydra.job.config_name", default=None), "gac")
        try:
            check_values({"env": self.env})
            params = check_slurm(self.params, gpu=OmegaConf.select(config, "gpu.name", default=None))
        except GacError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(2)
        for key in ("gres", "constraint"):
            if params.get(key) != self.params.get(key):
                print(f"Slurm: asking for {key}={params[key]} (gpu={OmegaConf.select(config, 'gpu.name')} on a "
                      f"partition with other GPUs too)")
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(config.hydra.sweep.mode), 8))
        env_file = write_env_file(sweep_dir.resolve(), self.env)  # absolute: a job may run in another directory
        if env_file is not None:
            params["setup"] = [ENV_FILE_LINE.format(path=shlex.quote(str(env_file))), *(params.get("setup") or [])]
        executor = _executor(params)
        log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
        job_params = []
        for idx, overrides in enumerate(job_overrides):
            idx = initial_job_idx + idx
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        try:
            jobs = executor.map_array(self, *zip(*job_params, strict=True))
        except Exception as e:  # noqa: BLE001 - sbatch refused the array: a site setting, said in one line
            if env_file is not None:
                env_file.unlink(missing_ok=True)
            _refused(prog, "the array", e)
        if not _is_run_app(config):  # another app's sweep (experiments/bench.py -m): its jobs are the whole of it
            return self._collect(jobs, job_overrides, env_file)
        from gac.jobs.sweep import end as sweep_end

        array = str(jobs[0].job_id).split("_")[0]
        from gac.jobs.sweep.points import hydra_overrides_of

        plan = sweep_end.sweep_plan(config, _points(sweep_dir, job_overrides, jobs, hydra_overrides_of(config)))
        plan.update(array_job=array, submitit_folder=str(params["submitit_folder"]),
                    env_file=str(env_file) if env_file else None,
                    report_path=str(Path(plan["sweep_dir"]) / f"{sweep_end.REPORT}.md"))
        try:
            end = _executor(_end_params(params, bool((plan.get("bench") or {}).get("after_sweep")), self.end_gpu),
                            end_of=array).submit(sweep_end.end_job, plan)
        except Exception as e:  # noqa: BLE001 - a sweep without its end: nothing would remove the env file
            stopped = _cancel(array)
            if env_file is not None:
                env_file.unlink(missing_ok=True)
            _refused(prog, f"the end-of-sweep job, so array job {array} was "
                           + ("cancelled" if stopped else f"left running (scancel {array} stops it)")
                           + (" and the environment file removed" if env_file is not None else "")
                           + "; fix it and re-launch", e)
        plan["end_job"] = str(end.job_id)
        _record(plan)
        sweep_end.note_submitted(plan)
        print(f"Slurm: {len(jobs)} point(s) submitted as array job {array}; the end-of-sweep job {end.job_id} runs "
              f"when they have all ended (afterany:{array}) and writes {plan['report_path']}. Logging off is safe; "
              f"`gac launch status {' '.join(_shared_overrides(job_overrides))}` says where they are")
        if not self.wait:
            return [_returned(o) for o in job_overrides]
        try:
            report = end.result()
        except KeyboardInterrupt:
            print(f"stopped waiting; array job {array} and the end-of-sweep job {end.job_id} go on in Slurm "
                  f"(scancel {array} {end.job_id} stops them)", file=sys.stderr)
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - cancelled, or its node lost: the points' records are in the store
            print(f"{prog}: the end-of-sweep job {end.job_id} did not finish ({type(e).__name__}: "
                  f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}); its log: {end.paths.stderr}; the "
                  f"points' records are in {plan['results_dir']}: `gac report {plan['results_dir']}`", file=sys.stderr)
            plan["end_failed"] = True
            report = None
        if report is not None:
            print("\n" + report.get("text", ""))
            plan["report"] = {k: v for k, v in report.items() if k != "text"}
        returns = self._collect(jobs, job_overrides, None)
        failed = [r for r in returns if r.status.name != "COMPLETED"]
        if failed or plan.get("end_failed"):
            # Hydra's sweeper raises at the first failed return, before the callback ends the sweep: end it here,
            # with the same line (the report names every point that did not finish)
            line = sweep_end.unfinished(plan) or (
                f"{len(failed)} point(s) of the sweep did not finish, the first [{' '.join(failed[0].overrides)}]: "
                f"{failed[0]._return_value}" if failed else None)
            if line:
                print(f"{prog}: error: {line}", file=sys.stderr)
            sys.exit(1)
        return returns

    def _collect(self, jobs, job_overrides, env_file: Path | None) -> list:
        """Every job's return once it has ended, as it ended: the job's own (completed, or failed with the app's
        error), or failed with what became of it (killed, timed out, out of memory: submitit's error)."""
        out = []
        try:
            for j, o in zip(jobs, job_overrides, strict=True):
                try:
                    r = j.results()[0]
                except Exception as e:  # noqa: BLE001 - killed, timed out, out of memory: submitit's UncompletedJobError
                    lines = str(e).strip().splitlines()
                    r = _failed(o, f"Slurm job {j.job_id} ended without a result ({type(e).__name__}"
                                   f"{': ' + lines[-1].strip()[:300] if lines else ''}; its log: {j.paths.stderr})")
                if getattr(getattr(r, "status", None), "name", None) not in ("COMPLETED", "FAILED"):
                    r = _failed(o, f"Slurm job {j.job_id} returned no job result; its log: {j.paths.stderr}")
                out.append(r)
        finally:
            if env_file is not None:  # no end-of-sweep job to remove it
                env_file.unlink(missing_ok=True)
        return out


_PROGS = {"config": "experiments/run.py", "bench": "experiments/bench.py", "profile": "experiments/profile_device.py"}


def _refused(prog: str, what: str, e: Exception) -> None:
    """sbatch refused a submission: one line with its reason, exit code 2 (a site setting, most often)."""
    why = str(e).strip().splitlines()
    why = next((ln.strip() for ln in reversed(why) if "error" in ln.lower()), why[-1].strip() if why else "")
    print(f"{prog}: error: Slurm refused {what}: {type(e).__name__}: {why[:300]}; check the site settings "
          f"(hydra.launcher.partition, account, qos, ...)", file=sys.stderr)
    sys.exit(2)


def _is_run_app(config) -> bool:
    """Whether the sweep is gac's job app (``conf/config.yaml``), whose points are jobs with records."""
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "hydra.job.config_name", default=None) == "config"


def _executor(params: dict, end_of: str | None = None):
    """A submitit executor with hydra-submitit's mapping of the launcher settings; ``end_of``: the array job the
    end-of-sweep job waits for (``--dependency=afterany:ID``, one job, named ``<name>-end``)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    params = dict(params)
    executor = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                                     slurm_max_num_timeout=int(params.pop("max_num_timeout", 0) or 0))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    params = {(k if k in base else f"slurm_{k}"): v for k, v in params.items()}
    if end_of is not None:
        params.pop("slurm_array_parallelism", None)
        params["name"] = f"{params.get('name') or 'gac'}-end"
        params["slurm_additional_parameters"] = {**(params.get("slurm_additional_parameters") or {}),
                                                 "dependency": f"afterany:{end_of}"}
    executor.update_parameters(**params)
    return executor


def _end_params(params: dict, bench: bool, end_gpu: bool | None) -> dict:
    """The end-of-sweep job's resources: the array's where it benches (the bench runs on the sweep's GPU); without
    a bench, no GPU (unless ``end_gpu``: a partition that refuses jobs without one) and at most
    :data:`END_TIMEOUT_MIN` minutes: the outcomes, the table and the report take seconds."""
    if bench:
        return dict(params)
    out = dict(params, timeout_min=min(int(params.get("timeout_min") or END_TIMEOUT_MIN), END_TIMEOUT_MIN))
    out["signal_delay_s"] = min(int(params.get("signal_delay_s") or 0), END_TIMEOUT_MIN * 60 // 4)
    if not end_gpu:
        for key in ("gpus_per_node", "gpus_per_task", "gres"):
            out.pop(key, None)
    return out


def _cancel(job: str) -> bool:
    """``scancel JOB``; whether it was cancelled."""
    import shutil
    import subprocess

    scancel = shutil.which("scancel")
    try:
        return scancel is not None and subprocess.run([scancel, job], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _returned(overrides):
    """A submitted job's return when the launcher does not wait (``wait: false``): Hydra's sweeper takes only a
    completed or a failed one; its outcome is the end-of-sweep report's (``gac launch status``)."""
    from hydra.core.utils import JobReturn, JobStatus

    return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=None)


def _failed(overrides, why: str):
    from hydra.core.utils import JobReturn, JobStatus

    return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=GacError(why))


def _points(sweep_dir: Path, job_overrides, jobs, hydra_overrides=()) -> list[dict]:
    """The plan's points: each job's overrides, record key (as the sweep check found them), Slurm job and log."""
    from gac.jobs.sweep import end as sweep_end

    checked = {frozenset(p["overrides"]): p["key"] for p in sweep_end.noted_points(sweep_dir)}
    out = []
    for o, j in zip(job_overrides, jobs, strict=True):
        key = checked.get(frozenset(o))
        if key is None:
            from omegaconf import OmegaConf

            from gac.jobs.config.build import spec_from_config
            from gac.jobs.sweep.points import compose_point

            cfg = compose_point(list(o), hydra_overrides)
            key = spec_from_config(OmegaConf.to_container(cfg, resolve=True)).key
        out.append({"overrides": list(o), "key": key, "slurm_job": str(j.job_id), "log": str(j.paths.stderr)})
    return out


def _shared_overrides(job_overrides) -> list[str]:
    """The overrides ``gac launch status`` needs for this sweep: each key once, its values joined as a sweep."""
    values: dict[str, list[str]] = {}
    for o in job_overrides:
        for item in o:
            k, _, v = item.partition("=")
            if k.startswith("hydra.") or k == "hydra/launcher":
                continue
            if v not in values.setdefault(k, []):
                values[k].append(v)
    return [shlex.quote(f"{k}={','.join(v)}") for k, v in values.items()]


def _record(plan: dict) -> None:
    """The launch in the store (``sweeps/<time>-<array job>.json``): ``gac launch status`` finds the end-of-sweep
    job of a sweep there. A store that cannot take it is said, never a failed launch (the jobs are submitted)."""
    from gac.results import ResultsStore

    try:
        store = ResultsStore(plan["results_dir"])
        store.prepare_for_writing()
        store.write_sweep(f"{file_stamp()}-{plan['array_job']}", plan)
    except GacError as e:
        log.warning("could not record the sweep in the store: %s", e)


def write_env_file(directory: Path, names: Sequence[str]) -> Path | None:
    """The variables of ``names`` (``PREFIX*``: every one with that prefix) that are set here, as ``export
    NAME='value'`` lines in a new file under ``directory`` that only this user can read (0600), plus
    ``SLURM_EXPORT_ENV=ALL`` / ``SRUN_EXPORT_ENV=ALL`` so that ``srun`` inside the job passes them to the task even
    where ``sbatch`` ran with ``--export=NONE`` (whose setting job steps otherwise inherit), and ``ENV_FILE_VAR``, its
    own path (a job's record names the file it read). None when none of them is set."""
    lines = [f"export {n}={shlex.quote(os.environ[n])}" for n in env_names(names)
             if os.environ.get(n) and n != ENV_FILE_VAR]
    if not lines:
        return None
    path = directory / f".gac-env-{file_stamp()}-{os.getpid()}.sh"
    # the file's own path, last: a job's record says it read this file (provenance.launch_env_file)
    lines += ["export SLURM_EXPORT_ENV=ALL", "export SRUN_EXPORT_ENV=ALL",
              f"export {ENV_FILE_VAR}={shlex.quote(str(path))}"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# written by gac's Slurm launcher; removed by the end-of-sweep job\n" + "\n".join(lines) + "\n")
    return path
