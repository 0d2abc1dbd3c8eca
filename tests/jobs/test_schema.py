"""The typed config (gac.jobs.config.schema): Hydra checks types at composition, validate_config checks plain dicts."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from gac.errors import GacError
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config
from gac.jobs.config.schema import GacConfig, validate_config
from gac.jobs.config.spec import EvalSpec


def _cfg(*overrides):
    return OmegaConf.to_container(compose_config(list(overrides)), resolve=True)


def test_the_eval_group_is_the_job_eval_spec():
    """One dataclass: a hand-typed dict and a composed config get the same eval defaults, hence the same key."""
    (field,) = [f for f in dataclasses.fields(GacConfig) if f.name == "eval"]
    assert field.type in (EvalSpec, "EvalSpec")
    got = OmegaConf.to_container(OmegaConf.structured(GacConfig).eval)
    assert got == {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(EvalSpec()).items()}


def test_the_schema_is_in_hydras_config_store():
    from hydra.core.config_store import ConfigStore

    compose_config([])
    assert ConfigStore.instance().load("gac_schema.yaml").node._metadata.object_type is GacConfig


@pytest.mark.parametrize("overrides,msg", [
    (["align.window=abc"], "align.window=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["ratio=abc"], "Value 'abc' of type 'str' could not be converted to Float"),
    (["eval.limit=many"], "could not be converted to Integer"),
    (["align.windw=2"], "did you mean 'align.window'"),
])
def test_hydra_checks_types_when_composing(overrides, msg):
    with pytest.raises(GacError, match=msg):
        compose_config(overrides)


def test_a_misspelt_key_suggests_the_key_not_adding_the_typo():
    with pytest.raises(GacError) as e:
        compose_config(["align.windw=2"])
    assert "'align.window'" in str(e.value) and "+align.windw" not in str(e.value)


@pytest.mark.parametrize("path,value,msg", [
    ("align.unit", True, "config: align.unit: alignment unit must be a positive multiple of 8"),  # an Any: a name too
    ("align.unit", "abc", "config: align.unit: unknown alignment unit 'abc'; give a multiple of 8"),
    ("seq_len", "long", "config: seq_len: Value 'long'"),
    ("eval.latency_seq_lens", ["a"], r"config: eval.latency_seq_lens\[0\]"),
    ("eval.taks", [], r"unknown key 'eval.taks'; did you mean 'eval.tasks'"),
    ("logger.wandb", {"projct": "x"}, "did you mean 'logger.wandb.project'"),
    ("align.unit", 0, "align.unit must be a positive integer"),  # the range check stays in spec_from_config
])
def test_plain_dicts_are_checked_against_the_schema(path, value, msg):
    cfg = _cfg("logger=wandb")
    parent, _, leaf = path.rpartition(".")
    node = cfg
    for p in parent.split(".") if parent else []:
        node = node[p]
    node[leaf] = value
    with pytest.raises(GacError, match=msg):
        spec_from_config(cfg)


def test_added_key_in_a_group_is_refused_but_top_level_labels_are_free():
    with pytest.raises(GacError, match="unknown key 'align.windw'"):
        spec_from_config(_cfg("+align.windw=2"))
    assert spec_from_config(_cfg("+my_label=x")).key == spec_from_config(_cfg()).key


def test_strings_that_are_numbers_convert_and_keep_the_key():
    cfg = _cfg()
    key = spec_from_config(cfg).key
    cfg["align"]["unit"] = "8"
    cfg["ratio"] = "0.15"
    assert spec_from_config(cfg).key == key
    del cfg["model"]["name"]
    with pytest.raises(GacError, match="missing key 'model.name'"):
        validate_config(cfg)
