"""The bad-input catalogue (docs/bad-input.md) is executable: every row runs and must exit 2 with its one line.

Each row's command runs against files this module makes in ``{T}`` (a temporary directory); ``gac ...`` rows run
in-process through :func:`gac.cli.main` (validation happens before any model is loaded, so they take about a
second each), ``python experiments/run.py ...`` rows as a subprocess (Hydra composes the config). After each row
nothing may have been written where the command writes (its ``-o``/``--json`` path, a results directory).

The subprocess rows (a few seconds to a minute each: Python, torch and Hydra start, some load a model) run one
after another in a background thread against their own copy of the files, while the in-process rows run: on two
cores the two kinds overlap instead of queueing. Each row is still judged by its own test.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "bad-input.md"
ROW = re.compile(r"^\| (?P<case>[^|]+?) \| `(?P<cmd>[^`]+)` \| (?P<exit>\d+) \| `(?P<msg>[^`]+)` \|$")


def catalogue() -> list[tuple[str, str, int, str]]:
    rows = [ROW.match(line) for line in DOC.read_text().splitlines()]
    return [(m["case"], m["cmd"], int(m["exit"]), m["msg"]) for m in rows if m]


def test_the_catalogue_is_there_and_parsed():
    rows = catalogue()
    table_lines = [ln for ln in DOC.read_text().splitlines() if ln.startswith("| ") and "`" in ln]
    assert len(rows) == len(table_lines) >= 30  # no row silently unparsed (and so untested)
    assert {r[2] for r in rows} == {2}


def _files(T: Path) -> None:
    """The inputs the rows name."""
    (T / "full").mkdir()
    (T / "full" / "keep.txt").write_text("a colleague's result")
    ck = T / "corrupt_ck"
    ck.mkdir()
    (ck / "gac_checkpoint.json").write_text("{corrupt")
    (T / "piqa_label_x.jsonl").write_text(json.dumps({"goal": "g", "sol1": "a", "sol2": "b", "label": "x"}) + "\n")
    (T / "hellaswag_2.jsonl").write_text(json.dumps({"ctx": "c", "ctx_a": "c", "ctx_b": "", "activity_label": "x",
                                                     "endings": ["a", "b"], "label": 0}) + "\n")
    (T / "alloc_not_json.json").write_text("{not json")
    tgt = {"name": "a", "d_star": 10, "score": 1, "params_per_dim": 10}
    (T / "alloc_1e308.json").write_text(json.dumps({"budget": 1000, "targets": [{**tgt, "score": 1e308}]}))
    (T / "alloc_infeasible.json").write_text(json.dumps({"budget": 5, "targets": [{**tgt, "d_max": 16}]}))
    (T / "alloc_dense_cost.json").write_text(json.dumps({"budget": 10000, "targets": [
        {**tgt, "params_per_dim": 20, "d_max": 8, "kind": "lowrank", "dense_params": 99, "shape": [10, 10]}]}))
    (T / "plan_wrong_model.json").write_text(json.dumps({"dims": {"model.layers.9.self_attn.q_proj": 64}}))
    (T / "plan_ok.json").write_text(json.dumps({"dims": {"model.layers.0.self_attn.q_proj": 64}}))
    _files_2(T, tgt)
    from tests.bad_store_fixtures import store_files

    store_files(T)  # the "Store, records and models" rows: damaged stores, checkpoints and model directories
    __import__("tests.bad_input_fixtures_store", fromlist=["_"]).store_writer_files(T)  # one writer, checked records
    from tests.bad_input_fixtures_own import own_files

    own_files(T)  # the "A shared results directory and a downloaded model directory" rows
    from tests.bad_input_fixtures_fields import fields_files

    fields_files(T)  # the "Configs that disagree with their weights, and refusals made clear" rows
    from tests.bad_input_fixtures_writes import writes_files

    writes_files(T)  # the "Fourth catalogue: writes, checkpoints and messages" rows
    from tests.bad_input_fixtures_axes import axes_files

    axes_files(T)  # the "Fourth catalogue: axes, numbers and crashes" rows
    from tests.bad_input_fixtures_launchsafe import launchsafe_files

    launchsafe_files(T)  # the "Fifth catalogue: what gac did not make" rows
    from tests.bad_input_fixtures_planner import planner_files

    planner_files(T)  # the "Fifth catalogue: planner bounds and fetched inputs" rows
    from tests.bad_input_fixtures_modelchecks import modelchecks_files

    modelchecks_files(T)  # the "Fifth catalogue: models as they are on disk" rows
    from tests.bad_input_fixtures_export import export_files

    export_files(T)  # the "Fifth catalogue: export" rows
    from tests.bad_input_fixtures_unclear import unclear_files

    unclear_files(T)  # the "Fifth catalogue: the last catalogue's unclear cases" rows
    from tests.bad_input_fixtures_engineaxis import engineaxis_files

    engineaxis_files(T)  # the "Engines as an axis" rows
    from tests.bad_input_fixtures_moefused import moefused_files

    moefused_files(T)  # the "Pruned MoE experts" rows
    from tests.bad_input_fixtures_catalogue import catalogue_files

    catalogue_files(T)  # the "Catalogue five, the rest" rows
    from tests.bad_input_fixtures_palu import palu_files

    palu_files(T)  # the "PaLU's latent cache" rows
    from tests.bad_input_fixtures_enginestudy import enginestudy_files

    enginestudy_files(T)  # the "Aligning for an engine" rows
    from tests.bad_input_fixtures_canary import canary_files

    canary_files(T)  # the "The canary" rows
    from tests.bad_input_fixtures_exportfix import exportfix_files

    exportfix_files(T)  # the "Export's own files" rows
    from tests.bad_input_fixtures_enginequant import enginequant_files

    enginequant_files(T)  # the "Engines at a quantized type" rows


def _files_2(T: Path, tgt: dict) -> None:
    """The inputs of the second catalogue's CLI, align and config rows."""
    import os

    (T / "alloc_ok.json").write_text(json.dumps({"budget": 1000, "targets": [{**tgt, "d_star": 10.5}]}))
    (T / "alloc_dstar0.json").write_text(json.dumps({"budget": 10**8, "targets": [
        {**tgt, "d_star": 0, "params_per_dim": 8192, "d_max": 4392},
        {**tgt, "name": "b", "d_star": 300.5, "params_per_dim": 8192, "d_max": 4096}]}))
    (T / "alloc_dstar0_nomax.json").write_text(json.dumps({"budget": 10**8, "targets": [{**tgt, "d_star": 0}]}))
    (T / "alloc_ppd62.json").write_text(json.dumps({"budget": 10**23, "targets": [{**tgt, "params_per_dim": 2**62}]}))
    (T / "alloc_dstar1e300.json").write_text(json.dumps({"budget": 10**9, "targets": [{**tgt, "d_star": 1e300}]}))
    # ties the exact reduction cannot break: candidates 1000/2000/2001, the slack a sum of them cannot fill exactly
    ties = [{"name": f"t{i}", "d_star": 1.5, "score": 1, "params_per_dim": 1, "candidates": [1000, 2000, 2001]}
            for i in range(3000)]
    (T / "alloc_ties.json").write_text(json.dumps({"budget": 1000 * 3000 + 10500, "targets": ties}))
    with open(T / "alloc_1gib.json", "wb") as f:  # sparse: a gibibyte of zeros on no disk
        f.truncate(2**30)
    os.mkfifo(T / "fifo")
    (T / "binary.txt").write_bytes(bytes(range(256)) * 64)
    (T / "store" / "records").mkdir(parents=True)
    import shutil

    shutil.copytree(ROOT / "tests" / "analysis" / "fixtures" / "profile", T / "profile")
    neg = T / "profile_negative"  # one latency made -5 ms, its checksum updated to match
    shutil.copytree(T / "profile", neg)
    lines = (neg / "table.csv").read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace(",0.74,", ",-5,")
    (neg / "table.csv").write_text("".join(lines))
    from gac.hashing import file_sha256

    meta = json.loads((neg / "profile.json").read_text())
    meta["table_sha256"] = file_sha256(neg / "table.csv")
    (neg / "profile.json").write_text(json.dumps(meta))


