"""One writer per result, on real processes: two `gac bench` of one bench at once measure and store it once; two
`gac wandb backfill` at once make one W&B run per record; a backfill killed with SIGKILL after logging a record but
before recording it as logged is resumed by the next one under the same run id, and nothing is logged twice.
Deterministic: the hold and kill points of gac.faults decide, no sleep does. W&B runs offline (as the live logger's
tests), into the store's wandb/ directory. Marker ``faults``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gac.results import ResultsStore

pytestmark = pytest.mark.faults
ROOT = Path(__file__).resolve().parents[2]
QUICK = ["model=tiny", "gpu=cpu", "eval=none", "calibration.n_samples=4", "calibration.seq_len=64", "seq_len=16",
         "experiment_name=writers"]
BENCH = ["--where", "compressor=asvd", "--point", "1,16", "--rounds", "2", "--warmup", "0", "--iters", "1",
         "--bootstrap", "100", "--no-profile"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store with two records (the baseline and ASVD on tiny, no evaluation), made by real jobs."""
    from gac.jobs.config.command_line import compose_config
    from gac.jobs.run.recipe import run_config

    results = tmp_path_factory.mktemp("writers") / "results"
    for comp in ("none", "asvd"):
        cfg = compose_config([*QUICK, f"results_dir={results}", f"compressor={comp}"])
        run_config(OmegaConf.to_container(cfg, resolve=True))
    return results


