"""``gac doctor``: the node's checks (:mod:`.node`), one check (:mod:`.check`), its runs on tiny (:mod:`.runs`), what a node measured against gac's estimates (:mod:`.report`)."""
