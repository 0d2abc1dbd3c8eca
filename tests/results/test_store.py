"""The store's file discipline: one record per key, corrupt records named, umask honoured, crash leftovers cleaned,
a full or read-only disk reported in one line with nothing left behind."""

import errno
import json
import os
import subprocess
import sys
import time

import pytest

from gac.errors import GacError
from gac.io import clean_temp_files, temp_path, write_json_atomic
from gac.results import ResultsStore
from gac.results.store import CorruptRecord

REC = {"job": {"model": "tiny", "compressor": "asvd", "strategy": "gac"}, "metrics": {"ppl": 1.0}}


def test_one_record_per_key_and_reruns_go_beside(tmp_path):
    store = ResultsStore(tmp_path)
    first = store.write_record("k1", REC, rerun=False)
    again = store.write_record("k1", {**REC, "metrics": {"ppl": 2.0}}, rerun=False)
    assert again == first and store.read_record("k1")["metrics"] == {"ppl": 1.0}  # kept, not duplicated
    rerun = store.write_record("k1", {**REC, "metrics": {"ppl": 3.0}}, rerun=True)
    assert rerun.name.startswith("k1.rerun-") and len(store.record_paths("k1")) == 2
    assert store.status("k1") == "done"


@pytest.mark.parametrize("content,why", [("{not json", "not valid JSON"), ("[1, 2]", "not a record object"),
                                         ('{"key": "other", "status": "completed", "job": {}}', "has key 'other'"),
                                         ('{"key": "k1", "status": "failed", "job": {}}', "has status 'failed', not 'completed'")])
def test_corrupt_record_is_named_not_done(tmp_path, content, why):
    store = ResultsStore(tmp_path)
    store.records_dir.mkdir(parents=True)
    store.record_path("k1").write_text(content)
    assert store.status("k1") == "corrupt"
    with pytest.raises(CorruptRecord, match=why) as e:
        store.read_record("k1")
    assert "move it aside" in str(e.value) and str(store.record_path("k1")) in str(e.value)


def test_require_refuses_what_is_not_a_store(tmp_path):
    with pytest.raises(GacError, match="does not exist"):
        ResultsStore(tmp_path / "typo").require()
    (tmp_path / "empty").mkdir()
    with pytest.raises(GacError, match="is not a gac results store"):
        ResultsStore(tmp_path / "empty").require()
    store = ResultsStore(tmp_path / "real")
    store.prepare_for_writing()
    assert store.require() is store and (store.root / ".gac-store.json").is_file()


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_files_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        store = ResultsStore(tmp_path)
        rec = store.write_record("k1", REC)
        fail = store.write_failure("k1", {"error": "x"})
    finally:
        os.umask(old)
    assert rec.stat().st_mode & 0o777 == mode
    assert fail.stat().st_mode & 0o777 == mode


def test_leftover_temp_files_of_dead_writers_are_removed_live_ones_kept(tmp_path):
    store = ResultsStore(tmp_path)
    store.records_dir.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    mine = temp_path(store.record_path("k1"))  # this (live) process's
    theirs = mine.with_name(mine.name.replace(f".{os.getpid()}.", f".{dead_pid}."))
    cache = store.cache_dir / "prepared"
    cache.mkdir(parents=True)
    big = temp_path(cache / "abc.safetensors")
    big = big.with_name(big.name.replace(f".{os.getpid()}.", f".{dead_pid}."))
    other_host = store.records_dir / ".k2.json.node-9-4026531836.77.0123abcd.tmp"
    legacy = store.records_dir / ".k3.json.ab_cd123.tmp"  # gac <= 0.2 (mkstemp): no pid, judged by age
    for f in (mine, theirs, big, other_host, legacy):
        f.write_text("{}")
    old = time.time() - 7 * 3600
    os.utime(legacy, (old, old))
    removed = set(store.clean_leftovers())
    assert removed == {theirs, big, legacy}
    assert mine.exists() and other_host.exists()  # a live writer here, and one we cannot judge (fresh, elsewhere)
    os.utime(other_host, (old, old))
    assert clean_temp_files(store.records_dir) == [other_host]


def test_a_full_disk_leaves_nothing_behind(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(GacError, match="No space left on device; the disk is full") as e:
        write_json_atomic(tmp_path / "r.json", {"a": 1})
    assert "\n" not in str(e.value)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert list(tmp_path.iterdir()) == []


def test_record_write_on_a_real_full_file_system(small_fs):
    """A tmpfs of 256 KiB filled up: the record write fails in one line and leaves no temp file."""
    store = ResultsStore(small_fs)
    filler = small_fs / "filler"
    with open(filler, "wb") as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    with pytest.raises(GacError, match="disk is full"):
        store.write_record("k1", {**REC, "pad": "x" * 100_000})
    with pytest.raises(GacError, match="disk is full"):
        store.prepare_for_writing()
    assert [p.name for p in small_fs.rglob("*") if p.is_file()] == ["filler"]


def test_read_only_store_fails_before_any_work(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                          capture_output=True).returncode:
            pytest.skip("a read-only directory for root needs a read-only mount")
    else:
        ro.chmod(0o555)
    try:
        with pytest.raises(GacError, match="read-only|permission denied") as e:
            ResultsStore(ro / "results").prepare_for_writing()
        assert "\n" not in str(e.value)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        else:
            ro.chmod(0o755)


def test_iter_records_skips_temp_files(tmp_path):
    store = ResultsStore(tmp_path)
    store.write_record("k1", REC)
    (store.records_dir / ".k2.json.vm-1.1.00000000.tmp").write_text(json.dumps({**REC, "key": "k2"}))
    assert [r["key"] for r in store.iter_records()] == ["k1"]
