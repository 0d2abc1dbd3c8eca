"""gac.progress: the lines written off a terminal, the closing line per stage, and the flag that silences both."""

import logging

import pytest

from gac import progress as P


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture(autouse=True)
def restore_quiet(monkeypatch):
    monkeypatch.delenv("GAC_QUIET", raising=False)
    with P.quiet_scope(False):
        yield


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "gac.progress"]


@pytest.mark.parametrize(("seconds", "text"), [(4.24, "4.2 s"), (40.4, "40 s"), (125, "2 min 5 s"),
                                               (7300, "2 h 1 min"), (float("nan"), "?")])
def test_durations_read_as_people_write_them(seconds, text):
    assert P.format_duration(seconds) == text


def test_the_line_format_off_a_terminal():
    assert P.progress_line("calibration", 12, 32, "layers", 24.0) == "calibration 12/32 layers, ETA 40 s"
    assert P.progress_line("perplexity", 0, 8, "windows", 1.0) == "perplexity 0/8 windows, ETA ?"
    assert P.progress_line("bench", 3, None, "rounds", 12.0) == "bench 3 rounds, 12 s"
    assert P.done_line("calibration", 32, "layers", 25.3) == "calibration: 32 layers in 25 s"
    assert P.done_line("scoring", 0, "", 1.25) == "scoring: 1.2 s"


def test_periodic_lines_every_interval_then_one_closing_line(caplog):
    caplog.set_level(logging.INFO, logger="gac.progress")
    clock = Clock()
    with P.progress(32, "calibration", "layers", terminal=False, interval=10, clock=clock) as bar:
        for _ in range(32):
            clock.t += 2.0  # 2 s per layer: a line every 5 layers (10 s)
            bar.update()
    got = lines(caplog)
    assert got[0] == "calibration 5/32 layers, ETA 54 s"
    assert got[1] == "calibration 10/32 layers, ETA 44 s"
    assert len(got) == 6 + 1  # at 10, 20, 30, 40, 50, 60 s; none at the end (the closing line says it)
    assert got[-1] == "calibration: 32 layers in 1 min 4 s"


def test_a_failed_stage_gets_no_closing_line(caplog):
    caplog.set_level(logging.INFO, logger="gac.progress")
    with pytest.raises(RuntimeError), P.progress(4, "perplexity", "windows", terminal=False, interval=1e9) as bar:
        bar.update()
        raise RuntimeError("boom")
    assert lines(caplog) == []


@pytest.mark.parametrize("how", ["set_quiet", "env"])
def test_one_flag_silences_lines_bars_and_stage_times(caplog, capsys, monkeypatch, how):
    caplog.set_level(logging.INFO, logger="gac.progress")
    if how == "set_quiet":
        P.set_quiet(True)
    else:
        monkeypatch.setattr(P, "_quiet", None)
        monkeypatch.setenv("GAC_QUIET", "1")
    assert P.is_quiet()
    clock = Clock()
    for terminal in (False, True):
        with P.progress(10, "bench", "rounds", terminal=terminal, interval=0, clock=clock) as bar:
            for _ in range(10):
                clock.t += 5
                bar.update()
            assert bar._bar is None  # no tqdm bar either
    assert list(P.track(range(3), "sensitivity table", "units")) == [0, 1, 2]
    with P.stage("scoring"):
        pass
    assert lines(caplog) == [] and capsys.readouterr().err == ""


def test_a_terminal_gets_a_bar_and_the_closing_line(caplog):
    import io

    caplog.set_level(logging.INFO, logger="gac.progress")
    out = io.StringIO()
    with P.progress(3, "factorization (SVD)", "units", stream=out, terminal=True, interval=0) as bar:
        for _ in range(3):
            bar.update()
    assert "factorization (SVD):" in out.getvalue() and "/3 [" in out.getvalue()  # tqdm drew a bar
    got = lines(caplog)
    assert len(got) == 1 and got[0].startswith("factorization (SVD): 3 units in ")  # no periodic lines


def test_track_counts_without_len(caplog):
    caplog.set_level(logging.INFO, logger="gac.progress")
    assert list(P.track(iter("abc"), "windows", "windows", terminal=False, interval=1e9)) == ["a", "b", "c"]
    assert lines(caplog)[-1].startswith("windows: 3 windows in ")


def test_perplexity_reports_its_windows_and_gac_q_silences_it(tmp_path, caplog, monkeypatch, tiny_text):
    from gac.cli import main

    monkeypatch.setenv("GAC_PROGRESS_INTERVAL", "0")  # a line per window
    caplog.set_level(logging.INFO, logger="gac.progress")
    assert main(["evaluate", "tiny", "--ppl", "--ppl-data", str(tiny_text), "--seq-len", "64", "--batch-size", "1"]) == 0
    got = lines(caplog)
    assert any(g.startswith("perplexity 1/") and ", ETA " in g for g in got)
    assert got[-1].startswith("perplexity: ") and " windows in " in got[-1]
    caplog.clear()
    assert main(["-q", "evaluate", "tiny", "--ppl", "--ppl-data", str(tiny_text), "--seq-len", "64"]) == 0
    assert lines(caplog) == []
    assert not P.is_quiet()  # -q lasts for its command only


@pytest.fixture
def tiny_text(tmp_path):
    from gac.fixtures import tiny_paths

    text = tmp_path / "few.txt"
    text.write_text("".join(tiny_paths().wikitext["test"].read_text().splitlines(keepends=True)[:60]))
    return text


def test_hydra_quiet_key_reaches_the_job(monkeypatch):
    from gac.jobs.run import recipe
    from gac.jobs.config.command_line import compose_config

    seen = {}
    monkeypatch.setattr(recipe, "run_job", lambda *a, **k: seen.setdefault("quiet", P.is_quiet()) or {})
    cfg = compose_config(["quiet=true", "eval=none"])
    from omegaconf import OmegaConf

    recipe.run_config(OmegaConf.to_container(cfg, resolve=True))
    assert seen["quiet"] is True
