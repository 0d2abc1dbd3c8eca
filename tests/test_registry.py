"""One registry of names (gac.registry): the job config, the CLI and the implementations read the same names."""

import pytest
from omegaconf import OmegaConf

from gac import registry
from gac.errors import GacError


def test_each_implementation_map_has_exactly_the_registered_names():
    from gac.align.strategies import STRATEGIES
    from gac.compression.allocation import ALLOCATION_CHOICES
    from gac.compression.compressors import COMPRESSORS
    from gac.compression.prepared import KNAPSACK_SCORES
    from gac.compression.proxies import PROXIES

    assert tuple(COMPRESSORS) == registry.COMPRESSORS.names
    assert tuple(STRATEGIES) == registry.STRATEGIES.names
    assert tuple(PROXIES) == registry.PROXIES.names
    assert registry.ALLOCATIONS.names == ALLOCATION_CHOICES
    assert registry.KNAPSACK_SCORES.names == KNAPSACK_SCORES


def test_bind_refuses_a_different_set_of_names():
    with pytest.raises(AssertionError, match="not the registered names"):
        registry.STRATEGIES.bind({"gac": None})


@pytest.mark.parametrize("given", ["svd_llm", "svdllm", "SVD-LLM", "svd-llm"])
def test_compressor_aliases_resolve_the_same_in_the_library_and_the_config(given):
    from gac.compression.compressors import canonical_name
    from gac.jobs.config.command_line import compose_config
    from gac.jobs.config.build import spec_from_config

    assert canonical_name(given) == registry.COMPRESSORS.resolve(given) == "svd_llm"
    cfg = OmegaConf.to_container(compose_config(["model=tiny", "compressor=svd_llm", f"compressor.name={given}"]),
                                 resolve=True)
    spec = spec_from_config(cfg)
    assert spec.compressor == "svd_llm"
    cfg["compressor"]["name"] = "svd_llm"
    assert spec_from_config(cfg).key == spec.key  # an alias names the same point


def test_unknown_names_suggest_close_ones_with_where_they_came_from():
    with pytest.raises(GacError, match=r"unknown strategy \(--strategy\) 'gca'; did you mean 'gac'\? known: "):
        registry.STRATEGIES.resolve("gca", "(--strategy)")
    with pytest.raises(GacError, match=r"unknown compressor 'asdv'; did you mean 'asvd'\? known: .*none"):
        registry.COMPRESSORS.resolve("asdv", extra=["none"])


def test_listing_reads_as_prose():
    assert registry.COMPRESSORS.listing() == "asvd, svd_llm, llm_pruner, palu or stable_rank_svd"
