"""gac.metrics: one name per quantity, and records written under the old names still load under the new ones."""

import json

import pytest

from gac.metrics import (
    LOOKALIKE_TASK_SETS,
    dataset_name,
    own_prefill_point,
    ppl_metric,
    prefill_point,
    task_data,
    task_data_note,
    task_metric,
    upgrade_metrics,
)
from gac.results import ResultsStore


@pytest.mark.parametrize(("source", "name"), [
    ("wikitext2", "wikitext2"), ("wikitext-2-raw-v1", "wikitext2"), ("Salesforce/wikitext", "wikitext2"),
    ("wikitext2 (test)", "wikitext2"), ("tiny", "tiny"), ("tiny (test)", "tiny"),
    ("./My Corpus.jsonl", "my_corpus"), ("<text>", "text"), ("enwiki", "enwiki"), ("enwiki (test)", "enwiki"),
    # a file is named by its dataset, never by its split (ppl_test for test.txt was a bug)
    ("/data/wikitext-2-raw/wiki.test.raw", "wikitext2"), ("/data/wiki.test.raw", "wiki"),
    ("/hf/wikitext-2-raw-v1/test-00000-of-00001.parquet", "wikitext2"), ("/data/ptb/test.txt", "ptb"),
    ("/repo/gac/data/tiny/eval/test.txt", "tiny"), ("/c/text/enwiki-gensim-4.4.0/validation.txt", "enwiki"),
    ("/tmp/test.txt", "text"), ("test.txt", "text"), ("/data/pg19/valid-00003.jsonl", "pg19"),
    ("/data/wikitext-103-raw/wiki.valid.raw", "wikitext_103"),
])
def test_perplexity_is_named_by_the_text_scored(source, name):
    assert dataset_name(source) == name and ppl_metric(source) == f"ppl_{name}"


def test_task_and_prefill_names():
    assert task_metric("piqa", "acc,none") == "piqa_acc"
    assert task_metric("piqa", "acc_stderr,none") == "piqa_acc_stderr"
    assert task_metric("gsm8k", "exact_match,strict-match") == "gsm8k_exact_match_strict_match"
    assert task_metric("piqa", "alias") is None
    assert prefill_point(1, 1024) == "prefill_ms@1024" and prefill_point(4, 1024) == "prefill_ms@b4_1024"


def old_record(key="a" * 16, **metrics):
    """A record as gac wrote it before the names were settled: tiny's perplexity as ppl_wikitext2, the job's own
    prefill point twice, a 0.0 spread from one trial."""
    return {
        "schema": 1, "key": key, "status": "completed", "created": "2025-01-01T00:00:00Z",
        "job": {"model": "tiny", "compressor": "asvd", "proxy": "activation", "strategy": "gac", "ratio": 0.15,
                "unit": 8, "gpu": "cpu", "seq_len": 64, "experiment": "default", "sweep": None},
        "metrics": {"ppl_wikitext2": 240.0, "piqa_acc": 0.9, "prefill_ms": 5.0, "prefill_ms@64": 5.0,
                    "prefill_ms@128": 9.0, "prefill_ms_spread": 0.0, **metrics},
        "config": {"model": {"ppl_source": "tiny"}, "eval": {"latency_batch": 1}},
        "evaluation": {"perplexity": {"ppl": 240.0, "source": "tiny (test)"},
                       "latency": {"prefill_ms@64": {"median_ms": 5.0, "trials": 1, "spread_pct": 0.0},
                                   "prefill_ms@128": {"median_ms": 9.0, "trials": 1, "spread_pct": 0.0}}},
        "aligned_fraction": 1.0, "params": 10, "budget": 10, "plan": None,
    }


@pytest.mark.parametrize(("task_files", "task", "data"), [
    (None, None, "hub"), ("hub", None, "hub"), ("tiny", None, "tiny"), ("enwiki", "piqa", "enwiki"),
    ({"piqa": "/d/piqa.jsonl"}, None, "files"), ({"piqa": "/d/piqa.jsonl"}, "piqa", "files"),
    ({"piqa": "/d/piqa.jsonl"}, "hellaswag", "hub"),  # a task the mapping does not name came from the hub
    ("auto", None, None), ("/d/piqa.jsonl", None, None), (3, None, None),  # old records, anything else: unknown
])
def test_task_data_says_what_the_task_items_were(task_files, task, data):
    assert task_data(task_files, task) == data


def test_task_data_note_names_the_lookalike_source_and_disowns_the_dataset():
    """A look-alike set is named by what it is made from, never passed off as PiQA/HellaSwag (issue 30)."""
    assert set(LOOKALIKE_TASK_SETS) == {"tiny", "enwiki"}
    note = task_data_note("enwiki")
    assert note == ("PiQA-/HellaSwag-format items made from held-out English Wikipedia articles (gac's enwiki set), "
                    "not the PiQA/HellaSwag datasets")
    assert task_data_note("tiny", ["piqa"]) == ("PiQA-format items made from held-out Shakespeare plays (gac's tiny "
                                                "set), not the PiQA dataset")
    assert task_data_note("hub") == task_data_note("files") == task_data_note(None) == ""


def test_old_names_are_mapped_when_read():
    m = upgrade_metrics(old_record())
    assert m == {"ppl_tiny": 240.0, "piqa_acc": 0.9, "prefill_ms": 5.0, "prefill_ms@128": 9.0}
    # a real WikiText-2 record keeps its name; a spread over 3 trials stays; a differing point is not a duplicate
    rec = old_record(prefill_ms_spread=4.0)
    rec["evaluation"]["perplexity"]["source"] = "wikitext2 (test)"
    rec["evaluation"]["latency"]["prefill_ms@64"]["trials"] = 3
    rec["metrics"]["prefill_ms@64"] = 5.5
    m = upgrade_metrics(rec)
    assert m["ppl_wikitext2"] == 240.0 and m["prefill_ms_spread"] == 4.0 and m["prefill_ms@64"] == 5.5
    # no evaluation details: the config's ppl_source decides; neither: WikiText-2, the old name's meaning
    rec = old_record()
    del rec["evaluation"]
    assert "ppl_tiny" in upgrade_metrics(rec)
    del rec["config"]
    assert "ppl_wikitext2" in upgrade_metrics(rec)
    assert own_prefill_point(old_record()) == "prefill_ms@64"


def test_a_store_with_old_records_loads_under_the_new_names(tmp_path):
    store = ResultsStore(tmp_path)
    store.prepare_for_writing()
    rec = old_record()
    path = store.records_dir / f"{rec['key']}.json"
    path.write_text(json.dumps(rec))
    got = store.read_record(rec["key"])
    assert got["metrics"]["ppl_tiny"] == 240.0 and "ppl_wikitext2" not in got["metrics"]
    assert "prefill_ms@64" not in got["metrics"] and "prefill_ms_spread" not in got["metrics"]
    assert [r["metrics"] for r in store.iter_records()] == [got["metrics"]]
    assert json.loads(path.read_text())["metrics"]["ppl_wikitext2"] == 240.0  # the file itself is never rewritten

    from gac.analysis import load_results
    from gac.analysis.method_table import table5

    df = load_results(tmp_path)
    row = df.iloc[0]
    assert row["ppl_tiny"] == 240.0 and "ppl_wikitext2" not in df.columns
    assert row["prefill_ms@64"] == 5.0 and row["prefill_ms@128"] == 9.0  # an S sweep still sees every point
    t = table5(df)
    assert t.loc["ASVD (GAC)", "PPL"] == 240.0 and "ppl_tiny" in t.attrs["caption"]
