"""What a perplexity reports: only the first N windows when asked (``gac evaluate --ppl-windows``), and a warning
when it is above the vocabulary size (the model is wrecked) that reaches every report."""

from __future__ import annotations

import json

import torch

from .fakes import TableModel


def test_evaluate_ppl_windows_scores_only_the_first_windows(tmp_path, capsys):
    from gac.cli import main

    out = tmp_path / "ev.json"
    assert main(["-q", "evaluate", "tiny", "--ppl", "--ppl-windows", "2", "--seq-len", "128", "--json",
                 str(out)]) == 0
    p = json.loads(out.read_text())["perplexity"]
    assert p["n_windows"] == 2 and p["n_windows_total"] > 2 and p["n_tokens"] == 2 * 127
    assert f"the first 2 of {p['n_windows_total']} windows" in capsys.readouterr().out


def _wrecked_model(vocab=5):
    table = torch.full((vocab, vocab), 0.0)
    table[:, 0] = 30.0  # every next token predicted to be 0, the text never has one
    return TableModel(table, max_len=64)


def test_perplexity_above_the_vocabulary_warns(caplog):
    from gac.evaluation.perplexity import perplexity_of_ids, wrecked_warning

    ids = torch.tensor([1, 2, 3, 4] * 40)
    with caplog.at_level("WARNING"):
        out = perplexity_of_ids(_wrecked_model(), ids, seq_len=16)
    assert out["ppl"] > 5 and "model is wrecked" in out["warning"] and "vocabulary size (5)" in out["warning"]
    assert any("model is wrecked" in r.getMessage() for r in caplog.records)
    assert wrecked_warning(4.9, 5) is None and wrecked_warning(5.1, 5) and wrecked_warning(1e9, None) is None


def test_a_perplexity_too_large_for_a_float_is_inf_not_an_overflow():
    from gac.evaluation.perplexity import perplexity_of_ids

    m = _wrecked_model()
    with torch.no_grad():
        m.table[:, 0] = 2000.0  # mean NLL ~2000 nats: exp() overflows a float
    out = perplexity_of_ids(m, torch.tensor([1, 2, 3, 4] * 40), seq_len=16)
    assert out["ppl"] == float("inf") and "model is wrecked" in out["warning"]


def test_the_warning_reaches_the_reports():
    from gac.analysis.load import _record_row
    from gac.evaluation.text_report import format_table
    from gac.jobs.run.experiment import format_record

    w = "perplexity 6.6e+06 is above the vocabulary size (49152), ... the model is wrecked"
    p = {"ppl": 6.6e6, "source": "enwiki (test)", "seq_len": 512, "n_windows": 3, "warning": w}
    assert f"WARNING: {w}" in format_table({"perplexity": p, "metrics": {"ppl_enwiki": 6.6e6}})
    rec = {"key": "k", "job": {"model": "smollm2", "compressor": "asvd", "strategy": "gac", "ratio": 0.15},
           "metrics": {"ppl_enwiki": 6.6e6}, "evaluation": {"perplexity": p}}
    assert f"WARNING: {w}" in format_record(rec)
    assert _record_row(rec)["ppl_warning"] == w
