"""Every entry point builds its Job the same way: ``gac compress``, ``gac evaluate`` and ``gac export`` turn their
flags into a config and build the Job with :func:`gac.jobs.config.build.job_from_config`, as a job does."""

import argparse

import pytest

from gac.errors import GacError


@pytest.fixture
def built(monkeypatch):
    """The configs :func:`job_from_config` was given."""
    import gac.jobs.config.build as config

    seen, real = [], config.job_from_config
    monkeypatch.setattr(config, "job_from_config", lambda cfg, *a, **k: seen.append(cfg) or real(cfg, *a, **k))
    return seen


def _args(module, argv):
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return p.parse_args(argv)


def test_gac_compress_builds_the_job_of_its_flags(tmp_path, built):
    from gac.commands import compress

    args = _args(compress, ["tiny", "--compressor", "asvd", "--ratio", "0.2", "--allocation", "proportional",
                            "--calib-samples", "4", "--seed", "3", "-o", str(tmp_path / "out")])
    compress.validate(args)
    assert len(built) == 1
    spec = args.job.spec
    assert (spec.compressor, spec.ratio, spec.allocation, spec.strategy, spec.use_profile) == (
        "asvd", 0.2, "proportional", "gac", False)
    assert spec.calibration == {"source": "tiny", "n_samples": 4, "seq_len": 256, "seed": 3}
    assert not (spec.eval.ppl or spec.eval.tasks or spec.eval.latency)


def test_gac_compress_refuses_an_unreachable_ratio_by_the_one_rule(tmp_path):
    from gac.commands import compress

    args = _args(compress, ["tiny", "--compressor", "asvd", "--ratio", "0.7", "-o", str(tmp_path / "out")])
    with pytest.raises(GacError, match=r"^--allocation: .*smallest kept ratio is 0.4"):
        compress.validate(args)


def test_gac_evaluate_builds_the_baseline_job_of_its_flags(built):
    from gac.commands import evaluate

    args = _args(evaluate, ["tiny", "--ppl", "--latency"])
    job = evaluate.evaluate_job(args, [], "tiny", {})
    assert len(built) == 1 and job.spec.is_baseline
    assert (job.spec.eval.ppl, job.spec.eval.tasks, job.spec.eval.latency, job.spec.ppl_source) == (
        True, (), True, "tiny")


def test_gac_export_builds_the_job_of_its_checkpoint(tmp_path, built):
    from gac.commands import export

    args = _args(export, ["tiny", "--format", "hf", "-o", str(tmp_path / "hf")])
    export.validate(args)
    assert len(built) == 1
    assert (args.job.spec.model_spec, args.job.spec.dtype, args.job.spec.device) == ("tiny", "float32", "cpu")