def _outputs(argv: list[str]) -> list[Path]:
    """Where a command would write: its -o / --json / --output value and a results_dir=... override."""
    outs = []
    for i, a in enumerate(argv):
        if a in ("-o", "--output", "--json") and i + 1 < len(argv):
            outs.append(Path(argv[i + 1]))
        if a.startswith("results_dir="):
            outs.append(Path(a.split("=", 1)[1]))
    return outs


@pytest.fixture(scope="module")
def T(tmp_path_factory):
    t = tmp_path_factory.mktemp("bad")
    _files(t)
    return t


CASES = catalogue()


ENV = re.compile(r"^[A-Z][A-Z0-9_]*=")  # a row may start with VAR=value settings, as a shell line does


def _argv(cmd: str, T: Path) -> tuple[list[str], dict]:
    """A row's command line against ``T``, and the VAR=value settings it starts with."""
    argv = shlex.split(cmd.replace("{T}", str(T)))
    env = {}
    while argv and ENV.match(argv[0]):
        k, v = argv.pop(0).split("=", 1)
        env[k] = v
    return argv, env


def _subprocess_row(cmd: str, T: Path, environ: dict) -> tuple[int, str, list[Path], Path]:
    """One ``python experiments/run.py`` row in ``environ`` (the environment as the module started: an in-process
    row's settings must not leak into it): its exit code, stderr, the outputs it must not have written, ``T``."""
    argv, env = _argv(cmd, T)
    assert argv[:2] == ["python", "experiments/run.py"], cmd
    outs = [p for p in _outputs(argv) if not p.exists()]
    p = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**environ, **env})
    return p.returncode, p.stderr, outs, T


