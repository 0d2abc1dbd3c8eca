"""`gac evaluate` end to end, and its answers to bad input (exit code 2, one line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gac.cli import main


def test_gac_evaluate_tiny_ppl_and_tasks_writes_json(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = main(["evaluate", "tiny", "--ppl", "--tasks", "piqa,hellaswag", "--limit", "50", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    m = doc["metrics"]
    # named as records name them: the perplexity by the text scored (tiny's), lm-eval's metrics with stderr
    assert set(m) == {"ppl_tiny", "piqa_acc", "piqa_acc_norm", "hellaswag_acc", "hellaswag_acc_norm",
                      "piqa_acc_stderr", "piqa_acc_norm_stderr", "hellaswag_acc_stderr", "hellaswag_acc_norm_stderr"}
    assert 1 < m["ppl_tiny"] < 1000
    lm = doc["lm_eval"]  # lm-eval's own layout beside the flat columns, under the names asked for
    assert lm["results"]["piqa"]["acc,none"] == m["piqa_acc"] and lm["versions"]["piqa"] is not None
    assert lm["n-samples"]["hellaswag"]["effective"] == 50 and lm["sources"]["piqa"].endswith("piqa.jsonl")
    assert doc["tasks"]["piqa"]["n"] == 50 and doc["tasks"]["hellaswag"]["n"] == 50
    assert doc["perplexity"]["seq_len"] == 1024  # 2048 capped at tiny's maximum
    assert doc["provenance"]["packages"]["lm_eval"] and doc["model_info"]["params"] > 1e6
    table = capsys.readouterr().out
    assert "piqa_acc_norm" in table and "hellaswag_acc " in table and "ppl_tiny " in table
    assert "perplexity on tiny (test), windows of S=1024" in table
    # tiny's items are PiQA/HellaSwag look-alikes made from Shakespeare: the table and the report say so
    assert ("  piqa, hellaswag: PiQA-/HellaSwag-format items made from held-out Shakespeare plays (gac's tiny set), "
            "not the PiQA/HellaSwag datasets") in table
    assert doc["task_data"] == {"piqa": "tiny", "hellaswag": "tiny"}
    # results are never overwritten silently
    assert main(["evaluate", "tiny", "--ppl", "--json", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_the_printed_table_says_what_the_task_items_are():
    """After the task rows, one line per look-alike set says what its items are made from; a local file is named;
    the hub's datasets (the real PiQA/HellaSwag) need no note (issue 30)."""
    from gac.evaluation.text_report import format_table
    from gac.jobs.run.experiment import format_record

    def task(source):
        return {"metrics": {"acc": 0.6, "acc_stderr": 0.02}, "n": 50, "source": source}

    report = {"tasks": {"piqa": task("/c/enwiki/piqa.jsonl"), "hellaswag": task("/c/enwiki/hellaswag.jsonl"),
                        "arc_easy": task("/d/arc.jsonl"), "winogrande": task("hub")}, "metrics": {}}
    lines = format_table(report, task_data={"piqa": "enwiki", "hellaswag": "enwiki", "arc_easy": "files",
                                            "winogrande": "hub"}).splitlines()
    notes = [ln for ln in lines if ln.startswith("  ")]
    assert notes == ["  piqa, hellaswag: PiQA-/HellaSwag-format items made from held-out English Wikipedia "
                     "articles (gac's enwiki set), not the PiQA/HellaSwag datasets",
                     "  arc_easy: items from the local file /d/arc.jsonl"]
    assert lines.index(notes[0]) > max(i for i, ln in enumerate(lines) if ln.startswith("winogrande_acc"))
    assert not [ln for ln in format_table(report, task_data="hub").splitlines() if ln.startswith("  ")]
    rec = {"job": {"model": "smollm2", "compressor": "asvd"}, "config": {"model": {"task_files": "enwiki"}},
           "metrics": {"ppl_enwiki": 20.0, "piqa_acc": 0.6, "hellaswag_acc_norm": 0.4}}
    assert format_record(rec).splitlines()[-1] == ("  piqa_*, hellaswag_*: PiQA-/HellaSwag-format items made from "
                                                   "held-out English Wikipedia articles (gac's enwiki set), not the "
                                                   "PiQA/HellaSwag datasets")
    rec["config"]["model"]["task_files"] = None  # the hub's PiQA and HellaSwag
    assert "format items" not in format_record(rec)


def test_gac_evaluate_latency(tmp_path, capsys):
    out = tmp_path / "lat.json"
    rc = main(["evaluate", "tiny", "--latency", "--seq-len", "64", "--warmup", "1", "--iters", "2", "--trials", "1",
               "--decode-tokens", "4", "--decode-prompt", "8", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    lat = doc["latency"]  # the job's shape: {point name: timing, "decode": timing}
    assert lat["prefill_ms@64"]["seq_len"] == 64 and lat["prefill_ms@64"]["median_ms"] > 0
    assert doc["metrics"]["prefill_ms"] == lat["prefill_ms@64"]["median_ms"]
    assert lat["decode"]["new_tokens"] == 4 and lat["decode"]["median_ms"] > 0
    assert "SDPA backend" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--tasks", "piqa,hellaswg"], "unknown lm-eval task 'hellaswg'; did you mean 'hellaswag'"),
    (["--ppl", "--seq-len", "4096"], "seq_len=4096 is above the model's maximum sequence length (1024"),
    (["--ppl", "--ppl-data", "wikitext2"], "give a local copy with --ppl-data FILE"),
    (["--ppl", "--ppl-data", "wikitxt-2"], "did you mean"),
    (["--task-file", "piqa"], "must be TASK=PATH"),
    ([], "nothing to evaluate"),
])
def test_gac_evaluate_bad_input(argv, message, capsys):
    assert main(["evaluate", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_gac_evaluate_empty_eval_file(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["evaluate", "tiny", "--ppl", "--ppl-data", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err
    empty_jsonl = tmp_path / "piqa.jsonl"
    empty_jsonl.write_text("")
    assert main(["evaluate", "tiny", "--tasks", "piqa", "--task-file", f"piqa={empty_jsonl}"]) == 2
    assert "is empty" in capsys.readouterr().err


def test_the_gac_command_runs_offline_in_a_fresh_process(tmp_path, tiny_files):
    text = tmp_path / "few.txt"
    text.write_text("".join(tiny_files.wikitext["test"].read_text().splitlines(keepends=True)[:400]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "gac.cli", "evaluate", "tiny", "--ppl", "--ppl-data", str(text),
                          "--seq-len", "256"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ppl_few " in res.stdout and f"perplexity on {text}, windows of S=256" in res.stdout
