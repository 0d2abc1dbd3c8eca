"""The one record query: ``--where`` selects the same records through ``gac report``, ``gac bench`` and
``gac wandb backfill`` (fixture store_mixed: a baseline, ASVD unaligned/GAC at window 1 and 8, LLM-Pruner without
tasks), by one match rule and one rule for the baseline (it passes a filter on what it does not depend on when a
compressed record of its model matches)."""

import math

import pytest

from gac.cli import main
from gac.errors import GacError
from gac.results import ResultsStore
from gac.results.query import AnyOf, lookup, matches, parse_where, select_records
from tests.analysis.conftest import FIXTURES

MIXED = FIXTURES / "store_mixed"
BASELINE = "m000000000000001"


@pytest.mark.parametrize("value,want,hit", [
    (True, "1", True), (True, "true", True), (True, "True", True), (True, "0", False), (False, "false", True),
    (True, 1, True), (0.15, "0.15", True), (0.15, 0.15 * (1 + 1e-12), True), (0.15, "0.1500001", False),
    (900000, "900000.0001", True), (1e-5, "1.00000000001e-5", True), (0.0, "0", True), (0.0, "1e-13", False),
    (8, "8.0", True), ("8", 8, True), ("asvd", "asvd", True), ("asvd", "ASVD", False), (None, "none", True),
    (None, "null", True), (None, "", True), (None, "0", False), (math.nan, "none", True),
    (["piqa", "hellaswag"], '["piqa", "hellaswag"]', True), (["piqa", "hellaswag"], "[piqa,hellaswag]", True),
    (("piqa", "hellaswag"), ["piqa", "hellaswag"], True), ([], "[]", True), ([], (), True), ([1, 2], "[1,2.0]", True),
    ({"a": 1}, '{"a": 1.0}', True), ("asvd", AnyOf(("palu", "asvd")), True), (True, AnyOf(("0", "no")), False),
])
def test_the_match_rule(value, want, hit):
    assert matches(value, want) is hit


def test_lookup_reads_job_fields_config_paths_and_record_fields():
    rec = {"key": "k", "job": {"compressor": "asvd", "proxy": None}, "params": 10, "metrics": {"ppl_tiny": 3.5},
           "config": {"compressor": {"options": {"alpha": 0.5}}, "eval": {"ppl": True}}}
    assert lookup(rec, "compressor") == "asvd" and lookup(rec, "proxy") is None and lookup(rec, "key") == "k"
    assert lookup(rec, "compressor.options.alpha") == 0.5 == lookup(rec, "config.compressor.options.alpha")
    assert lookup(rec, "params") == 10 and lookup(rec, "ppl_tiny") == 3.5
    assert select_records([rec], parse_where(["eval.ppl=1"]))[0]["key"] == "k"
    with pytest.raises(GacError, match="unknown filter key 'colour'"):
        select_records([rec], parse_where(["colour=red"]))


def _report_keys(monkeypatch, argv) -> set[str]:
    """The records ``gac report`` keeps for ``argv`` (stopped right after its selection: nothing is written)."""
    import gac.analysis.selection as selection

    got, real = [], selection.filter_settings

    def spy(df, where, what):
        got.append(set(real(df, where, what)["key"]))
        raise GacError("selection recorded")

    monkeypatch.setattr(selection, "filter_settings", spy)
    assert main(["report", str(MIXED), "-o", "/nonexistent/never-written", *argv]) == 2
    return got[0]


def _bench_keys(monkeypatch, argv) -> set[str]:
    """The records ``gac bench`` would measure for ``argv`` (stopped before anything is built)."""
    import gac.jobs.bench.store_bench as bench

    got = []

    def spy(selected, all_records, dtype=None):
        got.append({r["key"] for r in selected})
        raise GacError("selection recorded")

    monkeypatch.setattr(bench, "build_variants", spy)
    assert main(["bench", str(MIXED), *argv]) == 2
    return got[0]


def _backfill_keys(monkeypatch, capsys, argv) -> set[str]:
    monkeypatch.setenv("WANDB_SILENT", "true")
    capsys.readouterr()
    assert main(["wandb", "backfill", str(MIXED), "--dry-run", *argv]) == 0
    return {line[10:].split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()}


@pytest.mark.parametrize("argv,keys", [
    (["--where", "align.window=8"], {BASELINE, "m000000000000004"}),  # the baseline does not depend on align
    (["--where", "eval.ppl=1"], {f"m00000000000000{i}" for i in range(1, 6)}),
    (["--where", "eval.ppl=true", "--where", "eval.limit=50.0"], {f"m00000000000000{i}" for i in range(1, 6)}),
    (["--where", "ratio=0.150000000001"], {f"m00000000000000{i}" for i in range(1, 6)}),
    (["--where", "params=900000.0001"], {f"m00000000000000{i}" for i in range(2, 6)}),
    (["--where", "compressor=llm_pruner", "--where", "compressor=asvd", "--where", "strategy=gac"],
     {"m000000000000003", "m000000000000004", "m000000000000005"}),
    (["--where", "eval.tasks=[]"], {"m000000000000005"}),
    (["--where", 'eval.tasks=["piqa", "hellaswag"]', "--where", "config.align.window=1"],
     {BASELINE, "m000000000000002", "m000000000000003"}),
    (["--sweep", "s2"], {BASELINE, "m000000000000004"}),  # one baseline serves every sweep of its model
    (["--where", "proxy=none"], {BASELINE}),
])
def test_where_selects_the_same_records_in_every_command(monkeypatch, capsys, argv, keys):
    records = list(ResultsStore(MIXED).iter_records())
    assert {r["key"] for r in select_records(records, parse_where(argv[1::2] if argv[0] == "--where" else []),
                                             sweep="s2" if argv[0] == "--sweep" else None)} == keys
    assert _bench_keys(monkeypatch, argv) == keys
    assert _backfill_keys(monkeypatch, capsys, argv) == keys
    assert _report_keys(monkeypatch, argv) == keys


def test_a_baseline_passes_only_beside_a_matching_record_of_its_model():
    """A baseline passes a filter on a setting it does not depend on only where a compressed record of its own model
    matches: a sweep of one model never drags in another model's baseline, and baselines alone are no match."""
    base = {"key": "b", "job": {"model": "tiny", "compressor": "none", "strategy": "baseline", "sweep": "s0"}}
    other = {"key": "o", "job": {"model": "smollm2", "compressor": "none", "strategy": "baseline", "sweep": "s0"}}
    comp = {"key": "c", "job": {"model": "tiny", "compressor": "asvd", "strategy": "gac", "sweep": "s1"}}
    assert {r["key"] for r in select_records([base, other, comp], sweep="s1")} == {"b", "c"}
    with pytest.raises(GacError, match="no completed record matches"):
        select_records([base, other], sweep="s1")


# A repeated ``--where`` key means OR, in ``gac bench`` and in ``gac report``.
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

    from gac.analysis.selection import filter_settings
    from gac.results import AnyOf, add_filter

    where: dict = {}
    for k, v in (("compressor", "asvd"), ("compressor", "palu"), ("compressor", "asvd")):
        add_filter(where, k, v)
    assert where == {"compressor": AnyOf(("asvd", "palu"))}
    df = pd.DataFrame({"compressor": ["asvd", "palu", "svd_llm"], "strategy": ["gac"] * 3,
                       "config": [{}, {}, {}]})
    assert list(filter_settings(df, where, "gac report")["compressor"]) == ["asvd", "palu"]
