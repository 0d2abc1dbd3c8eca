"""Every script in benchmarks/ runs end to end at its ``--quick`` size, so none of them rots unnoticed.

The scripts that need torch run in this process (``main(argv)``, sharing the imports already made); the solver
benchmark pins its process to one core, so it runs as its own process. ``--quick`` runs take no CPU lock.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def keep_torch_threads():
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)  # the scripts set their own thread counts


def test_every_benchmark_is_covered():
    # palu_cache: tests/compression/test_palu_cache.py; engine_alignment: its tables below (its measurement needs the
    # engines and smollm2; tests/export/test_engine_alignment.py measures the same fallback rule in llama.cpp)
    covered = {"solver", "compressors", "families", "parity", "parity_prune", "predict_paper", "scale", "evidence",
               "moe_prefill", "moe_quality", "estimates", "palu_cache", "engine_alignment"}
    assert {p.stem for p in BENCH.glob("*.py")} == covered  # a new script gets a --quick run here


def test_solver_quick():
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    r = subprocess.run([sys.executable, str(BENCH / "solver.py"), "--quick"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Llama-3-70B equal scores" in r.stdout and "| NO" not in r.stdout


@pytest.mark.parametrize("name,argv,expect", [
    ("compressors", ["--quick", "--compressors", "llm_pruner"], "baseline perplexity"),
    ("parity", ["--quick", "--compressors", "asvd", "svd_llm"], "| asvd | 0.30 |"),
    ("parity_prune", ["--quick"], "llm_pruner"),
    ("predict_paper", ["--quick"], "median |error|"),
    ("families", ["--models", "tiny", "--device", "cpu", "--dtype", "float32", "--seq-len", "16", "--rounds", "2",
                  "--warmup", "1", "--iters", "1", "--calib", "1x16", "--compressors", "llm_pruner"], "llm_pruner gac"),
])
def test_benchmark_quick(name, argv, expect, keep_torch_threads, capsys):
    assert _module(name).main(argv) == 0
    assert expect in capsys.readouterr().out


def test_scale_quick(tmp_path, keep_torch_threads, capsys):
    scale = _module("scale")
    out = str(tmp_path / "scale.json")
    assert scale.main(["jobs", "--quick", "--compressors", "llm_pruner", "--out", out]) == 0
    assert scale.main(["methods", "--quick", "--out", out]) == 0
    assert scale.main(["report", "--out", out]) == 0
    assert "| tiny |" in capsys.readouterr().out


def test_evidence_cpu_smoke_feeds_predict_paper_as_a_held_out_set(tmp_path, keep_torch_threads, capsys):
    """The evidence run end to end at its CPU size: the file holds every phase in the format predict_paper reads,
    and predict_paper scores it as a held-out set."""
    evidence, paper = _module("evidence"), _module("predict_paper")
    out = tmp_path / "smoke.json"
    assert evidence.main(["--cpu-smoke", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Table 5's latency column (batch 1, S=64)" in text and "the comparison means nothing" in text
    doc = json.loads(out.read_text())
    assert doc["kind"] == "gac-evidence" and doc["scale"] == "cpu-smoke" and doc["complete"] is True
    assert doc["command"].endswith(f"benchmarks/evidence.py --cpu-smoke --out {out}")
    assert {"torch", "cuda", "cublas", "transformers"} <= set(doc["software"]) and doc["device"]["type"] == "cpu"
    variants = {(v["compressor"], v["variant"]) for v in doc["variants"]}
    assert variants == {("none", "baseline")} | {(c, s) for c in evidence.COMPRESSORS for s in ("unaligned", "gac")}
    assert len(doc["prefill"]) == 9 * 8 and all(r["ms"] > 0 for r in doc["prefill"])
    assert {r["seq_len"] for r in doc["prefill"]} == set(evidence.SMOKE_SEQS)
    gac_dims = [d for v in doc["variants"] if v["variant"] == "gac" for d in v["dims"].values()]
    assert gac_dims and all(d % 8 == 0 for d in gac_dims)
    # every GEMM and SDPA shape of those prefills, measured alone, with the kernels that ran (CPU: ATen ops)
    assert doc["gemm"] and all(g["kernels"] and g["us"] > 0 for g in doc["gemm"])
    assert any("mm" in k["name"] for g in doc["gemm"] for k in g["kernels"])
    assert {a["head_dim"] for a in doc["sdpa"]} == {64} and len(doc["sdpa"]) == 8
    assert len(doc["traces"]) == 72 and all(t["kernels"] > 0 for t in doc["traces"])
    assert {"library", "tile", "split_k"} <= set(doc["gemm"][0]["kernels"][0])
    # the file is a held-out set for predict_paper
    assert paper.main(["--evidence", str(out), "--evidence-only", "--quick"]) == 2  # a CPU stands in for no GPU
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --evidence-as a100|h100" in err[0]
    assert paper.main(["--evidence", str(out), "--evidence-as", "h100", "--evidence-only", "--quick"]) == 0
    text = capsys.readouterr().out
    assert "held out (evidence)" in text and "Evidence cpu-smoke run" in text and "mean nothing" in text
    assert "prefill, held out: median |error|" in text and "GEMM kernels measured alone" in text
    assert "rise S=24 -> 25, none baseline: measured" in text


def test_evidence_stops_within_its_budget_and_keeps_what_it_has(tmp_path, keep_torch_threads, capsys):
    evidence, paper = _module("evidence"), _module("predict_paper")
    out = tmp_path / "e.json"
    out.write_text("{}")
    assert evidence.main(["--cpu-smoke", "--out", str(out)]) == 2  # never overwritten without --force
    assert "exists; pass --force" in capsys.readouterr().err and out.read_text() == "{}"
    assert evidence.main(["--cpu-smoke", "--out", str(out), "--force", "--budget-s", "0.001"]) == 0
    assert "INCOMPLETE: the budget (0 s) ends before prefill none baseline S=8" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["prefill"] == [] and doc["stopped"].startswith("the budget")
    assert paper.main(["--evidence", str(out), "--evidence-as", "h100", "--evidence-only", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no prefill measurement" in err[0]
    out.write_text("not json")
    assert paper.main(["--evidence", str(out), "--quick"]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert evidence.main(["--out", str(tmp_path / "g.json")]) == 2  # no GPU here: says so before any work
    assert "--cpu-smoke" in capsys.readouterr().err


@pytest.mark.parametrize("name,expect", [("moe_prefill", "| shared (fused) |"),
                                         ("moe_quality", "| sorted | uniform | shared |")])
def test_moe_benchmarks_quick(name, expect, tmp_path, keep_torch_threads):
    """Each puts its table between its own markers in --out: an older table there is replaced, the rest of the file
    kept."""
    out = tmp_path / "results.md"
    out.write_text(f"# kept above\n<!-- {name}: begin -->\nan older table\n<!-- {name}: end -->\nkept below\n")
    assert _module(name).main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# kept above\n") and text.endswith("kept below\n") and expect in text
    assert "an older table" not in text and text.count(f"<!-- {name}: begin -->") == 1


def test_a_marked_block_is_appended_once_then_replaced(tmp_path):
    """gac.io.write_marked_block (the MoE scripts' tables): a missing file is created, a file without the markers
    gets them appended after its text, and a later block replaces the earlier one."""
    from gac.io import write_marked_block

    new = tmp_path / "new.md"
    write_marked_block(new, "t", "| a |")
    assert new.read_text() == "<!-- t: begin -->\n| a |\n<!-- t: end -->\n"
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\nprose\n")
    write_marked_block(doc, "t", "| a |")
    write_marked_block(doc, "u", "| u |")
    write_marked_block(doc, "t", "| b |\n")
    assert doc.read_text() == ("# Title\n\nprose\n\n<!-- t: begin -->\n| b |\n<!-- t: end -->\n\n"
                               "<!-- u: begin -->\n| u |\n<!-- u: end -->\n")


def test_engine_alignment_renders_the_published_run(tmp_path):
    """--render: the committed run's JSON gives the tables the results doc holds, and nothing else of the doc moves."""
    mod = _module("engine_alignment")
    doc = ROOT / "docs" / "results-engines.md"
    copy = tmp_path / "results-engines.md"
    copy.write_text(doc.read_text(encoding="utf-8"), encoding="utf-8")
    assert mod.main(["--out", str(tmp_path / "o"), "--render", str(doc.with_suffix(".json")), "--doc", str(copy)]) == 0
    assert copy.read_text(encoding="utf-8") == doc.read_text(encoding="utf-8")


def test_estimates_writes_the_table_and_the_rows(tmp_path, capsys):
    """One real job (tiny, LLM-Pruner: no sensitivity search) in its own process, its estimate against its peak."""
    out = tmp_path / "est.md"
    assert _module("estimates").main(["--models", "tiny", "--compressors", "llm_pruner", "--out", str(out)]) == 0
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert row["memory_estimate_mb"] > 0 and row["peak_above_load_mb"] > 0 and row["memory_ratio"] > 0
    assert row["sensitivity_s"] is None and len(row["load"]) == 2
    text = out.read_text()
    assert "| tiny | llm_pruner |" in text and "python benchmarks/estimates.py" in text
    assert ("Under load (provisional)" in text) == (json.loads(out.with_suffix(".json").read_text())["meta"][
        "max_load"] > 1.5)
