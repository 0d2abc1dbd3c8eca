"""Side-by-side latency of a sweep's records, in one process on one device (gac bench as a Hydra app).

    python experiments/bench.py results_dir=results experiment=table5
    python experiments/bench.py -m hydra/launcher=slurm_h100 results_dir=/shared/results sweep=SWEEP device=cuda

The work lives in :mod:`gac.jobs.bench` (a plain function of the config); ``gac bench`` calls the same function.
"""

import sys
from pathlib import Path

# Python puts this script's folder first on sys.path, where experiments/profile.py would shadow the standard
# library's `profile` module (imported by torch and transformers). The folder holds entry points only.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402


@hydra.main(config_path="../conf", config_name="bench", version_base="1.3")
def main(cfg: DictConfig):
    from gac.jobs.bench import bench_from_hydra

    return bench_from_hydra(cfg)


if __name__ == "__main__":
    from gac.cli import guard_closed_pipe

    guard_closed_pipe()  # `... | head`: quiet, no BrokenPipeError traceback
    try:
        main()
    except KeyboardInterrupt:  # one line and exit code 130, not a traceback
        from gac.jobs.experiment import interrupted

        sys.exit(interrupted("experiments/bench.py", resumes=False))
