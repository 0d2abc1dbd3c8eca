"""Ctrl-C and a closed pipe end ``gac`` with one line (or none) and the conventional exit code, never a traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(monkeypatch, capsys):
    import gac.commands.align as align_cmd
    from gac.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(align_cmd, "run", interrupted)
    assert main(["align", "x.json"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gac align: interrupted; re-run the command to start again"]


def test_ctrl_c_while_starting_up_and_in_a_resuming_command(monkeypatch, capsys):
    import gac.cli
    import gac.commands.wandb_cmd as wandb_cmd

    monkeypatch.setattr(wandb_cmd, "run", lambda args: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert gac.cli.main(["wandb", "backfill", "somewhere"]) == 130
    assert capsys.readouterr().err.strip() == "gac wandb: interrupted; re-run to resume"

    def slow_start():
        raise KeyboardInterrupt

    monkeypatch.setattr(gac.cli, "_command_modules", slow_start)
    assert gac.cli.main(["demo"]) == 130
    assert capsys.readouterr().err.strip() == "gac: interrupted; re-run the command to start again"


def test_sigint_to_a_running_gac_is_exit_130_without_traceback():
    p = subprocess.Popen([sys.executable, "-m", "gac.cli", "-q", "evaluate", "tiny", "--latency", "--seq-len", "8",
                          "--warmup", "0", "--iters", "1000000", "--trials", "1"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(8)  # past start-up: loading tiny and measuring
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=120)[1]
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("Loading weights")]
    assert p.returncode == 130 and "Traceback" not in err, err
    assert lines == ["gac evaluate: interrupted; re-run the command to start again"], lines


def test_a_closed_pipe_ends_quietly(tmp_path):
    targets = [{"name": f"layer.{i}.proj", "d_star": 10.5, "score": 1, "params_per_dim": 10} for i in range(3000)]
    alloc = tmp_path / "a.json"
    alloc.write_text(json.dumps({"budget": 10**9, "targets": targets}))
    p = subprocess.Popen([sys.executable, "-m", "gac.cli", "align", str(alloc)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(10)  # `gac align a.json | head -c 10`
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert p.returncode == 141 and err == "", err
