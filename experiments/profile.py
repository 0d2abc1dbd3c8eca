"""Kernel dimension sweeps on this machine -> a HardwareProfile (see docs/profiling.md).

python experiments/profile.py device=cpu quick=true out_dir=/tmp/prof
python experiments/profile.py device=cuda out_dir=profiles/h100
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from gac.profiling import profile_device


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
    main()
