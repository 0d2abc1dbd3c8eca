"""``gac evaluate --json`` of a model whose perplexity came out inf: one line saying so, no file, never the JSON
writer's "Out of range float values are not JSON compliant" after the work."""

from __future__ import annotations

import pytest

from gac.cli import main


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_non_finite_metric_is_refused_before_the_report_is_written(value, tmp_path, capsys, monkeypatch):
    import gac.evaluation.suite as suite

    def evaluate(*args, **kwargs):
        return {"perplexity": None, "tasks": None, "lm_eval": None, "latency": None, "metrics": {"ppl_tiny": value}}

    monkeypatch.setattr(suite, "evaluate", evaluate)
    out = tmp_path / "r.json"
    assert main(["-q", "evaluate", "tiny", "--ppl", "--ppl-data", "tiny", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"metric ppl_tiny is {value}" in lines[0] and "is not written" in lines[0], lines
    assert not out.exists() and "Traceback" not in err
