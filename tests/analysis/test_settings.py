"""Issue 14: a report never drops or mixes records that differ in a setting (fixtures/store_mixed: `run.py
eval=quick` and `run.py eval=quick align.window=8` into one store, plus a job evaluated without tasks)."""

import math

import pytest

from gac.analysis import filter_settings, load_results, records_to_frame, setting_groups, table5
from gac.cli import main
from gac.errors import GacError
from tests.analysis.conftest import FIXTURES

MIXED = FIXTURES / "store_mixed"
KEYS = {f"m00000000000000{i}" for i in range(1, 6)}


@pytest.fixture(scope="module")
def mixed():
    return load_results(MIXED)


def test_config_is_loaded_flat_without_labels(mixed):
    cfg = mixed.set_index("key").loc["m000000000000004", "config"]
    assert cfg["align.window"] == 8 and cfg["eval.tasks"] == ("piqa", "hellaswag") and cfg["eval.limit"] == 50
    assert not any(k.split(".")[0] in ("results_dir", "force", "logger", "sweep", "experiment_name") for k in cfg)


def test_setting_groups_split_and_drop_nothing(mixed):
    groups = setting_groups(mixed)
    settings = [s for s, _ in groups]
    assert {"align.window": 8, "eval.tasks": ("piqa", "hellaswag")} in settings
    assert {"align.window": 1, "eval.tasks": ("piqa", "hellaswag")} in settings
    assert {"align.window": 1, "eval.tasks": ()} in settings
    assert len(groups) == 3
    assert set().union(*(set(g["key"]) for _, g in groups)) == KEYS  # every record is in some table
    for _, g in groups:  # one record per table row, and only one record per key (the re-run collapsed)
        assert not g.duplicated(["compressor", "strategy"]).any() and not g["key"].duplicated().any()
    w1 = next(g for s, g in groups if s == {"align.window": 1, "eval.tasks": ("piqa", "hellaswag")})
    assert w1.set_index("key").loc["m000000000000003", "prefill_ms"] == 59.0  # the re-run of the same key wins
    assert "m000000000000001" in set(w1["key"])  # the baseline serves every window (it does not depend on it)


def test_table5_refuses_to_mix_and_names_the_settings(mixed):
    with pytest.raises(GacError) as e:
        table5(mixed)
    msg = str(e.value)
    assert "\n" not in msg and "align.window" in msg and "eval.tasks" in msg and "where=" in msg


def test_table5_with_a_filter(mixed):
    w8 = table5(mixed, where={"align.window": 8})
    assert list(w8.index) == ["Baseline", "ASVD (GAC)"]
    assert w8.loc["ASVD (GAC)", "PPL"] == 244.0 and w8.loc["ASVD (GAC)", "Prefill (ms)"] == 62.0
    assert "align.window=8" in w8.attrs["caption"]
    s1 = table5(mixed, where={"sweep": "s1"})
    assert list(s1.index) == ["Baseline", "ASVD", "ASVD (GAC)"]
    assert s1.loc["ASVD (GAC)", "PPL"] == 246.0 and s1.loc["ASVD (GAC)", "Prefill (ms)"] == 59.0
    # `run.py model=tiny` scored tiny's PiQA-/HellaSwag-format items from Shakespeare: the headers say so
    assert s1.loc["ASVD (GAC)", "PiQA-format (tiny)"] == 0.96 and "PiQA" not in s1.columns
    assert "PiQA-/HellaSwag-format items made from held-out Shakespeare plays" in s1.attrs["caption"]
    # window 1 still holds an LLM-Pruner job evaluated without tasks: its blank PiQA must not join the others
    with pytest.raises(GacError, match="eval.tasks"):
        table5(mixed, where={"align.window": "1"})
    notasks = table5(mixed, where={"eval.tasks": ()})
    assert list(notasks.index) == ["LLM-Pruner (GAC)"]
    assert math.isnan(notasks.loc["LLM-Pruner (GAC)", "PiQA-format (tiny)"])  # blank, named as the others are
    with pytest.raises(GacError, match="no records have a setting 'align.windw'"):
        filter_settings(mixed, {"align.windw": 8}, "Table 5")
    with pytest.raises(GacError, match=r"no records match align.window=4; values in the records: \['1', '8'\]"):
        filter_settings(mixed, {"align.window": 4}, "Table 5")


def test_records_without_config_are_split_by_key():
    """Two ASVD gac records without a config (e.g. a W&B export): nothing tells them apart, but they are
    different jobs: two groups (by key), not one 'superseded' record."""
    def rec(key, ppl, compressor="asvd"):
        return {"schema": 1, "key": key, "created": "2025-01-01T00:00:00Z", "metrics": {"ppl_tiny": ppl},
                "job": {"model": "tiny", "compressor": compressor, "strategy": "gac", "ratio": 0.15, "gpu": "cpu",
                        "seq_len": 1024, "proxy": "activation"}}
    df = records_to_frame([rec("k1", 10.0), rec("k2", 11.0), rec("k3", 12.0, "llm_pruner")])
    groups = setting_groups(df)
    # only the colliding slot is split by key; the LLM-Pruner record fits (and appears in) both tables
    assert sorted(tuple(sorted(g["key"])) for _, g in groups) == [("k1", "k3"), ("k2", "k3")]
    assert sorted(s["key"] for s, _ in groups) == ["k1", "k2"]
    with pytest.raises(GacError, match="differ in key"):
        table5(df)


def test_report_writes_one_table_per_setting(tmp_path):
    out = tmp_path / "r"
    assert main(["report", str(MIXED), "-o", str(out), "--format", "md", "--figures", "png"]) == 0
    tables = sorted(p.name for p in out.glob("table5_*.md"))
    assert tables == ["table5_tiny_cpu_r0.15_tasks-none_window1.md",
                      "table5_tiny_cpu_r0.15_tasks-piqa-hellaswag_window1.md",
                      "table5_tiny_cpu_r0.15_tasks-piqa-hellaswag_window8.md"]
    index = (out / "index.md").read_text()
    assert "[eval.tasks=[piqa,hellaswag], align.window=8]" in index  # the heading names what differs
    body = "\n".join((out / t).read_text() for t in tables)
    for ppl in ("244.00", "245.00", "246.00", "241.00"):  # every compressed record has its row somewhere
        assert ppl in body
    w8 = (out / "table5_tiny_cpu_r0.15_tasks-piqa-hellaswag_window8.md").read_text()
    assert "ASVD (GAC)" in w8 and "246.00" not in w8 and "LLM-Pruner" not in w8


def test_report_filters(tmp_path, capsys):
    out = tmp_path / "w8"
    assert main(["report", str(MIXED), "-o", str(out), "--format", "md", "--figures", "png",
                 "--where", "align.window=8"]) == 0
    assert sorted(p.name for p in out.glob("table5_*.md")) == ["table5_tiny_cpu_r0.15.md"]
    assert "244.00" in (out / "table5_tiny_cpu_r0.15.md").read_text()
    out = tmp_path / "s1"
    assert main(["report", str(MIXED), "-o", str(out), "--format", "md", "--figures", "png", "--sweep", "s1"]) == 0
    rows = [line.split("|")[1].strip() for line in (out / "table5_tiny_cpu_r0.15.md").read_text().splitlines()
            if line.startswith("| ")][1:]
    assert rows == ["Baseline", "ASVD", "ASVD (GAC)"]
    assert main(["report", str(MIXED), "-o", str(tmp_path / "bad"), "--where", "align.window"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["report", str(MIXED), "-o", str(tmp_path / "bad"), "--where", "eval.limt=50"]) == 2
    assert "no records have a setting 'eval.limt'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
