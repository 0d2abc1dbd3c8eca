"""Kernel dimension sweeps on this machine -> a HardwareProfile (see docs/profiling.md).

python experiments/profile.py device=cpu quick=true out_dir=/tmp/prof
python experiments/profile.py device=cuda out_dir=profiles/h100
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file's name shadows the standard library's `profile` (imported by torch via cProfile) when Python puts
# the script's folder first on sys.path: take it off before anything imports torch.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from gac.profiling import profile_device  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="profile")
def main(cfg: DictConfig) -> None:
    c = OmegaConf.to_container(cfg, resolve=True)
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


if __name__ == "__main__":
    from gac.cli import guard_closed_pipe

    guard_closed_pipe()  # `... | head`: quiet, no BrokenPipeError traceback
    main()
