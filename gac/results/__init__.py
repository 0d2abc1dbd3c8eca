"""The results store: one JSON record per job, append-only, keyed by the resolved config; and the one query that
selects its records (:mod:`gac.results.query`)."""

from gac.results.keys import config_key
from gac.results.query import AnyOf, add_filter, matches, parse_where, select_records
from gac.results.store import ResultsStore
from gac.results.validate import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "AnyOf", "ResultsStore", "add_filter", "config_key", "matches", "parse_where",
           "select_records"]
