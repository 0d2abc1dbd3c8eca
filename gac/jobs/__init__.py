"""The one job (:mod:`.pipeline`), its Hydra bridge (:mod:`.experiment`: run a config, check and expand sweeps)
and its run loggers (:mod:`.tracking`: the disk event log and W&B). Nothing below ``gac.jobs`` imports it."""
