"""The side-by-side bench on `tiny` (CPU): the document, the store record and its skip, kernels, bad input, Table 5."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gac.evaluation.bench as B
from gac.analysis import format_table, load_results, table5
from gac.cli import main
from gac.errors import GacError
from gac.jobs.bench.store_bench import bench_store
from gac.results import ResultsStore
from tests.bench_store import FAST

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def benched(tiny_store):
    """One bench over the whole shared store (9 variants, S=64), written to it."""
    return bench_store(tiny_store["results"], experiment="benchtest", **FAST)


def test_the_bench_document(benched, tiny_store):
    doc = benched
    labels = [v["label"] for v in doc["variants"]]
    assert labels == ["Baseline", "ASVD", "ASVD (GAC)", "SVD-LLM", "SVD-LLM (GAC)", "PaLU", "PaLU (GAC)",
                      "LLM-Pruner", "LLM-Pruner (GAC)"]
    recs = tiny_store["records"]
    assert doc["variants"][0]["record_key"] == recs[("none", "baseline")]["key"]
    assert doc["records"] == [v["record_key"] for v in doc["variants"][1:]]
    assert doc["device"]["type"] == "cpu" and "CPU latency says nothing about GPUs" in doc["device"]["note"]
    assert doc["device"]["threads"] == 1
    prot = doc["protocol"]
    assert (prot["rounds"], prot["warmup"], prot["iters"], prot["points"]) == (3, 0, 2, [[1, 64]])
    assert prot["memory_mode"] == "resident" and prot["timer"] == "thread_time"
    assert doc["bootstrap"]["resamples"] == 2000
    for v in doc["variants"]:
        pt = v["points"]["prefill_ms@64"]
        assert len(pt["samples_ms"]) == 3 and v["median_ms"] == pt["median_ms"] > 0
        lo, hi = v["ratio_ci95"]
        assert lo <= v["ratio_to_baseline"] <= hi
        assert v["alignment_efficiency"] == pytest.approx(v["flops_ratio"] / v["ratio_to_baseline"])
        top = v["top_kernels"]
        assert top and all(k["name"].startswith("aten::") and 0 < k["pct"] <= 100 and k["ms"] > 0 for k in top)
        assert v["sdpa_backend"] and v["sdpa_backend"][0] in ("flash (cpu)", "math", "efficient")
        if v["baseline"]:
            assert v["ratio_to_baseline"] == 1.0 and v["flops_ratio"] == 1.0
        else:
            assert v["flops_ratio"] < 1.0  # fewer parameters, fewer FLOPs
            assert v["compressed_params"] == v["plan_params"]
    by = {v["label"]: v for v in doc["variants"]}
    assert by["ASVD (GAC)"]["sibling"] == "ASVD" and by["ASVD"]["sibling"] is None
    assert by["ASVD (GAC)"]["ratio_to_unaligned"] > 0 and len(by["ASVD (GAC)"]["ratio_to_unaligned_ci95"]) == 2
    assert by["ASVD"]["ratio_to_unaligned"] is None
    prov = doc["provenance"]
    assert prov["git_commit"] and prov["packages"]["torch"] and prov["date"]


def test_the_bench_is_a_store_record_and_a_rerun_skips_it(benched, tiny_store, store_copy):
    store = ResultsStore(tiny_store["results"])
    path = Path(benched["_path"])
    assert path == store.bench_path(benched["key"]) and path.exists()
    stored = json.loads(path.read_text())
    assert stored["kind"] == "bench" and stored["key"] == benched["key"] and stored["created"]
    again = bench_store(tiny_store["results"], experiment="benchtest", **FAST)
    assert again["skipped"] is True and again["key"] == benched["key"]
    assert sorted(p.name for p in store.bench_dir.iterdir()) == [path.name]
    # in a private copy: --force measures again beside the first record, never over it
    sel = {"where": {"compressor": "palu"}, **FAST}
    first = bench_store(store_copy, **sel)
    before = Path(first["_path"]).read_bytes()
    assert bench_store(store_copy, **sel)["skipped"] is True
    other = bench_store(store_copy, **{**sel, "rounds": 4})  # another protocol is another bench
    assert other["key"] != first["key"] and not other.get("skipped")
    forced = bench_store(store_copy, force=True, **sel)
    assert not forced.get("skipped") and Path(forced["_path"]).name.startswith(f"{first['key']}.rerun-")
    assert Path(first["_path"]).read_bytes() == before
    assert len(list(ResultsStore(store_copy).iter_bench())) == 3


def test_the_visits_follow_the_shuffled_rounds(tiny_store, monkeypatch):
    seen = []
    real = B._visit

    def spy(cell, *args):
        seen.append(cell.model._gac_structure)
        real(cell, *args)

    monkeypatch.setattr(B, "_visit", spy)
    recs = [tiny_store["records"][k] for k in (("asvd", "unaligned"), ("asvd", "gac"), ("llm_pruner", "gac"))]
    from gac.jobs.bench.variants import build_variants

    variants, _, _ = build_variants(recs, recs)
    doc = B.run_bench(variants, B.Protocol(points=((1, 32),), rounds=6, warmup=0, iters=1, profile=False, seed=7))
    order = [i for o in B.round_orders(len(variants), 6, seed=7) for i in o]
    assert seen == [variants[i].structure for i in order]
    assert all(len(v["points"]["prefill_ms@32"]["samples_ms"]) == 6 for v in doc["variants"])


def test_table5_takes_latency_from_the_bench(benched, tiny_store):
    df = load_results(tiny_store["results"])
    t = table5(df, model="tiny", ratio=0.15, compressors=["asvd", "llm_pruner"])
    by = {v["label"]: v for v in benched["variants"]}
    assert t.loc["ASVD (GAC)", "Prefill (ms)"] == pytest.approx(by["ASVD (GAC)"]["median_ms"])
    assert t.loc["Baseline", "Prefill (ms)"] == pytest.approx(by["Baseline"]["median_ms"])
    assert t.loc["LLM-Pruner", "vs. baseline (%)"] == pytest.approx(100 * (by["LLM-Pruner"]["ratio_to_baseline"] - 1))
    lo, hi = by["LLM-Pruner"]["ratio_ci95"]
    assert t.loc["LLM-Pruner", "CI95 low (%)"] == pytest.approx(100 * (lo - 1))
    assert t.loc["LLM-Pruner", "CI95 high (%)"] == pytest.approx(100 * (hi - 1))
    cap = t.attrs["caption"]
    assert f"side-by-side bench {benched['key'][:8]}" in cap and "(cpu), 3 interleaved rounds" in cap
    assert "CI95 low" in format_table(t)


def test_table5_without_a_bench_labels_per_job_latency(tiny_store, store_copy):
    from gac.analysis.load import records_to_frame

    df = records_to_frame(ResultsStore(store_copy).iter_records())
    df["prefill_ms"] = 10.0
    t = table5(df, model="tiny", ratio=0.15, compressors=["asvd"])
    assert "per-job smoke numbers" in t.attrs["caption"] and "CI95 low (%)" not in t.columns


def test_a_plan_file_route(tiny_store, tmp_path):
    rec = tiny_store["records"][("asvd", "gac")]
    plan = tmp_path / "mine.json"
    plan.write_text(json.dumps(rec["plan"]))
    out = tmp_path / "b.json"
    code = main(["bench", "--plan", str(plan), "--model", "tiny", "--compressor", "asvd", "--point", "32",
                 "--rounds", "2", "--warmup", "0", "--iters", "1", "--no-profile", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [v["label"] for v in doc["variants"]] == ["Baseline", "mine"]
    assert doc["variants"][1]["compressed_params"] == rec["plan"]["params"]


def _damage(store_copy, key, edit):
    p = store_copy / "records" / f"{key}.json"
    rec = json.loads(p.read_text())
    edit(rec)
    p.write_text(json.dumps(rec))


@pytest.mark.parametrize("case", ["targets", "no_plan", "two_models", "cuda", "too_long", "empty", "unknown_key"])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case, tiny_store, store_copy, tmp_path, capsys):
    import torch

    recs = tiny_store["records"]
    args = ["bench", str(store_copy), "--rounds", "2", "--warmup", "0", "--iters", "1"]
    if case == "targets":
        def bogus(r):
            r["plan"]["dims"]["model.layers.7.self_attn.q_proj"] = 64

        _damage(store_copy, recs[("asvd", "gac")]["key"], bogus)
        want = "do not exist in this architecture"
    elif case == "no_plan":
        _damage(store_copy, recs[("palu", "gac")]["key"], lambda r: r.update(plan=None))
        want = "has no plan"
    elif case == "two_models":
        def other(r):
            r["job"]["model"] = "other"
            r["config"]["model"]["spec"] = "tiny-untrained"

        _damage(store_copy, recs[("svd_llm", "gac")]["key"], other)
        want = "different models"
    elif case == "cuda":
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
        args += ["--device", "cuda"]
        want = "is not there"
    elif case == "too_long":
        args += ["--point", "4096"]
        want = "above the model's maximum sequence length (1024)"
    elif case == "empty":
        args += ["--where", "compressor=nothing"]
        want = "no completed record matches"
    else:
        args += ["--where", "colour=red"]
        want = "unknown filter key 'colour'"
    out = tmp_path / "out.json"
    code = main([*args, "--json", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("gac bench: error:") and want in err[0], err
    assert not (store_copy / "bench").exists() and not out.exists()


def test_two_dtypes_or_devices_need_a_choice(tiny_store, store_copy):
    _damage(store_copy, tiny_store["records"][("asvd", "gac")]["key"], lambda r: r["config"]["gpu"].update(dtype="float16"))
    with pytest.raises(GacError, match=r"several dtypes \['float16', 'float32'\]; choose one with --dtype"):
        bench_store(store_copy, **FAST)


def test_the_hydra_entry_point(tiny_store, store_copy):
    key = tiny_store["records"][("llm_pruner", "gac")]["key"]
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench.py"), f"results_dir={store_copy}",
                        f"keys=[{key}]", "rounds=2", "warmup=0", "iters=1", "profile=false"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "LLM-Pruner (GAC)" in r.stdout and "NOTE: this is a CPU" in r.stdout
    assert len(list((store_copy / "bench").glob("*.json"))) == 1
    bad = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench.py"), f"results_dir={store_copy}",
                          "+where.colour=red"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown filter key 'colour'" in bad.stderr
