"""`gac align`: the bring-your-own-compressor entry point."""

import json
import subprocess
import sys

import pytest

from gac.cli import main

GOOD = {
    "budget": 10 * 200,
    "targets": [
        {"name": "lo", "d_star": 100.0, "score": 0.1, "params_per_dim": 10, "d_max": 4096},
        {"name": "hi", "d_star": 100.0, "score": 5.0, "params_per_dim": 10, "d_max": 4096},
    ],
    "window": 2,
}


def _write(tmp_path, obj, name="alloc.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_align_writes_plan(tmp_path, capsys):
    a = _write(tmp_path, GOOD)
    out = tmp_path / "plan.json"
    assert main(["align", str(a), "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    for key in ("strategy", "dims", "params", "budget", "objective", "aligned_fraction"):
        assert key in plan
    assert plan["dims"] == {"lo": 88, "hi": 112}
    assert plan["params"] == 2000 and plan["budget"] == 2000
    assert plan["aligned_fraction"] == 1.0
    assert "gac: 2 targets" in capsys.readouterr().out


def test_align_prints_to_stdout_and_strategy_unit_flags(tmp_path, capsys):
    a = _write(tmp_path, GOOD)
    assert main(["align", str(a), "--strategy", "round_nearest", "--unit", "16"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["strategy"] == "round_nearest"
    assert plan["dims"] == {"lo": 96, "hi": 96}
    assert plan["unit"] == 16


def test_compare_table(tmp_path, capsys):
    a = _write(tmp_path, GOOD)
    assert main(["align", str(a), "--compare"]) == 0
    err = capsys.readouterr().err
    for s in ("unaligned", "round_nearest", "round_up", "round_down", "rebalance", "gac"):
        assert s in err


def test_explicit_candidates(tmp_path, capsys):
    obj = {"budget": 1000, "targets": [{"name": "a", "d_star": 50.5, "score": 1, "params_per_dim": 10, "candidates": [40, 48, 56]}]}
    assert main(["align", str(_write(tmp_path, obj))]) == 0
    assert json.loads(capsys.readouterr().out)["dims"] == {"a": 56}


def _bad(tmp_path, obj, capsys, *extra):
    a = _write(tmp_path, obj)
    out = tmp_path / "plan.json"
    rc = main(["align", str(a), "-o", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert not out.exists()
    assert err.startswith("gac align: error: ")
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    return err


def _target(**kw):
    t = {"name": "a", "d_star": 100.0, "score": 1.0, "params_per_dim": 10, "d_max": 4096}
    t.update(kw)
    return t


@pytest.mark.parametrize(
    "obj,msg",
    [
        ("{not json", "not valid JSON"),
        ('{"budget": 100, "targets": [{"name": "a", "d_star": NaN, "score": 1, "params_per_dim": 1}]}', "not valid JSON"),
        ([1, 2], "expected a JSON object"),
        ({"targets": [_target()]}, "missing required key 'budget'"),
        ({"budget": 5000}, "missing required key 'targets'"),
        ({"budget": 5000, "targets": []}, "non-empty list"),
        ({"budget": 5000, "targets": [{"name": "a", "score": 1, "params_per_dim": 10}]}, "missing required key(s) ['d_star']"),
        ({"budget": 0, "targets": [_target()]}, "'budget' must be a positive"),
        ({"budget": -10, "targets": [_target()]}, "'budget' must be a positive"),
        ({"budget": 5000, "targets": [_target(score=-1.0)]}, "score must be >= 0"),
        ({"budget": 5000, "targets": [_target(d_star=5000.0)]}, "exceeds d_max"),
        ({"budget": 5000, "targets": [_target(candidates=[])]}, "candidate list is empty"),
        ({"budget": 5000, "targets": [_target(scroe=1)]}, "unknown key(s) ['scroe']"),
        ({"budget": 5000, "budgte": 1, "targets": [_target()]}, "unknown key(s) ['budgte']"),
        ({"budget": 5000, "targets": [_target(), _target()]}, "duplicate target name"),
        ({"budget": 300, "targets": [_target()]}, "infeasible budget: 300 parameters"),
    ],
)
def test_bad_input_exits_2_without_output(tmp_path, capsys, obj, msg):
    err = _bad(tmp_path, obj, capsys)
    assert msg in err


def test_infeasible_budget_names_minimum(tmp_path, capsys):
    err = _bad(tmp_path, {"budget": 500, "targets": [_target()], "window": 2}, capsys)
    assert "at least 880" in err  # smallest candidate within 2 units of 100 is 88


def test_bad_flags(tmp_path, capsys):
    assert "did you mean 'gac'" in _bad(tmp_path, GOOD, capsys, "--strategy", "gca")
    assert "alignment unit must be a positive multiple of 8" in _bad(tmp_path, GOOD, capsys, "--unit", "0")


def test_missing_file(tmp_path, capsys):
    rc = main(["align", str(tmp_path / "nope.json")])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_never_overwrites(tmp_path, capsys):
    a = _write(tmp_path, GOOD)
    out = tmp_path / "plan.json"
    out.write_text("precious")
    assert main(["align", str(a), "-o", str(out)]) == 2
    assert out.read_text() == "precious"
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["align", str(a), "-o", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["strategy"] == "gac"


def test_console_script_entry_point(tmp_path):
    a = _write(tmp_path, GOOD)
    r = subprocess.run([sys.executable, "-m", "gac.cli", "align", str(a)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dims"] == {"lo": 88, "hi": 112}
    r = subprocess.run([sys.executable, "-m", "gac.cli", "align", str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_the_demo_allocation_aligns_and_predicts_on_the_real_module_names(tmp_path, capsys):
    """gac demo --save-allocation -> gac align -> gac predict --plan: the targets carry the architecture's module
    paths (self_attn.q_proj, mlp.gate_proj), so the plan applies to a Llama-3-8B."""
    alloc, plan = tmp_path / "alloc.json", tmp_path / "plan.json"
    assert main(["demo", "--save-allocation", str(alloc)]) == 0
    names = [t["name"] for t in json.loads(alloc.read_text())["targets"]]
    assert "model.layers.0.self_attn.q_proj" in names and "model.layers.31.mlp.down_proj" in names
    assert main(["align", str(alloc), "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["predict", "--gpu", "a100", "--model", "llama3_8b", "--plan", str(plan), "--compressor", "asvd"]) == 0
    assert "plan" in capsys.readouterr().out
