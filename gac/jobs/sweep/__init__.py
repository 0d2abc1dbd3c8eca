"""Sweeps and the cluster: a sweep's points checked before launch (:mod:`.points`), its end (:mod:`.end`), the Slurm site (:mod:`.slurm_site`, :mod:`.site_files`)."""
