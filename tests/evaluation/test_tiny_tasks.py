"""tiny's PiQA-/HellaSwag-format task files: made deterministically from the shipped test text, distractors are the
perturbations they claim to be, and `gac fixtures build --eval-only` remakes them without touching the model."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from gac.cli import main
from gac.evaluation.tasks import check_local_file
from gac.fixtures import RECIPE, SHIPPED_DIR, model_recipe, recipe_hash, write_task_files
from gac.fixtures import tiny as tiny_mod


def _rows(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_task_files_remade_from_the_shipped_test_text_equal_the_shipped_ones(tmp_path, tiny_files):
    shutil.copy2(tiny_files.wikitext["test"], tmp_path / "test.txt")
    made = write_task_files(tmp_path)
    for task, path in made.items():
        assert path.read_bytes() == tiny_files.task_files[task].read_bytes(), task
        check_local_file(task, path)  # the schema lm-eval's official config needs
    write_task_files(tmp_path)  # twice: same bytes (no hidden state)
    assert all(p.read_bytes() == tiny_files.task_files[t].read_bytes() for t, p in made.items())


def _diff(a: list[str], b: list[str]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


def _is(kind: str, true: str, fake: str, rank_of: dict) -> bool:
    t, f = true.split(), fake.split()
    if len(t) != len(f):
        return False
    d = _diff(t, f)
    if kind in ("swap", "swap_near"):
        gaps = (1,) if kind == "swap" else (2, 3)
        return len(d) == 2 and d[1] - d[0] in gaps and (t[d[0]], t[d[1]]) == (f[d[1]], f[d[0]])
    assert kind == "substitute"
    return len(d) == 1 and t[d[0]] in rank_of and 1 <= abs(rank_of[f[d[0]]] - rank_of[t[d[0]]]) <= 3


def test_every_distractor_is_the_local_perturbation_it_names(tiny_files):
    plays = tiny_mod._plays_from_wikitext(tiny_files.wikitext["test"].read_text(encoding="utf-8"))
    rank_of = {w: i for i, w in enumerate(tiny_mod._word_ranks(plays))}
    piqa, hs = _rows(tiny_files.piqa), _rows(tiny_files.hellaswag)
    assert len(piqa) == RECIPE["eval_items"]["piqa"] and len(hs) == RECIPE["eval_items"]["hellaswag"]
    kinds = {k: 0 for k in tiny_mod.PIQA_KINDS}
    for row in piqa:
        true, fake = (row["sol1"], row["sol2"]) if row["label"] == 0 else (row["sol2"], row["sol1"])
        assert _is(row["distractor"], true, fake, rank_of), row
        kinds[row["distractor"]] += 1
    assert min(kinds.values()) > 0.4 * len(piqa)  # both kinds, about half each
    for row in hs:
        label = int(row["label"])
        assert row["ending_kinds"][label] == "true" and len(set(row["endings"])) == 4
        assert sorted(k for k in row["ending_kinds"] if k != "true") == sorted(tiny_mod.HELLASWAG_KINDS)
        for ending, kind in zip(row["endings"], row["ending_kinds"], strict=True):
            if kind != "true":
                assert _is(kind, row["endings"][label], ending, rank_of), (kind, row)
    labels = [int(r["label"]) for r in hs]
    assert all(0.15 < labels.count(k) / len(labels) < 0.35 for k in range(4))


def _copy_shipped(tmp_path):
    out = tmp_path / "tiny"
    shutil.copytree(SHIPPED_DIR, out)
    return out


def test_eval_only_rebuild_keeps_the_model_and_reproduces_the_task_files(tmp_path, capsys):
    out = _copy_shipped(tmp_path)
    for task in ("piqa", "hellaswag"):
        (out / "eval" / f"{task}.jsonl").write_text('{"stale": 1}\n')
    model_before = _sha(out / "model.safetensors")
    assert main(["fixtures", "build", "--eval-only", "--no-eval", "--out", str(out)]) == 0
    assert "model files unchanged" in capsys.readouterr().out
    assert _sha(out / "model.safetensors") == model_before == _sha(SHIPPED_DIR / "model.safetensors")
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["recipe_hash"] == recipe_hash() and prov["recipe"] == RECIPE
    for rel, digest in prov["files_sha256"].items():
        assert _sha(out / rel) == digest, rel
        assert digest == _sha(SHIPPED_DIR / rel), rel
    assert "eval" not in prov  # --no-eval: no stale trained-vs-untrained summary is left behind


def test_eval_only_rebuild_refuses_a_changed_model_or_a_dir_without_tiny(tmp_path, capsys):
    out = _copy_shipped(tmp_path)
    (out / "tokenizer.json").write_text((out / "tokenizer.json").read_text() + " ")
    assert main(["fixtures", "build", "--eval-only", "--no-eval", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json is missing or differs" in err and "Traceback" not in err
    assert main(["fixtures", "build", "--eval-only", "--out", str(tmp_path / "empty")]) == 2
    assert "no readable tiny provenance.json" in capsys.readouterr().err
    assert main(["fixtures", "build", "--eval-only", "--steps", "2", "--out", str(out)]) == 2
    assert "takes no --steps" in capsys.readouterr().err
    assert main(["fixtures", "info", "--eval-only"]) == 2


def test_eval_only_rebuild_refuses_a_model_from_another_recipe(tmp_path, capsys):
    out = _copy_shipped(tmp_path)
    prov = json.loads((out / "provenance.json").read_text())
    prov["recipe"]["train"]["steps"] = 2
    (out / "provenance.json").write_text(json.dumps(prov))
    assert main(["fixtures", "build", "--eval-only", "--no-eval", "--out", str(out)]) == 2
    assert "another model recipe" in capsys.readouterr().err


def test_stale_task_files_are_remade_into_the_cache_instead_of_retraining(tmp_path, monkeypatch):
    recipe = json.loads(json.dumps(RECIPE))
    recipe["eval_items"]["seed"] += 1
    monkeypatch.setattr(tiny_mod, "RECIPE", recipe)
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "cache"))
    assert model_recipe(recipe) == model_recipe(RECIPE)
    with pytest.raises(Exception, match="neither shipped"):
        tiny_mod.tiny_dir(build_if_missing=False)
    root = tiny_mod.tiny_dir()
    assert root == tmp_path / "cache" / "tiny" / tiny_mod.recipe_hash(recipe)
    assert _sha(root / "model.safetensors") == _sha(SHIPPED_DIR / "model.safetensors")
    assert (root / "eval" / "piqa.jsonl").read_bytes() != (SHIPPED_DIR / "eval" / "piqa.jsonl").read_bytes()
    assert json.loads((root / "provenance.json").read_text())["recipe"] == recipe
    assert tiny_mod.tiny_dir() == root  # the cache entry is found the second time


def test_a_changed_model_recipe_asks_for_a_build_instead_of_training(tmp_path, monkeypatch):
    recipe = json.loads(json.dumps(RECIPE))
    recipe["train"]["steps"] += 1
    monkeypatch.setattr(tiny_mod, "RECIPE", recipe)
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "cache"))
    with pytest.raises(Exception, match="gac fixtures build"):
        tiny_mod.tiny_dir()
    assert not (tmp_path / "cache" / "tiny").exists()
