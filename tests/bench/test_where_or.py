"""A repeated ``--where`` key means OR, in ``gac bench`` and in ``gac report``."""

from __future__ import annotations

import pytest

from gac.errors import GacError


def test_bench_where_repeated_key_is_or():
    from gac.results import AnyOf
    from gac.results.query import parse_where, select_records

    where = parse_where(["compressor=asvd", "compressor=llm_pruner", "ratio=0.15"])
    assert where == {"compressor": AnyOf(("asvd", "llm_pruner")), "ratio": "0.15"}
    recs = [{"key": c, "job": {"model": "tiny", "compressor": c, "strategy": "gac", "ratio": r}}
            for c, r in (("asvd", 0.15), ("llm_pruner", 0.15), ("palu", 0.15), ("asvd", 0.3))]
    assert sorted(r["key"] for r in select_records(recs, where)) == ["asvd", "llm_pruner"]
    with pytest.raises(GacError, match="compressor=x|y"):
        select_records(recs, parse_where(["compressor=x", "compressor=y"]))


def test_report_where_repeated_key_is_or():
    import pandas as pd

    from gac.analysis.tables import filter_settings
    from gac.results import AnyOf, add_filter

    where: dict = {}
    for k, v in (("compressor", "asvd"), ("compressor", "palu"), ("compressor", "asvd")):
        add_filter(where, k, v)
    assert where == {"compressor": AnyOf(("asvd", "palu"))}
    df = pd.DataFrame({"compressor": ["asvd", "palu", "svd_llm"], "strategy": ["gac"] * 3,
                       "config": [{}, {}, {}]})
    assert list(filter_settings(df, where, "gac report")["compressor"]) == ["asvd", "palu"]
