"""eval.ppl_stride: the GAC authors' sliding-window perplexity as a job option, named for what it is."""

import pytest
from omegaconf import OmegaConf

from gac.analysis.labels import method_label, metric_label
from gac.errors import GacError
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config
from gac.metrics import is_ppl, ppl_metric, ppl_stride


def _spec(*overrides):
    return spec_from_config(OmegaConf.to_container(compose_config(["model=tiny", *overrides]), resolve=True))


def test_no_stride_keeps_every_key_and_a_stride_is_another_job():
    plain = _spec()
    assert plain.eval.ppl_stride is None and "ppl_stride" not in plain.identity()["eval"]
    assert _spec("eval.ppl_stride=null").key == plain.key
    strided = _spec("eval.ppl_stride=1024")
    assert strided.eval.ppl_stride == 1024 and strided.key != plain.key


@pytest.mark.parametrize("override,msg", [("eval.ppl_stride=0", "eval.ppl_stride must be an integer >= 1"),
                                          ("eval.ppl_stride=300", "longer than eval.ppl_seq_len=256")])
def test_bad_strides_fail_with_the_config(override, msg):
    with pytest.raises(GacError, match=msg):
        _spec("eval=quick", override)


def test_a_stride_past_the_models_window_fails_before_any_work():
    from gac.jobs.run.preflight import check_job_here

    check_job_here(_spec("eval.ppl_stride=1024"))  # tiny's window: 2048 capped at its 1024 positions
    with pytest.raises(GacError, match="longer than the perplexity window of model tiny \\(1024 tokens\\)"):
        check_job_here(_spec("eval.ppl_stride=1500"))


def test_a_strided_perplexity_has_its_own_name_and_label():
    assert ppl_metric("wikitext2") == "ppl_wikitext2"
    name = ppl_metric("wikitext2", 1024)
    assert name == "ppl_wikitext2_stride1024" and is_ppl(name) and ppl_stride(name) == ("wikitext2", 1024)
    assert ppl_stride("ppl_tiny") == ("tiny", None)
    assert metric_label(name) == "PPL (wikitext2, sliding window, stride 1024)"
    assert metric_label("ppl_tiny") == "PPL (tiny)"


def test_the_authors_rows_say_so_and_never_call_stable_rank_svd_asvd():
    assert method_label("stable_rank_svd", "authors_dp") == "Stable-rank SVD (GAC DP, as the authors ran it)"
    assert method_label("stable_rank_svd", "unaligned") == "Stable-rank SVD (as the authors ran it)"
    assert method_label("llm_pruner", "round_to") == "LLM-Pruner (round_to, as the authors ran it)"
    assert method_label("asvd", "gac") == "ASVD (GAC)" and method_label("llm_pruner", "unaligned") == "LLM-Pruner"
    assert "ASVD" not in method_label("stable_rank_svd", "authors_dp")
