"""The files the "Results store: one writer, checked records" rows of docs/bad-input.md name: stores holding a bench
record that `gac bench` would show as "already measured" (measured once here, in-process, from ``{T}/plan_ok.json``
on tiny at S=16 with the protocol the rows give, then edited), and stores whose lock or event log a backfill or a
bench would otherwise write through."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "analysis" / "fixtures" / "store"
FIRST = "a01000000000000a"  # the fixture store's first record key: the first a backfill takes


def _bench(T: Path) -> dict:
    """Measure the rows' bench once into ``{T}/sb_ok`` (the protocol the rows name: its key is theirs)."""
    from gac.jobs.bench.store_bench import bench_store

    (T / "sb_ok" / "records").mkdir(parents=True)
    return bench_store(T / "sb_ok", plans=[str(T / "plan_ok.json")], model="tiny", compressor="asvd",
                       points=[(1, 16)], rounds=2, warmup=0, iters=1, bootstrap=100, profile=False)


def store_writer_files(T: Path) -> None:
    doc = _bench(T)
    key, point = doc["key"], doc["main_point"]
    src = T / "sb_ok" / "bench" / f"{key}.json"

    def planted(name: str, edit=None, text=None) -> Path:
        d = T / name
        (d / "records").mkdir(parents=True)
        (d / "bench").mkdir()
        dst = d / "bench" / f"{key}.json"
        if text is not None:
            dst.write_text(text)
        else:
            rec = json.loads(src.read_text())
            edit(rec)
            dst.write_text(json.dumps(rec, indent=1))
        return dst

    def variant(rec) -> dict:
        return rec["variants"][1]

    planted("sb_neg", lambda r: (variant(r)["points"][point].update(median_ms=-3.0), variant(r).update(median_ms=-3.0)))
    rec = json.loads(src.read_text())
    variant(rec)["points"][point]["median_ms"] = 123.25
    planted("sb_inf", text=json.dumps(rec).replace('"median_ms": 123.25', '"median_ms": 1e400'))
    planted("sb_nopoint", lambda r: variant(r)["points"].pop(point))
    dst = planted("sb_link", text="")
    dst.unlink()
    shutil.copy(src, T / "outside_bench.json")
    dst.symlink_to(T / "outside_bench.json")
    (T / "sb_lockdir" / "records").mkdir(parents=True)
    (T / "sb_lockdir" / "locks" / f"bench-{key}.lock").mkdir(parents=True)  # no record: the bench takes its lock

    shutil.copytree(STORE, T / "sw_lockdir")
    (T / "sw_lockdir" / "locks" / f"{FIRST}.lock").mkdir(parents=True)
    shutil.copytree(STORE, T / "sw_runs_link")
    (T / "sw_runs_link" / "runs").mkdir()
    (T / "outside_events.jsonl").write_text("")
    os.symlink(T / "outside_events.jsonl", T / "sw_runs_link" / "runs" / f"{FIRST}.jsonl")
