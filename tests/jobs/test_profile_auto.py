"""``gpu.profile=auto`` on a GPU with published data: a profile found without measuring (cached on this node or
shipped for the device) is the one the job uses, with its ``used`` note; nothing is measured after it."""

from dataclasses import replace

import gac.profiling as profiling
from gac.errors import GacError
from gac.jobs.config.build import job_from_config
from gac.jobs.run.recipe import candidate_filter


def _spec(make_cfg):
    return replace(job_from_config(make_cfg("compressor=asvd")).spec, gpu="a100", profile="auto", use_profile=True,
                   allow_profile_mismatch=True)  # the profile below is the A100's; this test runs on a CPU


def test_a_profile_found_without_measuring_is_used(make_cfg, monkeypatch):
    calls = []
    from gac.profiling.published import published_profile

    found = published_profile("a100")

    def sweep(*a, measure=True, **k):
        calls.append(measure)
        return found

    monkeypatch.setattr(profiling, "dimension_sweep", sweep)
    filt, profile = candidate_filter(_spec(make_cfg), [], None)
    assert calls == [False]  # looked up once, never measured
    assert profile is found and "shipped for this device" in profile.meta["used"]
    assert isinstance(filt, profiling.ProfileFilter)


def test_without_one_the_published_data_are_used(make_cfg, monkeypatch):
    calls = []

    def sweep(*a, measure=True, **k):
        calls.append(measure)
        raise GacError("no profile cached or shipped")

    monkeypatch.setattr(profiling, "dimension_sweep", sweep)
    filt, profile = candidate_filter(_spec(make_cfg), [], None)
    assert calls == [False] and "published a100 kernel data" in profile.meta["used"]
