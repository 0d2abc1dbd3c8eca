"""The one job: load -> prepare -> plan -> apply -> evaluate -> record.

    python experiments/run.py model=tiny compressor=asvd align=gac ratio=0.15
    python experiments/run.py -m compressor=asvd,llm_pruner align=unaligned,gac
    python experiments/run.py -m experiment=table5 hydra/launcher=slurm_h100 gpu=h100 model=llama3_8b

The same app is installed as ``gac-run`` (:func:`gac.commands.hydra_apps.run`); the work lives in
:mod:`gac.jobs.run.recipe` (:func:`~gac.jobs.run.recipe.run_config`, a plain function of the config, which tests call
directly; :mod:`gac.jobs.run.experiment` is the Hydra bridge); the command line is
checked by :mod:`gac.jobs.config.command_line` and a sweep's points by :mod:`gac.jobs.sweep.points`.
"""

from gac.commands.hydra_apps import run

if __name__ == "__main__":
    run()
