"""`gac fixtures`: what it says about the shipped fixtures (their builds: tests/fixtures/)."""

from gac.cli import main


def test_gac_fixtures_info(capsys):
    assert main(["fixtures"]) == 0
    out = capsys.readouterr().out
    assert "val ppl" in out and "piqa.jsonl" in out