def _copy(store: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "results"
    shutil.copytree(store, dst, ignore=shutil.ignore_patterns("wandb", "bench", "runs", "locks"))
    return dst


def gac(args, log: Path, fault: str | None = None, hold: Path | None = None) -> subprocess.Popen:
    """``gac ARGS`` as its own process, stdout and stderr to ``log`` (read while it runs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    env.pop("GAC_FAULT", None)
    if fault:
        env["GAC_FAULT"] = fault
    if hold:
        env["GAC_FAULT_DIR"] = str(hold)
    with open(log, "w") as f:  # the child holds its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "gac.cli", *args], cwd=ROOT, env=env, stdout=f,
                                stderr=subprocess.STDOUT, text=True)


def wait_for(pred, what: str, proc: subprocess.Popen | None = None, log: Path | None = None, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended (rc {proc.returncode}) before {what}:\n"
                                 f"{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    proc.wait(timeout=timeout)
    return log.read_text()


def events(results: Path, key: str) -> list[dict]:
    p = results / "runs" / f"{key}.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def offline_runs(results: Path) -> list[str]:
    """The run ids of the offline W&B runs under the store (what `wandb sync .../offline-run-*` would upload)."""
    return sorted(d.name.rsplit("-", 1)[-1] for d in (results / "wandb").glob("offline-run-*"))


# ------------------------------------------------------------------------------------------------------ gac bench
@pytest.mark.parametrize("force", [False, True], ids=["plain", "forced"])
def test_two_benches_at_once_measure_and_store_one_result(store, tmp_path, force):
    res, hold = _copy(store, tmp_path), tmp_path / "hold"
    args = ["bench", str(res), *BENCH, *(["--force"] if force else [])]
    if force:  # a bench is already stored: a forced one goes beside it, once, however many are started
        r = subprocess.run([sys.executable, "-m", "gac.cli", *args[:-1]], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    before = sorted((res / "bench").glob("*.json")) if force else []
    a = gac(args, tmp_path / "a.log", fault="bench_measure:hold", hold=hold)
    wait_for(lambda: (hold / "held-bench_measure").exists(), "bench A to hold its lock", a, tmp_path / "a.log")
    b = gac(args, tmp_path / "b.log")
    wait_for(lambda: "waiting for it to finish" in (tmp_path / "b.log").read_text(), "bench B to wait", b,
             tmp_path / "b.log")
    assert f"pid {a.pid}" in (tmp_path / "b.log").read_text()  # the holder is named
    (hold / "held-bench_measure").unlink()  # let A measure
    out_a, out_b = finish(a, tmp_path / "a.log"), finish(b, tmp_path / "b.log")
    assert a.returncode == 0 and b.returncode == 0, out_a[-2000:] + out_b[-2000:]
    assert "bench: " in out_a and "bench already measured" not in out_a
    why = "re-measured by an identical forced bench" if force else "measured by the bench"
    assert f"{why} this one waited for" in out_b  # B measured nothing
    stored = sorted((res / "bench").glob("*.json"))
    assert len(stored) == len(before) + 1  # one result, however many benches were started
    new = [p for p in stored if p not in before]
    assert f"bench already measured (force=true measures again): {new[0]}" in out_b  # B shows A's result
    doc = ResultsStore(res).read_bench(path=new[0])
    assert doc["variants"][1]["median_ms"] > 0
    assert not list((res / "locks").glob("bench-*.lock"))


# ------------------------------------------------------------------------------------------- gac wandb backfill
def _wandb_state(res: Path, keys: list[str]) -> dict:
    return {k: [(e["event"], e.get("run_id")) for e in events(res, k) if e["event"] in ("wandb", "wandb_open")]
            for k in keys}


def _one_run_per_record(res: Path, keys: list[str]) -> dict[str, str]:
    """Every record: one wandb_open and one wandb event, naming one run id; one offline run per id. Returns the ids."""
    ids = {}
    for k, evs in _wandb_state(res, keys).items():
        assert [e for e, _ in evs] == ["wandb_open", "wandb"], (k, evs)
        assert evs[0][1] == evs[1][1], (k, evs)
        ids[k] = evs[0][1]
    assert offline_runs(res) == sorted(ids.values())
    return ids


def test_two_backfills_at_once_make_one_run_per_record(store, tmp_path):
    res, hold = _copy(store, tmp_path), tmp_path / "hold"
    keys = sorted(r["key"] for r in ResultsStore(res).iter_records())
    marker = hold / "held-wandb_logged"
    a = gac(["wandb", "backfill", str(res)], tmp_path / "a.log", fault="wandb_logged:hold", hold=hold)
    wait_for(marker.exists, "backfill A to log its first record", a, tmp_path / "a.log")
    b = gac(["wandb", "backfill", str(res)], tmp_path / "b.log")
    wait_for(lambda: "(a job or another W&B backfill); waiting for it" in (tmp_path / "b.log").read_text(),
             "backfill B to wait for the record A holds", b, tmp_path / "b.log")
    while a.poll() is None:  # let A go on at each record it holds
        if marker.exists():
            marker.unlink()
        time.sleep(0.05)
    out_a, out_b = finish(a, tmp_path / "a.log"), finish(b, tmp_path / "b.log")
    assert a.returncode == 0 and b.returncode == 0, out_a[-2000:] + out_b[-2000:]
    ids = _one_run_per_record(res, keys)
    rows = [ln.split()[:2] for ln in (out_a + out_b).splitlines() if ln.split()[:1] in (["logged"], ["has"])]
    assert sorted(k for action, k in rows if action == "logged") == keys  # each record logged by one of them
    assert f"has run   {keys[0]}" in out_b  # B waited for A's first record and found it logged
    assert not list((res / "locks").glob("*.lock"))
    assert len(set(ids.values())) == len(keys)


def test_a_backfill_killed_after_logging_is_resumed_never_logged_twice(store, tmp_path):
    res = _copy(store, tmp_path)
    keys = sorted(r["key"] for r in ResultsStore(res).iter_records())
    a = gac(["wandb", "backfill", str(res)], tmp_path / "a.log", fault="wandb_logged")  # SIGKILL there
    out_a = finish(a, tmp_path / "a.log")
    assert a.returncode == -signal.SIGKILL, out_a[-2000:]
    first = _wandb_state(res, keys)
    assert [e for e, _ in first[keys[0]]] == ["wandb_open"] and first[keys[1]] == []  # logged, never recorded
    run_id = first[keys[0]][0][1]
    assert offline_runs(res) == [run_id]  # the killed run's offline directory, half-written
    assert (res / "locks" / f"{keys[0]}.lock").exists()  # the dead backfill's lock, broken by the next one

    b = gac(["wandb", "backfill", str(res)], tmp_path / "b.log")
    out_b = finish(b, tmp_path / "b.log")
    assert b.returncode == 0, out_b[-2000:]
    assert f"resuming W&B run {run_id}, which a backfill killed on" in out_b
    assert f"logged    {keys[0]}" in out_b and f"(run {run_id})" in out_b
    ids = _one_run_per_record(res, keys)
    assert ids[keys[0]] == run_id  # the same run, resumed; its unfinished offline directory replaced
    assert "2 offline run(s)" in out_b

    c = gac(["wandb", "backfill", str(res)], tmp_path / "c.log")
    out_c = finish(c, tmp_path / "c.log")
    assert c.returncode == 0 and [ln.split()[:2] for ln in out_c.splitlines() if ln.startswith(("has", "logged"))] \
        == [["has", "run"]] * 2, out_c[-2000:]
    assert _one_run_per_record(res, keys) == ids and not list((res / "locks").glob("*.lock"))
