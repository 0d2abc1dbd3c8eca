"""The results store: one JSON record per job, append-only, keyed by the resolved config."""

from gac.results.store import SCHEMA_VERSION, AnyOf, ResultsStore, add_filter, config_key

__all__ = ["SCHEMA_VERSION", "AnyOf", "ResultsStore", "add_filter", "config_key"]
