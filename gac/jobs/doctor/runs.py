"""``gac doctor``'s runs on the embedded tiny (the slow part of the doctor, seconds on a GPU):

* ``smoke``: compress (ASVD + gac) -> save and reload the checkpoint -> perplexity and prefill latency -> the
  side-by-side bench of the baseline and the compressed plan;
* ``default <compressor>``: every compressor's own default allocation and proxy in the device's dtype, each reporting
  the path its stages took (:func:`default_paths`) and judged on it (:func:`judge_paths`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence

from gac.jobs.doctor.check import Check
from gac.jobs.doctor.check import guard as _guard
from gac.registry import BASELINE_LABEL


def smoke_check(dev, dtype: str | None = None, workdir: str | None = None) -> Check:
    """tiny on ``dev``: compress (ASVD + gac, ratio 0.15) -> checkpoint -> reload -> perplexity and prefill latency
    of the baseline and the compressed model -> the side-by-side bench of both."""
    name = "smoke (tiny)"

    def run():
        import torch

        from gac.compression.calibration import Calibration
        from gac.compression.checkpoint import save_checkpoint
        from gac.compression.compress import compress_model
        from gac.compression.structure import Structure, architecture
        from gac.dtypes import dtype_name
        from gac.evaluation.bench import Protocol, Variant, run_bench
        from gac.evaluation.latency import prefill_latency
        from gac.evaluation.perplexity import perplexity
        from gac.models import load_model

        dt = dtype_name(dtype or "auto", dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)  # the smoke's own peak, not the SDPA checks'
        t0 = time.perf_counter()
        times = {}
        model, tok = load_model("tiny", dtype=dt, device=str(dev))
        base_ppl = perplexity(model, tok, "tiny", seq_len=128, batch_size=4, max_windows=8)["ppl"]
        t = time.perf_counter()
        model, plan, _ = compress_model(model, tok, "asvd", 0.15, "gac", allocation="proportional",
                                        calibration=Calibration("tiny", 4, 128, 0))
        times["compress_s"] = time.perf_counter() - t
        with tempfile.TemporaryDirectory(dir=workdir) as d:
            save_checkpoint(model, tok, os.path.join(d, "ck"))
            del model
            model, tok = load_model(os.path.join(d, "ck"), device=str(dev))
        t = time.perf_counter()
        ppl = perplexity(model, tok, "tiny", seq_len=128, batch_size=4, max_windows=8)["ppl"]
        lat = prefill_latency(model, seq_len=128, warmup=2, iters=5, trials=2)
        times["evaluate_s"] = time.perf_counter() - t
        t = time.perf_counter()
        config = architecture("tiny")
        variants = [Variant(BASELINE_LABEL, Structure(config, dt)), Variant("ASVD (GAC)", Structure(
            config, dt, "asvd", {}, {k: int(v) for k, v in plan.dims.items()}))]
        doc = run_bench(variants, Protocol(points=((1, 128),), rounds=3, warmup=1, iters=3, top=1), str(dev))
        times["bench_s"] = time.perf_counter() - t
        times["total_s"] = time.perf_counter() - t0
        ratio = doc["variants"][1]["ratio_to_baseline"]
        data = {"dtype": dt, "ppl_baseline": base_ppl, "ppl_compressed": ppl, "prefill_ms": lat["median_ms"],
                "sdpa_backend": lat["sdpa_backend"], "bench_ratio": ratio, "aligned_fraction": plan.aligned_fraction,
                "timer": lat["timer"], "gpu_peak_mb": None, **times}
        if dev.type == "cuda":
            data["gpu_peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
        detail = (f"{dt}: compress {times['compress_s']:.1f} s, PPL {base_ppl:.1f} -> {ppl:.1f}, prefill "
                  f"{lat['median_ms']:.2f} ms ({lat['timer']}, sdpa {','.join(lat['sdpa_backend'])}), bench ratio "
                  f"{ratio:.3f}, {times['total_s']:.0f} s in all")
        import math

        if not (math.isfinite(ppl) and ppl < 1.5 * base_ppl):
            return Check(name, "FAIL", f"the compressed tiny's perplexity {ppl:.1f} is far above the baseline's "
                                       f"{base_ppl:.1f} (expected within 1.5x at ratio 0.15); {detail}", data)
        if plan.aligned_fraction < 1.0:
            return Check(name, "FAIL", f"gac left {100 * (1 - plan.aligned_fraction):.0f}% of tiny's dims unaligned; "
                                       f"{detail}", data)
        return Check(name, "PASS", detail, data)

    return _guard(name, run)


# ------------------------------------------------------------------------------------------------ compressor defaults
DEFAULT_COMPRESSORS = ("asvd", "svd_llm", "palu", "llm_pruner")
MAX_ZERO_GRADIENTS = 0.01  # a larger share of exactly-zero weight gradients is underflow, not the model
# ratio 0.15 on tiny moves perplexity by well under this factor with every compressor's default (measured on CPU:
# about 1.0-1.6x); far above it a CUDA path computes something else
MAX_PPL_GROWTH = 3.0
DEFAULTS_CALIBRATION = ("tiny", 4, 64, 0)  # source, samples, tokens, seed: seconds per compressor on a GPU


def default_paths(prepared) -> dict:
    """What a prepared state says about how its stages ran: the sensitivity search's path, the gradient pass's
    dtype and zero-gradient fraction, the whitening fallbacks (from its notes)."""
    out: dict = {"allocation": prepared.allocation, "proxy": prepared.proxy}
    probe = prepared.paths.get("sensitivity")
    if probe:
        out["sensitivity"] = {k: probe.get(k) for k in ("path", "rel_diff", "tolerance", "dtype", "why")
                              if probe.get(k) is not None}
    grad = prepared.paths.get("gradients")
    if grad:
        out["gradients"] = {k: grad[k] for k in ("dtype", "model_dtype", "loss_scale", "overflow_reruns",
                                                 "zero_fraction")}
    out["whitening_fallbacks"] = [n for n in prepared.notes if "whitening used" in n]
    return out


def judge_paths(paths: dict) -> list[str]:
    """The problems :func:`default_paths` shows (empty: none)."""
    problems = []
    sens = paths.get("sensitivity")
    if sens and sens.get("path") != "layer_cache":
        problems.append(f"the sensitivity search's layer-cache check failed here ({sens.get('why')}): every probe "
                        f"of a real search runs a full forward (about 2x the time)")
    grad = paths.get("gradients")
    if grad and grad["zero_fraction"] > MAX_ZERO_GRADIENTS:
        problems.append(f"{100 * grad['zero_fraction']:.2g}% of the weight gradients were exactly zero in "
                        f"{grad['dtype']} (underflow: zero Taylor / Fisher scores)")
    return problems


def _describe_paths(paths: dict) -> str:
    parts = [f"allocation {paths['allocation']}, proxy {paths['proxy']}"]
    sens = paths.get("sensitivity")
    if sens:
        if sens.get("path") == "layer_cache":
            parts.append(f"search: layer cache (check {sens['rel_diff']:.1e} <= {sens['tolerance']:.1e} "
                         f"{sens['dtype']})")
        else:
            parts.append("search: full-forward fallback")
    grad = paths.get("gradients")
    if grad:
        how = grad["dtype"] + (f" (model {grad['model_dtype']})" if grad["dtype"] != grad["model_dtype"] else "")
        if grad.get("loss_scale") is not None:
            how += f", loss scale {grad['loss_scale']:g} after {grad['overflow_reruns']} overflow(s)"
        parts.append(f"gradients: {how}, {100 * grad['zero_fraction']:.2g}% zero")
    if paths["whitening_fallbacks"]:
        parts.append(f"whitening: {len(paths['whitening_fallbacks'])} fallback(s), e.g. "
                     f"{paths['whitening_fallbacks'][0]}")
    return "; ".join(parts)


def default_checks(dev, dtype: str | None = None, compressors: Sequence[str] = DEFAULT_COMPRESSORS,
                   ratio: float = 0.15) -> list[Check]:
    """One check per compressor: its own default allocation and proxy on ``tiny`` in the device's dtype (module
    docstring), compressed at ``ratio`` and evaluated."""
    import math

    import torch

    from gac.compression.calibration import Calibration
    from gac.compression.preparation import prepare
    from gac.dtypes import dtype_name
    from gac.evaluation.perplexity import perplexity
    from gac.models import load_model

    dt = dtype_name(dtype or "auto", dev)
    out: list[Check] = []
    base: dict = {}

    def ppl(model, tok) -> float:
        return perplexity(model, tok, "tiny", seq_len=128, batch_size=4, max_windows=4)["ppl"]

    for comp in compressors:
        name = f"default {comp}"

        def run(comp=comp, name=name):
            t0 = time.perf_counter()
            model, tok = load_model("tiny", dtype=dt, device=str(dev))
            if "ppl" not in base:
                base["ppl"] = ppl(model, tok)
            # ASVD probes on 2 of the samples: the same path (the cache check reads 2), a quarter of the probes' cost
            opts = {"sensitivity_samples": 2} if comp == "asvd" else {}
            prepared = prepare(model, tok, comp, calibration=Calibration(*DEFAULTS_CALIBRATION),
                               compressor_options=opts)
            paths = default_paths(prepared)
            model, plan, _ = prepared.compress(ratio, "gac", copy_model=False)
            got = ppl(model, tok)
            del model, prepared
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            data = {"dtype": dt, "ratio": ratio, "ppl_dense": base["ppl"], "ppl_compressed": got, **paths,
                    "seconds": time.perf_counter() - t0}
            detail = (f"{dt}: {_describe_paths(paths)}; PPL {base['ppl']:.1f} -> {got:.1f} at ratio {ratio:g}, "
                      f"{data['seconds']:.0f} s")
            problems = judge_paths(paths)
            if not (math.isfinite(got) and got <= MAX_PPL_GROWTH * base["ppl"]):
                problems.append(f"the compressed perplexity {got:.1f} is not within {MAX_PPL_GROWTH:g}x the dense "
                                f"{base['ppl']:.1f}")
            if problems:
                return Check(name, "FAIL", "; ".join(problems) + f" [{detail}]", data)
            return Check(name, "PASS", detail, data)

        out.append(_guard(name, run))
    return out
