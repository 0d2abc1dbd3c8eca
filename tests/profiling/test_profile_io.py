"""HardwareProfile round trip, versioning, corrupt files and device checks."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from gac.errors import GacError
from gac.profiling import FORMAT_VERSION, HardwareProfile, ProfileFilter, load_profile
from tests.profiling.synthetic import GPU, gemm_rows, profile_of, sdpa_rows


@pytest.fixture
def prof():
    rows = sdpa_rows(range(64, 80)) + gemm_rows("K", range(64, 80))
    rows[3]["supported"] = False
    rows[3]["latency_ms"] = None
    rows[5]["M"], rows[5]["N"] = 2048, 2048
    return profile_of(rows)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_round_trip(tmp_path, prof, fmt):
    prof.save(tmp_path / "p", fmt=fmt)
    back = HardwareProfile.load(tmp_path / "p")
    assert back == prof
    pd.testing.assert_frame_equal(back.table, prof.table)
    assert back.meta["format_version"] == FORMAT_VERSION
    assert back.meta["device_name"] == GPU
    assert HardwareProfile.load(tmp_path / "p" / "profile.json") == prof  # the JSON path works too


def _saved(tmp_path, prof):
    d = tmp_path / "p"
    prof.save(d)
    return d


def test_corrupt_json(tmp_path, prof):
    d = _saved(tmp_path, prof)
    (d / "profile.json").write_text("{ not json")
    with pytest.raises(GacError, match="corrupt hardware profile.*JSON"):
        HardwareProfile.load(d)


def test_truncated_table(tmp_path, prof):
    d = _saved(tmp_path, prof)
    data = (d / "table.parquet").read_bytes()
    (d / "table.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(GacError, match="checksum"):
        HardwareProfile.load(d)


def test_unreadable_table_without_checksum(tmp_path, prof):
    d = _saved(tmp_path, prof)
    meta = json.loads((d / "profile.json").read_text())
    del meta["table_sha256"]
    (d / "profile.json").write_text(json.dumps(meta))
    (d / "table.parquet").write_bytes(b"garbage")
    with pytest.raises(GacError, match="cannot read table.parquet"):
        HardwareProfile.load(d)


def test_missing_table_and_dir(tmp_path, prof):
    d = _saved(tmp_path, prof)
    (d / "table.parquet").unlink()
    with pytest.raises(GacError, match="table file 'table.parquet' is missing"):
        HardwareProfile.load(d)
    with pytest.raises(GacError, match="no hardware profile"):
        HardwareProfile.load(tmp_path / "nowhere")


def test_other_version_and_format(tmp_path, prof):
    d = _saved(tmp_path, prof)
    meta = json.loads((d / "profile.json").read_text())
    (d / "profile.json").write_text(json.dumps(dict(meta, format_version=99)))
    with pytest.raises(GacError, match="format version 99"):
        HardwareProfile.load(d)
    (d / "profile.json").write_text(json.dumps(dict(meta, format="something-else")))
    with pytest.raises(GacError, match="not a gac hardware profile"):
        HardwareProfile.load(d)


def test_missing_columns(tmp_path, prof):
    d = tmp_path / "p"
    prof.save(d, fmt="csv")
    t = pd.read_csv(d / "table.csv").drop(columns=["latency_ms"])
    t.to_csv(d / "table.csv", index=False)
    meta = json.loads((d / "profile.json").read_text())
    del meta["table_sha256"]
    (d / "profile.json").write_text(json.dumps(meta))
    with pytest.raises(GacError, match="lacks columns \\['latency_ms'\\]"):
        HardwareProfile.load(d)


def test_device_mismatch_refused_unless_overridden(tmp_path, prof, caplog):
    d = _saved(tmp_path, prof)
    with pytest.raises(
        GacError, match="measured on 'Synthetic GPU 80GB' but the job runs on 'NVIDIA H100 80GB HBM3'"
    ):
        load_profile(d, device="NVIDIA H100 80GB HBM3")
    with pytest.raises(GacError, match="allow_device_mismatch"):
        ProfileFilter(prof, device="NVIDIA H100 80GB HBM3")
    with caplog.at_level("WARNING"):
        assert load_profile(d, device="NVIDIA H100 80GB HBM3", allow_device_mismatch=True) == prof
    assert "another device" in caplog.text
    assert load_profile(d, device="synthetic gpu  80GB") == prof  # case and spacing do not matter
    with pytest.raises(GacError, match="measured on 'Synthetic GPU 80GB'"):
        load_profile(d, device="cpu")  # this machine's CPU is not that GPU


def test_merge_replaces_repeated_rows(prof):
    other = profile_of(gemm_rows("K", range(70, 90)))
    merged = prof.merged(other)
    k = merged.sweep("gemm_K")
    assert k["dim"].tolist() == list(range(64, 90))
    with pytest.raises(GacError):
        prof.merged(profile_of(gemm_rows("K"), device_name="Other GPU"))
