"""Config values checked with the rest, before any work (issue 23): each used to fail after loading or compressing,
or to be accepted. The catalogue (docs/bad-input.md) runs the headline cases through experiments/run.py; these run
the same checks in-process (compose, spec_from_config, check_job_here) for the rest of the family."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from gac.errors import GacError
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config
from gac.jobs.run.preflight import check_job_here
from gac.jobs.sweep.points import sweep_points


def _check(overrides):
    spec = spec_from_config(OmegaConf.to_container(compose_config(list(overrides)), resolve=True))
    check_job_here(spec, list(overrides))
    return spec


@pytest.mark.parametrize(("overrides", "msg"), [
    (["eval.ppl_seq_len=1"], "eval.ppl_seq_len must be an integer >= 2 or null"),
    (["eval.ppl_seq_len=4096"], "eval.ppl_seq_len=4096 is above the maximum sequence length of model tiny (1024"),
    (["eval.batch_size=0"], "eval.batch_size must be an integer >= 1"),
    (["eval.latency_batch=0"], "eval.latency_batch must be an integer >= 1"),
    (["eval.iters=0"], "eval.iters must be an integer >= 1 or null"),
    (["eval.trials=0"], "eval.trials must be an integer >= 1 or null"),
    (["eval.warmup=-1"], "eval.warmup must be an integer >= 0 or null"),
    (["eval.decode_tokens=-1"], "eval.decode_tokens must be an integer >= 0"),
    (["eval.decode_tokens=2000"], "eval.decode_prompt + eval.decode_tokens=2128 is above"),
    (["eval.latency_seq_lens=[0]"], "eval.latency_seq_lens[0] must be an integer >= 1"),
    (["eval.latency_batches=[[0,1024]]"], "eval.latency_batches[0] must be a pair [batch, seq_len]"),
    (["eval.latency_batches=[[4,5000]]"], "eval.latency_batches=5000 is above the maximum sequence length"),
    (["calibration.seq_len=1"], "calibration.seq_len must be an integer >= 2"),
    (["experiment_name="], "config: experiment_name is empty"),
    (["model.spec=/etc/hostname"], "config: model.spec: '/etc/hostname' is a file"),
    (["model.ppl_source=/dev/null"], "model.ppl_source '/dev/null' is not a regular file"),
    (["gpu.device=cuda:99"], "or use gpu=cpu here"),
])
def test_config_values_fail_before_any_work(overrides, msg):
    with pytest.raises(GacError) as e:
        _check(overrides)
    assert msg in str(e.value)


def test_text_sources_are_read_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "bin.txt").write_bytes(bytes(range(256)))
    with pytest.raises(GacError, match="calibration.source .* is not UTF-8 text"):
        _check([f"calibration.source={tmp_path / 'bin.txt'}"])
    with pytest.raises(GacError, match="model.ppl_source .* is not UTF-8 text"):
        _check([f"model.ppl_source={tmp_path / 'bin.txt'}"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # offline and not cached: named with what else is missing and the command that fetches it (gac.jobs.run.inputs)
    with pytest.raises(GacError, match=r"the hub is not reachable here \(HF_HUB_OFFLINE is set\) and the caches lack "
                                       r"what this job reads: dataset Salesforce/wikitext \(wikitext-2-raw-v1, train\): "
                                       r"not in the datasets cache; .*: gac fetch calibration.source=wikitext2$"):
        _check(["calibration.source=wikitext2"])
    # the baseline does not calibrate: its calibration source is not read
    _check(["compressor=none", f"calibration.source={tmp_path / 'bin.txt'}", "eval.tasks=[]"])


@pytest.mark.parametrize(("overrides", "msg"), [
    (["ratio=0.1,0.2"], "0.1,0.2 sweeps ratio: add -m"),
    (["eval.latency_seq_lens=1024"], "write 'eval.latency_seq_lens=[1024]'"),
    ([" ratio=0.2"], "has spaces around it"),
    (["results_dir=/tmp/a(b)"], "must be quoted for Hydra inside shell quotes"),
])
def test_hydra_syntax_errors_name_the_fix(overrides, msg):
    with pytest.raises(GacError) as e:
        compose_config(overrides)
    assert msg in str(e.value)


def test_a_group_glob_expands_for_status_and_sweeps():
    points = sweep_points(["compressor=glob(*,exclude=none)", "align=glob(round_*)"])
    got = {tuple(p["overrides"]) for p in points}
    # every compressor but none (5) x round_down, round_nearest, round_to, round_up
    assert len(got) == 5 * 4
    assert ("compressor=palu", "align=round_up") in got and ("compressor=stable_rank_svd", "align=round_to") in got
    with pytest.raises(GacError, match="matches none of the compressor options"):
        sweep_points(["compressor=glob(zz*)"])
