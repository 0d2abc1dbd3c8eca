"""``-o -``: stdout where a command's output is text alone (``gac align``'s plan, as without ``-o``); refused in one
line where the command writes a directory or a file beside its printed summary (catalogue rows). It made a file or
directory named ``-``."""

from __future__ import annotations

import json

from gac.cli import main


def test_align_dash_prints_the_plan_and_writes_no_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    alloc = tmp_path / "a.json"
    alloc.write_text(json.dumps({"budget": 1000, "targets": [
        {"name": "a", "d_star": 10.5, "score": 1, "params_per_dim": 10}]}))
    assert main(["align", str(alloc), "-o", "-"]) == 0
    plan = json.loads(capsys.readouterr().out)  # stdout is the plan alone: no summary line
    assert plan["dims"] and not (tmp_path / "-").exists()
