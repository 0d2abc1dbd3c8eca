"""``gac report`` end to end on the fixture store."""

import json

from gac.cli import main
from tests.analysis.conftest import PROFILE, STORE

TABLES = ["fixture_table5_tiny_a100_r0.1", "fixture_table5_tiny_a100_r0.15", "fixture_table5_tiny_a100_r0.3",
          "fixture_ratio_sweep_tiny_a100", "fixture_latency_seq_tiny_a100_r0.15_b1",
          "fixture_latency_seq_tiny_a100_r0.15_b4", "fixture_proxies_tiny_asvd_r0.2", "staircase_profile",
          "fixture_plans_tiny_a100_r0.1_alignment", "fixture_plans_tiny_a100_r0.15_alignment",
          "fixture_plans_tiny_a100_r0.3_alignment"]
FIGURES = ["fixture_ratio_sweep_tiny_a100", "fixture_latency_seq_tiny_a100_r0.15", "fixture_proxies_tiny_asvd_r0.2",
           "staircase_profile_sdpa", "staircase_profile_gemm", "fixture_plans_tiny_a100_r0.15_dstar",
           "fixture_plans_tiny_a100_r0.1_residues", "fixture_plans_tiny_a100_r0.15_residues",
           "fixture_plans_tiny_a100_r0.3_residues"]


def test_report_writes_every_table_and_figure(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(STORE), "-o", str(out), "--profile", str(PROFILE)]) == 0
    expected = {f"{t}.{ext}" for t in TABLES for ext in ("md", "tex")}
    expected |= {f"{f}.{ext}" for f in FIGURES for ext in ("png", "pdf")} | {"index.md"}
    assert {p.name for p in out.iterdir()} == expected
    for name in expected:
        assert (out / name).stat().st_size > 0
    from tests.analysis.test_tables import EXPECTED_MD

    md = (out / "fixture_table5_tiny_a100_r0.15.md").read_text()
    assert md == "**Table 5: tiny on a100 at ratio 0.15 (ppl_wikitext2; prefill_ms, seq_len 1024; latency: per-job smoke numbers, each job timed alone (run `gac bench` for ratios with CIs))**\n\n" + EXPECTED_MD
    assert "\\begin{tabular}" in (out / "fixture_table5_tiny_a100_r0.15.tex").read_text()
    index = (out / "index.md").read_text()
    assert "- fixture_table5_tiny_a100_r0.15.md" in index and EXPECTED_MD in index
    # degenerate or impossible figures are skipped with a note, never drawn empty
    skipped = index.split("## Skipped", 1)[1].split("\n## ", 1)[0]
    assert "fixture_latency_seq_tiny_a100_r0.15: batch 4 left out of the figure (one sequence length" in skipped
    assert "fixture_plans_tiny_a100_r0.1_dstar: no plan targets with d*" in skipped  # records without plan.d_star
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
    assert "fixture_table5_tiny_a100_r0.15.tex" in names and "fixture_table5_tiny_a100_r0.15.md" not in names
    assert "fixture_ratio_sweep_tiny_a100.pdf" in names and "fixture_ratio_sweep_tiny_a100.png" not in names


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
    fast = ["--figures", "png", "--format", "md"]  # the tables are what is read here
    assert main(["report", str(STORE), "-o", str(out), *fast]) == 0, capsys.readouterr().err
    assert "PiQA" not in (out / "fixture_ratio_sweep_tiny_a100.md").read_text()
    for f in (store_copy / "records").glob("a0[13]*.json"):  # ASVD at 0.1 and 0.3: now with tasks, falling
        rec = json.loads(f.read_text())
        r = rec["job"]["ratio"]
        rec["metrics"].update({"piqa_acc_norm": 0.7 - r, "hellaswag_acc_norm": 0.4 - r / 2})
        f.write_text(json.dumps(rec))
    out = tmp_path / "tasks"
    assert main(["report", str(store_copy), "-o", str(out), *fast]) == 0, capsys.readouterr().err
    md = (out / "fixture_ratio_sweep_tiny_a100.md").read_text()
    header = md.split("\n|", 1)[1].split("\n", 1)[0]
    cols = [c.strip() for c in header.split("|") if c.strip()]
    assert cols.index("PPL (wikitext2) GAC") < cols.index("PiQA (norm) GAC") < cols.index("HSwag (norm) GAC") \
        < cols.index("Prefill (ms) GAC")
    assert "0.600" in md and "0.400" in md  # 0.7 - 0.1 and 0.7 - 0.3, three decimals


def _label(store, experiments: dict[str, str]) -> None:
    """Give the fixture store's records experiment labels (record key prefix -> label), as a store holding Table 5
    and a proxy comparison has."""
    for f in (store / "records").glob("*.json"):
        r = json.loads(f.read_text())
        label = next((e for prefix, e in experiments.items() if f.name.startswith(prefix)), None)
        if label is not None:
            r["job"]["experiment"] = label
            f.write_text(json.dumps(r))


