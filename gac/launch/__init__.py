"""Where jobs run: a loopback single-node Slurm cluster for tests, and sweep status over the results store."""
