"""`gac align` with a latency budget: strategy gac_latency, latencies per target in the allocation JSON."""

import json

import pytest

from gac.align.allocation_io import allocation_to_json, parse_allocation
from gac.cli import main

# two targets; the misaligned-looking candidates are slow (a cliff at 100 / 104 for "hi")
LAT = {
    "budget": 10 * 200,
    "latency_budget_ms": 2.0,
    "latency_fixed_ms": 0.45,
    "window": 2,
    "targets": [
        {"name": "lo", "d_star": 100.0, "score": 0.1, "params_per_dim": 10, "d_max": 4096,
         "latency_ms": {"88": 0.5, "96": 0.6, "104": 0.7, "112": 0.8}},
        {"name": "hi", "d_star": 100.0, "score": 5.0, "params_per_dim": 10, "d_max": 4096,
         "latency_ms": {"88": 0.5, "96": 0.6, "104": 1.5, "112": 0.8}},
    ],
}


def _write(tmp_path, obj):
    p = tmp_path / "alloc.json"
    p.write_text(json.dumps(obj))
    return p


def test_gac_latency_holds_the_latency_budget(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["align", str(_write(tmp_path, LAT)), "--strategy", "gac_latency", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["strategy"] == "gac_latency"
    # 1.55 ms for the targets: hi takes 112 (0.8 ms, past its 104 cliff), lo what is left: 104 (0.7 ms)
    assert plan["dims"] == {"lo": 104, "hi": 112}
    lat = plan["stats"]["latency"]
    assert lat["budget_kind"] == "latency_ms" and lat["held"] and lat["latency_ms"] == pytest.approx(1.95)
    assert lat["budget_ms"] == 2.0 and lat["fixed_ms"] == 0.45 and lat["solver"] == "exact"
    assert plan["params"] == 2160 and not plan["budget_met"]  # parameters are reported, not budgeted
    assert "latency 1.95 ms / budget 2 ms (held)" in capsys.readouterr().out


def test_parameter_strategies_report_their_latency(tmp_path, capsys):
    assert main(["align", str(_write(tmp_path, LAT))]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["strategy"] == "gac" and plan["dims"] == {"lo": 88, "hi": 112}
    assert plan["stats"]["latency"] == {"latency_ms": pytest.approx(1.75), "fixed_ms": 0.45, "latency_budget_ms": 2.0,
                                        "within_latency_budget": True}
    assert main(["align", str(_write(tmp_path, LAT)), "--compare"]) == 0
    table = capsys.readouterr().err
    assert "latency_ms" in table.splitlines()[0] and "gac_latency" in table


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.pop("latency_budget_ms"), "needs 'latency_budget_ms'"),
    (lambda d: d["targets"][0].pop("latency_ms"), "have no 'latency_ms'"),
    (lambda d: d["targets"][1]["latency_ms"].pop("112"), r"lacks candidate dimensions: 'hi' at \[112\]"),
    (lambda d: d.update(latency_budget_ms=-1), "'latency_budget_ms' must be a finite number of milliseconds above 0"),
    (lambda d: d.update(latency_budget_ms=0.9), "infeasible latency budget"),
    (lambda d: d["targets"][0]["latency_ms"].update({"x": 1}), "dimensions must be positive integers"),
])
def test_bad_latency_input_exits_2_with_the_problem(tmp_path, capsys, edit, message):
    data = json.loads(json.dumps(LAT))
    edit(data)
    assert main(["align", str(_write(tmp_path, data)), "--strategy", "gac_latency"]) == 2
    assert __import__("re").search(message, capsys.readouterr().err)


def test_latency_keys_round_trip_and_old_files_are_unchanged():
    alloc = parse_allocation(LAT)
    again = allocation_to_json(alloc)
    assert again["latency_budget_ms"] == 2.0 and again["latency_fixed_ms"] == 0.45
    assert parse_allocation(again).latency == alloc.latency == {
        "lo": {88: 0.5, 96: 0.6, 104: 0.7, 112: 0.8}, "hi": {88: 0.5, 96: 0.6, 104: 1.5, 112: 0.8}}
    plain = {k: v for k, v in LAT.items() if not k.startswith("latency")}
    plain["targets"] = [{k: v for k, v in t.items() if k != "latency_ms"} for t in LAT["targets"]]
    assert set(allocation_to_json(parse_allocation(plain))) == {"budget", "unit", "window", "targets"}


def test_a_budget_at_the_fastest_plans_exact_latency_is_answered(tmp_path):
    from fractions import Fraction

    from gac.align.latency_budget import round_up

    data = json.loads(json.dumps(LAT))
    exact = Fraction(0.45) + Fraction(0.5) + Fraction(0.5)  # every target at 88 (ties at 0.5 ms)
    data["latency_budget_ms"] = round_up(exact)  # what `gac align` reports for that plan, as a float
    out = tmp_path / "plan.json"
    assert main(["align", str(_write(tmp_path, data)), "--strategy", "gac_latency", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["dims"] == {"lo": 88, "hi": 88} and plan["stats"]["latency"]["held"]
    assert plan["stats"]["latency"]["latency_ms"] == data["latency_budget_ms"]


def test_the_retired_quantum_key_is_refused_with_the_fix(tmp_path, capsys):
    data = dict(LAT, latency_quantum_ms=0.001)
    assert main(["align", str(_write(tmp_path, data)), "--strategy", "gac_latency"]) == 2
    err = capsys.readouterr().err
    assert "'latency_quantum_ms' is no longer read" in err and "remove the key" in err
