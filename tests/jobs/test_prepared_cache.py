"""The prepared-state cache hands ASVD's sensitivity search a resume file keyed like its entry, and drops the file
once the entry is written (a requeued job then loads the entry; until then it resumes the search; the search's
resume itself: tests/compression/test_sensitivity_resume.py)."""

from __future__ import annotations

from gac.jobs.run import prepared_cache as PC
from gac.jobs.config.build import spec_from_config


class _Saved:
    timings: dict = {}

    def __init__(self, fail=False):
        self.fail = fail

    def save(self, path):
        if self.fail:
            raise OSError("disk full")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("entry")


def test_the_resume_file_is_keyed_by_the_entry_and_dropped_after_it_is_written(make_cfg, monkeypatch, tmp_path):
    spec = spec_from_config(make_cfg("compressor=asvd"))
    cache = tmp_path / "cache"
    key = PC.prepared_cache_key(spec)
    expect = cache / "prepared" / f"{key}.sensitivity-rows.json"
    assert PC.sensitivity_resume_path(cache / "prepared" / f"{key}.safetensors") == expect
    seen = []

    def fake(spec_, model, tok, resume=None, sensitivity_limit_s=None, fail=False):
        seen.append(resume)
        resume.parent.mkdir(parents=True, exist_ok=True)
        resume.write_text("{}")  # rows of a search in progress
        return _Saved(fail)

    monkeypatch.setattr(PC, "_prepare", lambda *a: fake(*a, fail=True))
    PC.prepare_cached(spec, None, None, cache)
    assert seen == [expect] and expect.exists()  # no entry written: the rows stay for the next attempt
    monkeypatch.setattr(PC, "_prepare", fake)
    monkeypatch.setattr(PC, "_load_prepared", lambda *a: None)
    PC.prepare_cached(spec, None, None, cache)
    assert seen == [expect, expect] and not expect.exists()  # the entry holds the table now
    # force=true: a fresh search, not the rows of an earlier one
    expect.write_text("{}")
    monkeypatch.setattr(PC, "_prepare", lambda *a: seen.append(a[3].exists()) or _Saved())
    PC.prepare_cached(spec, None, None, cache, refresh=True)
    assert seen[-1] is False
