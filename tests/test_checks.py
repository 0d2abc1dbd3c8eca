"""The numbers a user hands gac, one checker per kind (gac.checks): seeds, thread counts, numbers from the
environment; every argument argparse refuses in one line; stdout on a full disk in one line; layer selections and
sizes that crashed after loading. The catalogue rows (docs/bad-input.md, "Fourth catalogue") run the commands; here
the checkers' edges and the cases a row cannot hold (a device node, a subprocess's exit, every sub-command)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gac.checks import (
    ENV_NUMBERS,
    SEED_MAX,
    available_cpus,
    check_environment,
    check_seed,
    check_threads,
    env_number,
)
from gac.cli import main
from gac.errors import GacError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value, seed", [(0, 0), (SEED_MAX, SEED_MAX), ("7", 7), (3.0, 3)])
def test_a_seed_in_range_is_that_number(value, seed):
    assert check_seed(value) == seed


@pytest.mark.parametrize("value", [-1, SEED_MAX + 1, 10**20, "1e20", 1.5, "x", True, float("nan"), None])
def test_a_seed_out_of_range_is_refused_naming_the_range(value):
    with pytest.raises(GacError, match=rf"is not a seed: give a whole number from 0 to {SEED_MAX}"):
        check_seed(value, "seed")


def test_threads_are_1_to_the_cpus_this_process_may_use():
    n = available_cpus()
    assert check_threads(n) == n and check_threads("1") == 1
    for bad in (0, -3, "2.5", None, n + 1, 100_000):
        with pytest.raises(GacError, match="threads"):
            check_threads(bad)


def test_every_place_that_sets_torch_threads_checks_them_first(monkeypatch, tmp_path):
    """The bench protocol and the profile sweeps: refused before torch.set_num_threads (which crashed at 100000)."""
    import torch

    from gac.evaluation.bench import Protocol
    from gac.profiling import runner

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    with pytest.raises(GacError, match="bench threads 100000 is more threads than"):
        Protocol(points=((1, 16),), threads=100_000).resolved("cpu")
    monkeypatch.setattr(runner, "run_sweeps", lambda *a, **k: pytest.fail("the sweeps ran"))
    with pytest.raises(GacError, match="threads 100000 is more threads than"):
        runner.profile_device(out_dir=tmp_path / "p", device="cpu", quick=True, num_threads=100_000)
    assert calls == []


def test_the_bench_config_checks_its_numbers_rather_than_converting_them(tmp_path):
    """conf/bench.yaml's seed "abc" (was: int("abc"), a ValueError traceback) and a negative seed."""
    from gac.jobs.bench.store_bench import bench_from_config

    plan = tmp_path / "plan.json"
    plan.write_text('{"dims": {"model.layers.0.self_attn.q_proj": 64}}')
    base = {"plans": [str(plan)], "model": "tiny", "compressor": "asvd", "points": [[1, 16]]}
    for seed, match in (("abc", "bench seed abc is not a seed"), (-1, "bench seed -1 is not a seed")):
        with pytest.raises(GacError, match=match):
            bench_from_config({**base, "seed": seed})
    with pytest.raises(GacError, match="bench decode_prompt must be an integer >= 1, got 'x'"):
        bench_from_config({**base, "decode_prompt": "x"})


@pytest.mark.parametrize("var", sorted(ENV_NUMBERS))
def test_each_environment_number_is_checked_when_a_command_starts(var, monkeypatch):
    default = ENV_NUMBERS[var][0]
    monkeypatch.delenv(var, raising=False)
    assert env_number(var) == default
    monkeypatch.setenv(var, "2.5")
    assert env_number(var) == 2.5
    for bad in ("abc", "-1", "inf", "nan"):
        monkeypatch.setenv(var, bad)
        with pytest.raises(GacError, match=rf"^{var}='{bad}' must be a"):
            check_environment()
    monkeypatch.setenv(var, "0")
    if ENV_NUMBERS[var][2]:  # zero has a meaning (progress lines at every step)
        assert env_number(var) == 0
    else:
        with pytest.raises(GacError, match="must be a positive number"):
            env_number(var)


def test_the_lock_reads_its_bounds_when_it_is_made_not_when_gac_is_imported(monkeypatch, tmp_path):
    from gac.results.lock import FileLock

    monkeypatch.setenv("GAC_LOCK_STALE_S", "7")
    monkeypatch.setenv("GAC_LOCK_HEARTBEAT_S", "3")
    lock = FileLock(tmp_path / "x.lock")
    assert (lock.stale_s, lock.heartbeat_s) == (7.0, 3.0)


