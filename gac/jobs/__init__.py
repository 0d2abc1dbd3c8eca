"""The one job: what it is (:mod:`.spec`), config -> job (:mod:`.config`, typed by :mod:`.schema`),
:mod:`.preflight`, :mod:`.loading` and memory :mod:`.memory_fits`, stage outputs and :mod:`.attempts`, the
:mod:`.prepared_cache`, :mod:`.provenance`, and the recipe itself (:mod:`.recipe`: load -> prepare -> plan -> apply ->
evaluate -> record, :func:`~gac.jobs.recipe.run_job`). Its Hydra bridge (:mod:`.experiment`), sweeps (:mod:`.sweep`)
and its run loggers (:mod:`.tracking`: the disk event log and W&B). Nothing below ``gac.jobs`` imports it."""
