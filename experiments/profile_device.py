"""Kernel dimension sweeps on this machine -> a HardwareProfile (see docs/profiling.md).

    python experiments/profile_device.py device=cpu quick=true out_dir=/tmp/prof
    python experiments/profile_device.py device=cuda out_dir=profiles/h100

The same app is installed as ``gac-profile-device`` (:func:`gac.commands.hydra_apps.profile_device`); the work lives
in :func:`gac.profiling.profile_device`.
"""

from gac.commands.hydra_apps import profile_device

if __name__ == "__main__":
    profile_device()
