"""The bench of a stored sweep (:mod:`.store_bench`, :mod:`.variants`)."""
