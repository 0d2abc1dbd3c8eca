"""Offline, the fix a message names is the one that works for the command at hand (its own flag or config key)."""

from __future__ import annotations

import pytest

from gac.errors import GacError


def test_offline_wikitext2_names_the_flag_of_the_command(monkeypatch):
    import gac.text

    monkeypatch.setattr(gac.text, "hub_unreachable", lambda *a, **k: "offline")
    monkeypatch.setattr(gac.text, "hub_dataset_cached", lambda *a, **k: False)
    with pytest.raises(GacError) as e:
        gac.text.check_source("wikitext2", "train", "--calib")
    msg = str(e.value)
    assert "--calib FILE" in msg and "--calib enwiki" in msg and "--ppl-data" not in msg
    with pytest.raises(GacError, match="calibration.source=FILE"):
        gac.text.check_source("wikitext2", "train", "calibration.source")


def test_offline_hub_tasks_name_data_tiny(monkeypatch):
    import gac.evaluation.tasks as tasks
    import gac.text

    monkeypatch.setattr(gac.text, "hub_unreachable", lambda *a, **k: "offline")
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
