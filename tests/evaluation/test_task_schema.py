"""Local task files are checked against the task's schema before any evaluation: a bad row never becomes a number."""

import json

import pytest

from gac.errors import GacError
from gac.evaluation.tasks import check_local_file

PIQA = {"goal": "g", "sol1": "a", "sol2": "b", "label": 1}
HSWAG = {"activity_label": "x", "ctx_a": "a", "ctx_b": "b", "endings": ["1", "2", "3", "4"], "label": "2"}


def _file(tmp_path, rows):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("task,row,msg", [
    ("piqa", {**PIQA, "label": "x"}, "label must be the integer 0 or 1"),
    ("piqa", {**PIQA, "label": 2}, "label must be the integer 0 or 1"),
    ("piqa", {**PIQA, "label": True}, "label must be the integer 0 or 1"),
    ("piqa", {**PIQA, "sol2": None}, "sol2 must be a string"),
    ("hellaswag", {**HSWAG, "endings": ["a", "b"]}, "exactly 4 strings"),
    ("hellaswag", {**HSWAG, "endings": "abcd"}, "exactly 4 strings"),
    ("hellaswag", {**HSWAG, "label": "4"}, "label must be 0..3"),
    ("hellaswag", {**HSWAG, "label": -1}, "label must be 0..3"),
    ("hellaswag", {k: v for k, v in HSWAG.items() if k != "ctx_b"}, "lacks ctx_b"),
])
def test_bad_rows_are_refused_with_their_line(tmp_path, task, row, msg):
    good = PIQA if task == "piqa" else HSWAG
    p = _file(tmp_path, [good, good, row])
    with pytest.raises(GacError, match=msg) as e:
        check_local_file(task, p)
    assert f"{p}:3" in str(e.value)


@pytest.mark.parametrize("task,row", [("piqa", PIQA), ("piqa", {**PIQA, "label": 0}), ("hellaswag", HSWAG),
                                      ("hellaswag", {**HSWAG, "label": 3})])
def test_good_rows_pass(tmp_path, task, row):
    assert check_local_file(task, _file(tmp_path, [row])).is_file()


def test_the_shipped_files_pass():
    from gac.fixtures import tiny_paths

    for task, path in tiny_paths().task_files.items():
        check_local_file(task, path)


def test_gac_evaluate_refuses_a_bad_file_before_loading_the_model(tmp_path, capsys, monkeypatch):
    import gac.models
    from gac.cli import main

    monkeypatch.setattr(gac.models, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    p = _file(tmp_path, [{**PIQA, "label": "x"}])
    assert main(["evaluate", "tiny", "--tasks", "piqa", "--task-file", f"piqa={p}"]) == 2
    assert "label must be the integer 0 or 1" in capsys.readouterr().err
