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
    from lm_eval.tasks import TaskManager

    model, tok = tiny
    built = []  # include_defaults of every task manager made during the run
    original = TaskManager.__init__

    def counting(self, *args, **kwargs):
        built.append(kwargs.get("include_defaults", True))
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TaskManager, "__init__", counting)
        res = evaluate_tasks(model, tok, ("piqa", "hellaswag"), limit=8, local_files=tiny_files.task_files,
                             batch_size=8, log_samples=True)
    res["_task_managers"] = built
    return res


def test_local_files_never_index_lm_evals_whole_registry(results):
    # a run on local files reads its two YAMLs; lm-eval's full index (~14k YAMLs, 6-20 s) was built a second time
    # inside simple_evaluate whenever no task manager was passed to it
    assert results["_task_managers"] == [False]


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


def test_offline_hub_tasks_name_data_tiny(monkeypatch):
    import gac.evaluation.tasks as tasks
    import gac.hub

    monkeypatch.setattr(gac.hub, "hub_unreachable", lambda *a, **k: "offline")
    monkeypatch.setattr(tasks, "task_dataset_cached", lambda t: False)
    with pytest.raises(GacError) as e:
        tasks.check_hub_tasks(["piqa"])
    assert "--task-file piqa=FILE.jsonl" in str(e.value) and "--data tiny" in str(e.value)
    with pytest.raises(GacError) as e:
        tasks.check_hub_tasks(["piqa"], via="config")
    assert "model.task_files=tiny" in str(e.value) and "--task-file" not in str(e.value)
    with pytest.raises(GacError) as e:
        tasks.check_hub_tasks(["arc_easy"])
    assert "--data tiny" not in str(e.value)  # tiny ships piqa and hellaswag only


# ------------------------------------------------------------------------------------------------ any lm-eval task


def _arc_rows(n=6):
    """ARC-format rows (the hub's allenai/ai2_arc): a question, labelled choices, the answer's label."""
    rows = []
    for i in range(n):
        right = f"the king speaks {i}"
        rows.append({"id": f"q{i}", "question": f"Who speaks in act {i}?",
                     "choices": {"text": [right, f"{i} speaks king the"], "label": ["A", "B"]}, "answerKey": "A"})
    return rows


def test_any_registry_task_runs_offline_on_a_local_file_with_lm_evals_layout(tmp_path, tiny):
    """arc_easy is not one gac ships a schema for: it is found in lm-eval's registry, its official config runs on
    the local file as the split it evaluates on (test), and lm-eval's own layout is kept beside the flat columns."""
    path = tmp_path / "arc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _arc_rows()))
    res = evaluate_tasks(*tiny, ["arc_easy"], limit=6, local_files={"arc_easy": path}, batch_size=8,
                         bootstrap_iters=0, layout=True)
    lm = res["lm_eval"]
    assert set(lm["results"]) == {"arc_easy"}  # the name asked for, not gac's local alias
    acc = lm["results"]["arc_easy"]["acc,none"]
    assert res["metrics"]["arc_easy_acc"] == acc and "arc_easy_acc_norm" in res["metrics"]
    assert lm["versions"]["arc_easy"] == 1.0 and lm["n-samples"]["arc_easy"]["effective"] == 6
    assert lm["sources"]["arc_easy"] == str(path) and lm["configs"]["arc_easy"]["output_type"] == "multiple_choice"
    row = res["tasks"]["arc_easy"]
    assert row["acc"] == acc and row["n"] == 6 and row["metrics"]["acc_norm"] == res["metrics"]["arc_easy_acc_norm"]
    json.dumps(lm)  # JSON-ready, as a record needs


def test_registry_names_are_checked_before_any_work(tiny):
    with pytest.raises(GacError, match=r"unknown lm-eval task 'arc_eazy'; did you mean [^?]*'arc_easy'"):
        parse_tasks("piqa,arc_eazy")
    assert parse_tasks("arc_easy, piqa,arc_easy") == ["arc_easy", "piqa"]  # known, de-duplicated, in order
    with pytest.raises(GacError, match="no YAML config to run on a local file"):
        official_config("ai2_arc")  # a tag: its tasks have configs, it has none
