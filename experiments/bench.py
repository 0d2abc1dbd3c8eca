"""Side-by-side latency of a sweep's records, in one process on one device (gac bench as a Hydra app).

    python experiments/bench.py results_dir=results experiment=table5
    python experiments/bench.py -m hydra/launcher=slurm_h100 results_dir=/shared/results sweep=SWEEP device=cuda

The same app is installed as ``gac-bench`` (:func:`gac.commands.hydra_apps.bench`); the work lives in
:mod:`gac.jobs.bench.store_bench` (a plain function of the config); ``gac bench`` calls the same function.
"""

from gac.commands.hydra_apps import bench

if __name__ == "__main__":
    bench()
