"""``gac report`` end to end on the fixture store."""

import json

from gac.cli import main
from tests.analysis.conftest import PROFILE, STORE

TABLES = ["table5_tiny_a100_r0.1", "table5_tiny_a100_r0.15", "table5_tiny_a100_r0.3", "ratio_sweep_tiny_a100",
          "latency_seq_tiny_a100_r0.15_b1", "latency_seq_tiny_a100_r0.15_b4", "proxies_tiny_asvd_r0.2",
          "staircase_profile", "plans_tiny_a100_r0.1_alignment", "plans_tiny_a100_r0.15_alignment",
          "plans_tiny_a100_r0.3_alignment"]
FIGURES = ["ratio_sweep_tiny_a100", "latency_seq_tiny_a100_r0.15", "proxies_tiny_asvd_r0.2",
           "staircase_profile_sdpa", "staircase_profile_gemm", "plans_tiny_a100_r0.15_dstar",
           "plans_tiny_a100_r0.1_residues", "plans_tiny_a100_r0.15_residues", "plans_tiny_a100_r0.3_residues"]


def test_report_writes_every_table_and_figure(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(STORE), "-o", str(out), "--profile", str(PROFILE)]) == 0
    expected = {f"{t}.{ext}" for t in TABLES for ext in ("md", "tex")}
    expected |= {f"{f}.{ext}" for f in FIGURES for ext in ("png", "pdf")} | {"index.md"}
    assert {p.name for p in out.iterdir()} == expected
    for name in expected:
        assert (out / name).stat().st_size > 0
    from tests.analysis.test_tables import EXPECTED_MD

    md = (out / "table5_tiny_a100_r0.15.md").read_text()
    assert md == "**Table 5: tiny on a100 at ratio 0.15 (ppl_wikitext2; prefill_ms, seq_len 1024; latency: per-job smoke numbers, each job timed alone (run `gac bench` for ratios with CIs))**\n\n" + EXPECTED_MD
    assert "\\begin{tabular}" in (out / "table5_tiny_a100_r0.15.tex").read_text()
    index = (out / "index.md").read_text()
    assert "- table5_tiny_a100_r0.15.md" in index and EXPECTED_MD in index
    # degenerate or impossible figures are skipped with a note, never drawn empty
    skipped = index.split("## Skipped", 1)[1].split("\n## ", 1)[0]
    assert "latency_seq_tiny_a100_r0.15: batch 4 left out of the figure (one sequence length" in skipped
    assert "plans_tiny_a100_r0.1_dstar: no plan targets with d*" in skipped  # records without plan.d_star
    assert "no side-by-side bench in the store" in skipped
    assert f"15 records -> {len(expected)} files in {out}" in capsys.readouterr().out
    # nothing is overwritten silently
    assert main(["report", str(STORE), "-o", str(out)]) == 2
    assert "not empty; refusing to overwrite" in capsys.readouterr().err
    assert main(["report", str(STORE), "-o", str(out), "--force", "--format", "md", "--figures", "png"]) == 0


def test_report_formats(tmp_path):
    out = tmp_path / "r"
    assert main(["report", str(STORE), "-o", str(out), "--format", "tex", "--figures", "pdf"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "table5_tiny_a100_r0.15.tex" in names and "table5_tiny_a100_r0.15.md" not in names
    assert "ratio_sweep_tiny_a100.pdf" in names and "ratio_sweep_tiny_a100.png" not in names


def test_report_bad_input(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty" / "records").mkdir(parents=True)
    assert main(["report", str(tmp_path / "empty"), "-o", str(out)]) == 2
    assert "no result records" in capsys.readouterr().err
    bad = tmp_path / "bad"
    (bad / "records").mkdir(parents=True)
    (bad / "records" / "k.json").write_text(json.dumps({"key": "k", "job": {"model": "m"}}))
    assert main(["report", str(bad), "-o", str(out)]) == 2
    assert "has status None, not 'completed'" in capsys.readouterr().err
    assert main(["report", str(STORE), "-o", str(out), "--format", "html"]) == 2
    assert "unknown table format 'html'" in capsys.readouterr().err
    assert not out.exists()  # nothing written on bad input


def test_a_setting_group_with_only_a_baseline_is_skipped_not_a_traceback(tmp_path, capsys):
    """A ratio sweep evaluated with eval.latency=false beside a baseline measured with it: the two settings are never
    merged, so one group holds only the baseline; the report says so instead of raising from the figure."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(STORE, store)
    changed = 0
    for f in (store / "records").glob("*.json"):
        rec = json.loads(f.read_text())
        if isinstance(rec.get("config"), dict):  # the baseline measured latency, every compressed run did not
            rec["config"].setdefault("eval", {})["latency"] = (rec.get("job") or {}).get("compressor") in (None, "none")
            f.write_text(json.dumps(rec))
            changed += 1
    assert changed
    out = tmp_path / "report"
    assert main(["report", str(store), "-o", str(out)]) == 0, capsys.readouterr().err
    skipped = (out / "index.md").read_text().split("## Skipped", 1)[1]
    assert "eval.latency" in skipped or any(p.name.startswith("ratio_sweep") and "latency" in p.name
                                            for p in out.iterdir())


def test_ratio_sweep_plots_task_accuracy_where_measured_at_two_ratios(store_copy, tmp_path, capsys):
    """A sweep whose jobs ran the tasks gets PiQA / HellaSwag acc_norm rows (figure and table) after perplexity;
    the fixture store, where only ratio 0.15 ran them (one point is no line), keeps PPL and latency only."""
    out = tmp_path / "plain"
    assert main(["report", str(STORE), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "PiQA" not in (out / "ratio_sweep_tiny_a100.md").read_text()
    for f in (store_copy / "records").glob("a0[13]*.json"):  # ASVD at 0.1 and 0.3: now with tasks, falling
        rec = json.loads(f.read_text())
        r = rec["job"]["ratio"]
        rec["metrics"].update({"piqa_acc_norm": 0.7 - r, "hellaswag_acc_norm": 0.4 - r / 2})
        f.write_text(json.dumps(rec))
    out = tmp_path / "tasks"
    assert main(["report", str(store_copy), "-o", str(out)]) == 0, capsys.readouterr().err
    md = (out / "ratio_sweep_tiny_a100.md").read_text()
    header = md.split("\n|", 1)[1].split("\n", 1)[0]
    cols = [c.strip() for c in header.split("|") if c.strip()]
    assert cols.index("PPL (wikitext2) GAC") < cols.index("PiQA (norm) GAC") < cols.index("HSwag (norm) GAC") \
        < cols.index("Prefill (ms) GAC")
    assert "0.600" in md and "0.400" in md  # 0.7 - 0.1 and 0.7 - 0.3, three decimals
