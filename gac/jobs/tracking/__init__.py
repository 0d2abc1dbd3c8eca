"""The run loggers (:mod:`.loggers`: the disk event log and W&B)."""
