"""``gac doctor``'s compressor-defaults smoke on this CPU: every compressor's own default allocation on tiny, each
reporting the path its stages took (the sensitivity search's layer cache or fallback, the gradient pass's dtype and
zero-gradient fraction, whitening fallbacks), and the judgements made on those paths."""

from __future__ import annotations

import pytest
import torch

from gac.jobs.doctor import runs as doctor_runs

CPU = torch.device("cpu")


def test_the_llm_pruner_default_reports_its_gradient_pass_and_a_bad_path_fails_it(monkeypatch):
    real, seen = doctor_runs.default_paths, []

    def underflowing(prepared):  # the real paths, then the gradient pass as a broken fp16 backward would leave it
        out = real(prepared)
        seen.append({**out, "gradients": dict(out["gradients"])})
        out["gradients"]["zero_fraction"] = 0.5
        return out

    monkeypatch.setattr(doctor_runs, "default_paths", underflowing)
    (c,) = doctor_runs.default_checks(CPU, compressors=("llm_pruner",))  # one run: about 15 s on the loaded CPU
    (paths,) = seen
    assert paths["allocation"] == "uniform" and paths["proxy"] == "taylor"
    assert paths["gradients"]["dtype"] == "float32" and paths["gradients"]["zero_fraction"] == 0.0
    assert c.status == "FAIL" and c.detail.startswith("50% of the weight gradients were exactly zero in float32")
    d = c.data
    assert d["dtype"] == "float32" and d["ppl_compressed"] < doctor_runs.MAX_PPL_GROWTH * d["ppl_dense"]


@pytest.mark.slow
def test_every_compressor_default_on_tiny():  # about 3 minutes on the loaded 2-core CPU, seconds on a GPU
    checks = {c.name: c for c in doctor_runs.default_checks(CPU)}
    assert list(checks) == [f"default {c}" for c in doctor_runs.DEFAULT_COMPRESSORS]
    assert all(c.status == "PASS" for c in checks.values()), [c.line() for c in checks.values()]
    asvd = checks["default asvd"].data
    assert asvd["allocation"] == "sensitivity" and asvd["sensitivity"]["path"] == "layer_cache"
    assert "search: layer cache" in checks["default asvd"].detail
    assert checks["default palu"].data["gradients"]["dtype"] == "float32"
    assert checks["default svd_llm"].data["allocation"] == "uniform" and "gradients" not in checks["default svd_llm"].data


def _paths(**kw):
    base = {"allocation": "sensitivity", "proxy": "activation", "whitening_fallbacks": []}
    return {**base, **kw}


def test_judgements_on_the_paths():
    ok = _paths(sensitivity={"path": "layer_cache", "rel_diff": 1e-4, "tolerance": 2e-3, "dtype": "float16"})
    assert doctor_runs.judge_paths(ok) == []
    assert "search: layer cache (check 1.0e-04 <= 2.0e-03 float16)" in doctor_runs._describe_paths(ok)
    fell = _paths(sensitivity={"path": "full_forward", "why": "the layer-cached perplexity differs"})
    (p,) = doctor_runs.judge_paths(fell)
    assert "layer-cache check failed here (the layer-cached perplexity differs)" in p and "2x" in p
    grads = {"dtype": "float16", "model_dtype": "float16", "loss_scale": None, "overflow_reruns": 0,
             "zero_fraction": 0.03}
    (p,) = doctor_runs.judge_paths(_paths(allocation="uniform", gradients=grads))
    assert p.startswith("3% of the weight gradients were exactly zero in float16")
    grads.update(dtype="bfloat16", zero_fraction=0.0)
    assert doctor_runs.judge_paths(_paths(gradients=grads)) == []
    assert "gradients: bfloat16 (model float16), 0% zero" in doctor_runs._describe_paths(_paths(gradients=grads))
    grads.update(dtype="float16", loss_scale=32768.0, overflow_reruns=2)
    assert "loss scale 32768 after 2 overflow(s)" in doctor_runs._describe_paths(_paths(gradients=grads))
