"""``gac evaluate`` is the recipe from a checkpoint and ``gac compress`` loads as a job does: every flag of
``gac evaluate`` is a setting of the Job's EvalSpec, the model comes from ``Recipe.load`` (``--no-verify`` included)
and the measurement from ``Recipe.evaluate`` with the one set of arguments a job's EvalSpec gives; a command
without ``--dtype`` loads the model in its own dtype, as ``gac.models.load_model(dtype=None)`` does."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch

from gac.errors import GacError


def _args(argv):
    from gac.commands import evaluate

    p = argparse.ArgumentParser()
    evaluate.add_arguments(p)
    return p.parse_args(argv)


def test_every_flag_of_gac_evaluate_is_a_setting_of_the_job(tmp_path):
    from gac.commands import evaluate
    from gac.jobs.run.recipe import evaluation_arguments

    piqa = tmp_path / "piqa.jsonl"
    piqa.write_text("")  # named, not read: the Job names its file
    args = _args(["tiny", "--ppl", "--tasks", "piqa", "--latency", "--seq-len", "64", "--ppl-windows", "3",
                  "--batch-size", "4", "--limit", "10", "--latency-batch", "2", "--decode-tokens", "8",
                  "--decode-prompt", "16", "--warmup", "0", "--iters", "2", "--trials", "1", "--dtype", "bf16"])
    spec = evaluate.evaluate_job(args, ["piqa"], "tiny", {"piqa": str(piqa)}, max_len=1024).spec
    ev = spec.eval
    assert (ev.ppl, ev.tasks, ev.latency) == (True, ("piqa",), True)
    assert (ev.ppl_seq_len, ev.ppl_max_windows, ev.batch_size, ev.limit) == (64, 3, 4, 10)
    assert (ev.latency_batch, ev.latency_seq_lens, ev.decode_tokens, ev.decode_prompt) == (2, (64,), 8, 16)
    assert (ev.warmup, ev.iters, ev.trials, spec.seq_len, spec.dtype) == (0, 2, 1, 64, "bfloat16")
    kw = evaluation_arguments(spec)  # what the evaluation is given: the request, and nothing of its own
    assert kw["ppl_source"] == "tiny" and kw["task_files"] == {"piqa": str(piqa)}
    assert (kw["ppl_seq_len"], kw["ppl_max_windows"], kw["ppl_batch_size"], kw["task_batch_size"]) == (64, 3, 4, 4)
    assert (kw["latency_points"], kw["main_point"], kw["decode_batch"]) == ([(2, 64)], (2, 64), 2)
    assert (kw["decode_tokens"], kw["decode_prompt"], kw["warmup"], kw["iters"], kw["trials"]) == (8, 16, 0, 2, 1)


def test_without_seq_len_the_window_and_the_prefill_keep_their_own_defaults():
    from gac.commands import evaluate
    from gac.evaluation.suite import DECODE_PROMPT, EVAL_BATCH_SIZE

    spec = evaluate.evaluate_job(_args(["tiny", "--ppl", "--latency"]), [], "tiny", {}, max_len=512).spec
    # the window: None (2048 capped at the model's maximum, by the evaluation); the prefill: 1024 capped here
    assert (spec.eval.ppl_seq_len, spec.eval.latency_seq_lens, spec.seq_len) == (None, (512,), 512)
    assert (spec.eval.batch_size, spec.eval.decode_prompt, spec.eval.decode_tokens) == (EVAL_BATCH_SIZE,
                                                                                       DECODE_PROMPT, 128)
    assert evaluate.evaluate_job(_args(["tiny", "--latency"]), [], "tiny", {}).spec.seq_len == 1024
    assert spec.dtype is None  # no --dtype: the model's own


def test_the_decode_prompt_at_its_default_leaves_every_key_as_it_was():
    from dataclasses import replace

    from gac.jobs.config.build import spec_from_config
    from gac.jobs.config.command_line import compose_config
    from omegaconf import OmegaConf

    spec = spec_from_config(OmegaConf.to_container(compose_config(["eval.decode_tokens=4"]), resolve=True))
    assert "decode_prompt" not in spec.identity()["eval"]
    other = replace(spec, eval=replace(spec.eval, decode_prompt=64))
    assert other.identity()["eval"]["decode_prompt"] == 64 and other.key != spec.key


def test_gac_evaluate_loads_and_measures_through_the_recipe(monkeypatch, capsys):
    import gac.evaluation.suite as suite
    from gac.cli import main
    from gac.jobs.run import loading

    loads, given = [], {}
    real_load, real_evaluate = loading.load_job_model, suite.evaluate

    def load(spec, reserve=0, verify=True):
        loads.append((spec.model_spec, spec.dtype, verify))
        return real_load(spec, reserve, verify=verify)

    def evaluate(model, tokenizer, **kw):
        given.update(kw)
        return real_evaluate(model, tokenizer, **kw)

    monkeypatch.setattr(loading, "load_job_model", load)
    monkeypatch.setattr(suite, "evaluate", evaluate)
    assert main(["-q", "evaluate", "tiny", "--latency", "--seq-len", "16", "--warmup", "0", "--iters", "1",
                 "--trials", "1", "--decode-tokens", "2", "--decode-prompt", "4", "--no-verify"]) == 0
    assert loads == [("tiny", None, False)]  # the model's own dtype, the checks off as asked
    assert (given["latency_points"], given["decode_tokens"], given["decode_prompt"]) == ([(1, 16)], 2, 4)
    assert "prefill_ms" in capsys.readouterr().out


@pytest.fixture(scope="module")
def bf16_dir(tiny, tmp_path_factory):
    """tiny saved as a Hugging Face directory in bfloat16: a model whose own dtype is not ``auto``'s float32."""
    model, tok = tiny
    d = tmp_path_factory.mktemp("bf16") / "tiny-bf16"
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_a_commands_job_loads_the_model_as_load_model_does(bf16_dir):
    from gac.jobs.config.build import command_config, job_from_config
    from gac.jobs.run.loading import load_job_model
    from gac.models import load_model

    own = job_from_config(command_config(str(bf16_dir))).spec
    assert own.dtype is None
    assert load_job_model(own)[0].dtype == load_model(str(bf16_dir))[0].dtype == torch.bfloat16
    asked = job_from_config(command_config(str(bf16_dir), dtype="fp32")).spec
    assert asked.dtype == "float32" and load_job_model(asked)[0].dtype == torch.float32


def test_gac_compress_loads_through_the_recipe_in_the_models_own_dtype(bf16_dir, tmp_path, monkeypatch):
    from gac.cli import main
    from gac.jobs.run import loading

    loaded = []
    real = loading.load_job_model

    def load(spec, reserve=0, verify=True):
        model, tok = real(spec, reserve, verify=verify)
        loaded.append((spec.dtype, next(model.parameters()).dtype))
        raise GacError("stop after loading")

    monkeypatch.setattr(loading, "load_job_model", load)
    argv = ["compress", str(bf16_dir), "--compressor", "llm_pruner", "--ratio", "0.2", "--calib", "tiny",
            "--calib-samples", "2", "--calib-seq-len", "32"]
    assert main([*argv, "-o", str(tmp_path / "a")]) == 2
    assert main([*argv, "--dtype", "float32", "-o", str(tmp_path / "b")]) == 2
    assert loaded == [(None, torch.bfloat16), ("float32", torch.float32)]
