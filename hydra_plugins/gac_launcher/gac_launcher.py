"""gac's Slurm launcher (:mod:`gac.launch.slurm`) where Hydra looks for launchers: Hydra instantiates a launcher
only from a class defined in the ``hydra_plugins`` namespace, found by its plugin discovery."""

from gac.launch.slurm import SlurmLauncher


class GacSlurmLauncher(SlurmLauncher):
    """:class:`gac.launch.slurm.SlurmLauncher` (``hydra/launcher: gac_slurm``)."""
