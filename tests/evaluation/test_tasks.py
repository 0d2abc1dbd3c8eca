"""lm-eval PiQA / HellaSwag: the official configs run on local files, with the official prompt format."""

from __future__ import annotations

import json
import math
import re

import pytest

from gac.errors import GacError
from gac.evaluation import evaluate_tasks, parse_tasks
from gac.evaluation.tasks import official_config, write_local_configs


def _hellaswag_preprocess(text: str) -> str:
    # lm_eval/tasks/hellaswag/utils.py, restated so the test checks lm-eval rather than itself
    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


@pytest.fixture(scope="module")
def results(tiny, tiny_files):
    model, tok = tiny
    return evaluate_tasks(model, tok, ("piqa", "hellaswag"), limit=8, local_files=tiny_files.task_files,
                          batch_size=8, log_samples=True)


def test_piqa_runs_the_official_prompt_on_local_rows(results, tiny_files):
    rows = [json.loads(x) for x in tiny_files.piqa.read_text().splitlines()[:8]]
    samples = sorted(results["piqa"]["samples"], key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == list(range(8))  # limit = the first N rows
    for s, row in zip(samples, rows, strict=True):
        # lm_eval/tasks/piqa/piqa.yaml: "Question: {{goal}}\nAnswer:", choices [sol1, sol2], target label
        assert s["arguments"] == [(f"Question: {row['goal']}\nAnswer:", f" {row['sol1']}"),
                                  (f"Question: {row['goal']}\nAnswer:", f" {row['sol2']}")]
        assert s["target"] == row["label"]


def test_hellaswag_runs_the_official_prompt_on_local_rows(results, tiny_files):
    rows = [json.loads(x) for x in tiny_files.hellaswag.read_text().splitlines()[:8]]
    samples = sorted(results["hellaswag"]["samples"], key=lambda s: s["doc_id"])
    for s, row in zip(samples, rows, strict=True):
        query = _hellaswag_preprocess(row["activity_label"] + ": " + row["ctx_a"] + " " + row["ctx_b"].capitalize())
        assert s["arguments"] == [(query, " " + _hellaswag_preprocess(e)) for e in row["endings"]]
        assert s["target"] == int(row["label"])


def test_metrics_are_acc_and_acc_norm_with_stderr(results):
    for task in ("piqa", "hellaswag"):
        r = results[task]
        assert r["n"] == 8 and r["num_fewshot"] == 0
        per_item = [s["acc"] for s in r["samples"]]
        assert r["acc"] == pytest.approx(sum(per_item) / 8)
        assert r["acc_norm"] == pytest.approx(sum(s["acc_norm"] for s in r["samples"]) / 8)
        p = r["acc"]
        assert r["acc_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / 7), abs=1e-9)  # sample stderr of the mean
        assert r["acc_norm_stderr"] is not None


def test_local_config_only_swaps_the_data_source(tmp_path, tiny_files):
    names = write_local_configs({"piqa": tiny_files.piqa}, tmp_path)
    cfg = json.loads((tmp_path / f"{names['piqa']}.yaml").read_text())
    assert cfg["include"] == str(official_config("piqa"))
    assert set(cfg) == {"include", "task", "dataset_path", "dataset_name", "dataset_kwargs", "training_split",
                        "validation_split", "test_split"}  # no prompt, choice or metric key is overridden


# ------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("name", "suggestion"), [("hellaswg", "hellaswag"), ("hella", "hellaswag"), ("piqa2", "piqa")])
def test_unknown_task_name_suggests_close_matches(name, suggestion):
    with pytest.raises(GacError, match=f"unknown lm-eval task '{name}'; did you mean [^?]*'{suggestion}'"):
        parse_tasks(f"piqa,{name}")


def test_empty_task_file_is_an_error(tmp_path, tiny):
    p = tmp_path / "piqa.jsonl"
    p.write_text("\n")
    with pytest.raises(GacError, match="is empty"):
        evaluate_tasks(*tiny, ("piqa",), limit=5, local_files={"piqa": p})


def test_task_file_with_missing_fields_is_an_error(tmp_path, tiny):
    p = tmp_path / "hs.jsonl"
    p.write_text(json.dumps({"ctx": "x", "endings": ["a", "b"], "label": "0"}) + "\n")
    with pytest.raises(GacError, match="lacks activity_label, ctx_a, ctx_b"):
        evaluate_tasks(*tiny, ("hellaswag",), limit=5, local_files={"hellaswag": p})


def test_hub_task_without_network_says_how_to_use_local_files(tiny):
    with pytest.raises(GacError, match="--task-file piqa="):
        evaluate_tasks(*tiny, ("piqa",), limit=5)