def _commands() -> list[str]:
    from gac.cli import _command_modules

    return [m.NAME for m in _command_modules()]


@pytest.mark.parametrize("command", _commands())
def test_every_command_answers_an_unknown_flag_in_one_line(command, capsys):
    assert main([command, "--no-such-flag"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"gac {command}: error: ") and err[0].endswith("--help"), err


def test_argparse_values_are_one_line_naming_the_argument(capsys):
    assert main(["predict", "--gpu", "a100", "--model", "tiny", "--batch", "many"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "gac predict: error: argument --batch: invalid int value: 'many'; see gac predict --help"


def _full_device(tmp_path: Path) -> Path:
    """A device node of our own that behaves as /dev/full (char 1,7): every write fails with ENOSPC."""
    dev = tmp_path / "full"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD); the catalogue's machine runs as root")
    return dev


def test_stdout_on_a_full_disk_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    dev = _full_device(tmp_path)
    with open(dev, "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert main(["demo", "--shape", "llama3_8b"]) == 2
        assert sys.stdout is full  # the guard is gone once the command returns
    err = capsys.readouterr().err.splitlines()
    assert err == ["gac demo: error: cannot write the output to stdout (No space left on device); free space where it "
                   "goes or send it elsewhere"]


def test_stdout_on_a_full_disk_leaves_nothing_for_the_interpreters_exit(tmp_path):
    """A process, so the interpreter's own flush at exit is seen (was: "Exception ignored ... OSError", exit 120)."""
    dev = _full_device(tmp_path)
    with open(dev, "w") as full:
        p = subprocess.run([sys.executable, "-m", "gac.cli", "demo"], stdout=full, stderr=subprocess.PIPE, text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert p.returncode == 2 and p.stderr.splitlines() == [
        "gac demo: error: cannot write the output to stdout (No space left on device); free space where it goes or "
        "send it elsewhere"], p.stderr


@pytest.mark.parametrize("layers, match", [
    ("::0", "has a step of 0"), ("1:2:3:4", "is not a layer selection"), (" ", "is not a layer selection"),
    (["a"], "is not a layer selection"), ([True], "is not a layer selection"), (5, "is not a layer selection"),
    ("9:", r"gives \[\]; the model has layers 0..3"), ([0, 7], r"gives \[0, 7\]"),
])
def test_a_layer_selection_is_checked_before_any_layer_is_touched(layers, match):
    from gac.compression.compressors.base import parse_layers

    with pytest.raises(GacError, match=match):
        parse_layers(layers, 4)


def test_good_layer_selections_are_kept():
    from gac.compression.compressors import get_compressor
    from gac.compression.compressors.base import parse_layers

    assert parse_layers("1::2", 6) == [1, 3, 5] and parse_layers("-2:", 6) == [4, 5] and parse_layers("3", 6) == [3]
    assert parse_layers((1, None), 4) == [1, 2, 3] and parse_layers([2, 0], 4) == [0, 2]
    assert get_compressor("llm_pruner").layer_indices(32) == list(range(3, 31))  # its reference preset


@pytest.mark.parametrize("size", [float("inf"), float("nan"), -1.0, "1e400", True])
def test_a_memory_size_that_is_no_size_is_refused(size):
    from gac.models.placement import parse_size

    with pytest.raises(GacError, match="is not a size"):
        parse_size(size, "model.max_memory.cpu")


def test_a_results_directory_too_long_for_the_file_system_is_refused(tmp_path):
    from gac.results.store import ROOM_IN_STORE, check_path_length, results_root

    assert results_root(tmp_path / ("x" * 200)) == (tmp_path / ("x" * 200)).resolve()
    with pytest.raises(GacError, match="a name of 256 bytes"):
        results_root(tmp_path / ("x" * 256))
    deep = tmp_path.joinpath(*["y" * 200] * 21)  # every name fits, the whole path does not
    with pytest.raises(GacError, match="with what gac writes under it, the limit is"):
        check_path_length(deep, "results directory", room=ROOM_IN_STORE)


def test_a_required_config_group_set_to_null_is_named():
    from gac.jobs.config.command_line import compose_config

    for group in ("model", "compressor", "align", "gpu", "eval"):
        with pytest.raises(GacError, match=rf"^{group}=null: every job needs a {group} config; pick one of"):
            compose_config([f"{group}=null"])
    with pytest.raises(GacError, match="^method=null: method is unset unless given; leave the override out"):
        compose_config(["method=null"])