@pytest.fixture(scope="module", autouse=True)
def subprocess_rows(request, tmp_path_factory):
    """The selected subprocess rows, started at once in one background thread on their own copy of the files
    (module docstring); ``{(case, cmd): Future}``."""
    mine = {item.callspec.params["case"] for item in request.session.items
            if item.module is request.module and "case" in getattr(getattr(item, "callspec", None), "params", {})}
    rows = [(case, cmd) for case, cmd, _, _ in CASES
            if case in mine and _argv(cmd, Path("/"))[0][:2] == ["python", "experiments/run.py"]]
    if not rows:
        yield {}
        return
    T2 = tmp_path_factory.mktemp("bad_subprocess")
    _files(T2)
    import os

    environ, pool = dict(os.environ), ThreadPoolExecutor(max_workers=1)
    futures: dict[tuple[str, str], Future] = {(case, cmd): pool.submit(_subprocess_row, cmd, T2, environ)
                                              for case, cmd in rows}
    yield futures
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("case,cmd,code,msg", CASES, ids=[r[0][:60] for r in CASES])
def test_bad_input_exits_2_with_one_line(case, cmd, code, msg, T, subprocess_rows, capsys, monkeypatch):
    if (case, cmd) in subprocess_rows:
        rc, err, outs, where = subprocess_rows[case, cmd].result()
    else:
        argv, env = _argv(cmd, T)
        assert argv[0] == "gac", cmd
        outs, where = [p for p in _outputs(argv) if not p.exists()], T
        from gac.cli import main

        for k, v in env.items():
            monkeypatch.setenv(k, v)
        rc = main(argv[1:])
        err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("Loading weights")]
    assert rc == code, (case, err)
    extra = ["nothing was launched."] if " -m " in f" {cmd} " else []
    assert len(lines) == 1 + len(extra) and lines[1:] == extra, (case, lines)
    assert msg in lines[0] and "Traceback" not in err, (case, lines[0])
    assert re.match(r"^(gac [a-z]+|experiments/run\.py): error: ", lines[0]), lines[0]
    for p in outs:
        assert not p.exists(), f"{case}: {p} was written"
    assert (where / "full" / "keep.txt").read_text() == "a colleague's result"
