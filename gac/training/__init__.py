"""Training gac's own fixture model, ``tiny`` (:mod:`gac.training.tiny`): above :mod:`gac.evaluation`, which it uses to
measure what it trained."""
