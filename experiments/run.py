"""The one job: compress -> dimension sweep -> DP -> evaluate -> prefill latency -> record.

    python experiments/run.py model=tiny compressor=asvd align=gac ratio=0.15
    python experiments/run.py -m compressor=asvd,llm_pruner align=unaligned,gac
    python experiments/run.py -m experiment=table5 hydra/launcher=slurm_h100 gpu=h100 model=llama3_8b

The work lives in :mod:`gac.jobs.experiment` (a plain function of the config); tests call the same function.
"""

import sys
from pathlib import Path

# Python puts this script's folder first on sys.path, where experiments/profile.py would shadow the standard
# library's `profile` module (imported by torch and transformers). The folder holds entry points only.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
# the gac package of this checkout (not another one installed in the environment) runs this checkout's script
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from gac.jobs.schema import register  # noqa: E402

register()  # the typed schema (gac_schema) that conf/config.yaml composes first


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig):
    from gac.jobs.experiment import run_from_hydra

    return run_from_hydra(cfg)


if __name__ == "__main__":
    from gac.cli import guard_closed_pipe
    from gac.jobs.experiment import check_command_line, interrupted

    guard_closed_pipe()  # `python experiments/run.py --cfg job | head`: quiet, no BrokenPipeError traceback
    try:
        check_command_line(sys.argv[1:])  # an unknown option or key: exit 2 and one line, before Hydra starts
        main()
    except KeyboardInterrupt:  # Ctrl-C outside the job itself (composing, a sweep between points)
        sys.exit(interrupted())