def test_a_report_writes_the_artefacts_its_experiments_define_named_for_them(store_copy, tmp_path, capsys):
    # a015*: Table 5's ASVD unaligned/gac, p015*: its LLM-Pruner pair, b*: the baseline; x020*: a proxy sweep
    _label(store_copy, {"a015": "table5", "p015": "table5", "b0": "table5", "x020": "proxy_compare",
                        "a01": "ratio_sweep", "a03": "ratio_sweep"})
    out = tmp_path / "r"
    assert main(["report", str(store_copy), "-o", str(out), "--format", "md", "--figures", "png"]) == 0
    names = {p.name for p in out.iterdir()}
    # Table 5 and its plans come from the table5 records only; the proxy sweep gets its figure and misaligned table
    assert "table5_tiny_a100_r0.15.md" in names and "table5_plans_tiny_a100_r0.15_alignment.md" in names
    assert "proxy_compare_tiny_asvd_r0.2.png" in names and "proxy_compare_tiny_asvd_r0.2.md" in names
    assert "ratio_sweep_tiny_a100.png" in names
    # nothing an experiment does not define: no Table 5 of the proxy sweep or the ratio sweep, no baseline-only table
    assert {n for n in names if n.startswith("table5")} == {
        "table5_tiny_a100_r0.15.md", "table5_plans_tiny_a100_r0.15_alignment.md",
        "table5_plans_tiny_a100_r0.15_dstar.png", "table5_plans_tiny_a100_r0.15_residues.png"}
    assert not [n for n in names if n.startswith(("proxy_compare_table5", "ratio_sweep_table5", "ratio_sweep_plans"))]
    assert not [n for n in names if "latencyTrue" in n or "limit" in n]
    # the proxy sweep measured no quality (eval=none): said once, not a table of blanks
    assert "proxy_compare_tiny_asvd_r0.2_quality: proxy quality: no record measured" in (out / "index.md").read_text()
    # --experiment keeps one experiment's artefacts (the store's baselines are not an experiment of their own)
    out2 = tmp_path / "r2"
    assert main(["report", str(store_copy), "-o", str(out2), "--format", "md", "--figures", "png",
                 "--experiment", "proxy_compare"]) == 0
    assert {p.name for p in out2.iterdir()} == {"proxy_compare_tiny_asvd_r0.2.png", "proxy_compare_tiny_asvd_r0.2.md",
                                                "index.md"}
    assert "no baseline record" not in capsys.readouterr().err


def test_proxy_quality_pairs_unaligned_and_gac_per_proxy(store_copy, tmp_path):
    from gac.analysis import load_results
    from gac.analysis.proxies import proxy_quality

    df = load_results(store_copy)
    t = proxy_quality(df[df["key"].astype(str).str.startswith("a015")], model="tiny", compressor="asvd", ratio=0.15)
    assert list(t.index.names) == ["Proxy", "Method"]
    assert [m for _, m in t.index] == ["ASVD", "ASVD (GAC)"] and "PPL" in t.columns
    assert "Baseline" not in {m for _, m in t.index}
    from gac.analysis import format_table

    md = format_table(t).splitlines()  # one column per index level, never a tuple
    assert md[0].startswith("| Proxy ") and "| Method " in md[0] and "('" not in "".join(md)
    assert md[2].split("|")[2].strip() == "ASVD"


def test_figure_2_titles_name_the_allocation_that_ran_and_no_false_skip_note(store_copy, tmp_path):
    _label(store_copy, {"x020": "proxy_compare"})
    for f in (store_copy / "records").glob("x020*.json"):  # the record's recipe names the rule that ran
        r = json.loads(f.read_text())
        r.setdefault("compression", {})["recipe"] = {"allocation": "proportional"}
        f.write_text(json.dumps(r))
    from gac.analysis import load_results
    from gac.analysis.report_dir import _allocation_of

    df = load_results(store_copy)
    assert _allocation_of(df[df["key"].astype(str).str.startswith("x020")]) == "proportional allocation"
    out = tmp_path / "r"
    assert main(["report", str(store_copy), "-o", str(out), "--format", "md", "--figures", "png",
                 "--experiment", "proxy_compare"]) == 0
    assert "no (model, compressor, ratio) has unaligned plans from 2+ proxies" not in (out / "index.md").read_text()


def test_report_tables_say_what_lookalike_task_data_are(store_copy, tmp_path, capsys):
    """`gac report` on jobs scored on gac's enwiki items (smollm2's default, issue 30): Table 5's and the ratio
    sweep's markdown headers and captions (and index.md's headings) name the look-alike set, never PiQA."""
    from tests.analysis.conftest import with_task_files

    for f in (store_copy / "records").glob("a0[13]*.json"):  # ASVD at 0.1 and 0.3 ran the tasks too
        rec = json.loads(f.read_text())
        rec["metrics"].update({"piqa_acc_norm": 0.7 - rec["job"]["ratio"]})
        f.write_text(json.dumps(rec))
    with_task_files(store_copy, "enwiki")
    out = tmp_path / "report"
    assert main(["report", str(store_copy), "-o", str(out), "--format", "md", "--figures", "png"]) == 0, \
        capsys.readouterr().err
    made = "PiQA-/HellaSwag-format items made from held-out English Wikipedia articles (gac's enwiki set)"
    t5 = (out / "fixture_table5_tiny_a100_r0.15.md").read_text()
    caption, header = t5.splitlines()[0], t5.splitlines()[2]
    assert made in caption and "not the PiQA/HellaSwag datasets" in caption
    assert "PiQA-format (enwiki)" in header and "HSwag-format (enwiki, norm)" in header and "| PiQA " not in header
    sweep = (out / "fixture_ratio_sweep_tiny_a100.md").read_text()
    assert "PiQA-format (enwiki, norm) GAC" in sweep and "task columns: PiQA-format items made from" in sweep
    index = (out / "index.md").read_text()
    assert "## Table 5: tiny on a100 at ratio 0.15" in index and made in index
