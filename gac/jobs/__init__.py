"""The one job, as stages: what it is (:mod:`.spec`), config -> spec (:mod:`.config`, typed by :mod:`.schema`),
:mod:`.preflight`, :mod:`.loading` and memory :mod:`.fits`, stage outputs and :mod:`.attempts`, the
:mod:`.prepared_cache`, the :mod:`.stages`, :mod:`.provenance`, and the run itself (:mod:`.pipeline`:
:func:`~gac.jobs.pipeline.run_job`). Its Hydra bridge (:mod:`.experiment`: run a config, check and expand sweeps)
and its run loggers (:mod:`.tracking`: the disk event log and W&B). Nothing below ``gac.jobs`` imports it."""
