"""Prepare a model for compression, once for every ratio and strategy: discover its targets, calibrate, score them
with the importance proxy and factorise them with the compressor (and, for ASVD's allocation, run its sensitivity
search), streaming one decoder layer's statistics at a time. The checks that refuse a preparation before any of that
work (:func:`check_sensitivity_reach`, :func:`check_probe_samples`) are here too.
"""

from __future__ import annotations

import logging
import math
import time

import torch
from torch import nn

from gac.compression.allocation import SENSITIVITY_GRID, check_sensitivity_grid, resolve_allocation
from gac.compression.calibration import Calibration
from gac.compression.compressors import Compressor, Unit, get_compressor
from gac.compression.discovery import ModelLayout, discover
from gac.compression.gradients import collect_gradient_stats
from gac.compression.importance import iter_activation_stats
from gac.compression.parts import stat_tensor
from gac.compression.prepared import Prepared, units_by_layer
from gac.compression.proxies import get_proxy
from gac.compression.resources import ResourceMeter
from gac.compression.sensitivity import sensitivity_table
from gac.devices import model_device
from gac.errors import GacError
from gac.faults import fault_point
from gac.progress import quiet_scope

log = logging.getLogger(__name__)

CHECKPOINT_SHARE = 0.25  # auto checkpointing: one sample's backward activations above this share of free memory


def _auto_checkpoint(model: nn.Module, layout: ModelLayout, calib_ids: torch.Tensor,
                     reserved_bytes: int = 0) -> tuple[bool, str]:
    """Whether the gradient pass should checkpoint its layers: one sample's saved activations (the estimate of
    :mod:`gac.compression.footprint`) against the free memory of the model's device, less ``reserved_bytes`` (the
    element-wise gradient sums the pass will hold)."""
    from gac.compression.footprint import ACT_PER_TOKEN_H, ACT_PER_TOKEN_I
    from gac.compression.resources import device_memory

    p = next(model.parameters())
    per_layer = calib_ids.shape[1] * (ACT_PER_TOKEN_H * layout.hidden_size + ACT_PER_TOKEN_I * layout.intermediate_size)
    need_mb = layout.num_layers * per_layer * p.element_size() / 2**20
    free = device_memory(str(p.device)).get("available_mb")
    if free is not None:
        free = max(free - reserved_bytes / 2**20, 0.0)
    on = free is not None and need_mb > CHECKPOINT_SHARE * free
    return on, f"one sample's activations ~{need_mb / 1024:.1f} GiB, {0 if free is None else free / 1024:.1f} GiB free"


def prepare(
    model: nn.Module,
    tokenizer=None,
    compressor: str | Compressor = "asvd",
    proxy: str | None = None,
    calibration: Calibration | None = None,
    calib_ids: torch.Tensor | None = None,
    allocation: str | None = None,
    power: float = 0.5,
    proxy_seed: int = 0,
    sensitivity_grid=None,
    compressor_options: dict | None = None,
    stream: bool = True,
    grad_checkpoint: bool | None = None,
    sensitivity_limit_s: float | None | str = "env",
    sensitivity_resume=None,
) -> Prepared:
    """Discover targets, calibrate, score and factorise once.

    ``proxy`` defaults to the compressor's own (ASVD: activation, SVD-LLM: magnitude, LLM-Pruner: taylor,
    PaLU: fisher_rms). ``calib_ids`` ([n, seq_len] token ids) overrides ``calibration`` text. ``allocation``:
    ``None``/``"default"`` (the compressor's own, what its reference does: ASVD ``sensitivity``, SVD-LLM ``uniform``,
    LLM-Pruner ``uniform``, PaLU ``fisher_uniform``), ``proportional`` (gac's Eq. 2 rule, see
    :mod:`gac.compression.allocation`), ``uniform``, ``sensitivity`` (ASVD's search), ``fisher_uniform`` (PaLU's
    rank search) or ``stable_rank`` (the GAC authors' data-free search; the ``stable_rank_svd`` compressor's own). ``sensitivity_grid``: the kept ratios of the sensitivity table (default: the compressor's
    ``sensitivity_grid`` option, else the reference's 0.4 ... 0.9).

    Streaming (``stream=True``, the default): gradient statistics (row/column sums, small) are collected first; then
    the activation statistics of one decoder layer at a time (:func:`~gac.compression.importance.iter_activation_stats`),
    and as soon as a layer's are complete its units are scored and factorised (on the model's device) and its
    statistics dropped, so X^T X / Y^T Y are held for one layer only. ``stream=False`` collects every layer's
    statistics before the first factorisation (same results, more memory). ``grad_checkpoint``: activation
    checkpointing in the gradient pass (same statistics, less memory, about one more forward); None (default)
    turns it on when one sample's activations would take more than a quarter of the device's free memory
    (:func:`_auto_checkpoint`; the choice is in ``notes``). The wall time and peak memory of each
    stage are in ``prepared.timings`` / ``prepared.memory`` (:class:`~gac.compression.resources.ResourceMeter`).

    The sensitivity search (``allocation="sensitivity"``) logs its estimated cost first (one timed forward) and
    raises :class:`GacError` naming what makes it cheaper when the estimate is above ``sensitivity_limit_s``
    (``"env"``: ``$GAC_SENSITIVITY_LIMIT``, else 2 h; None: no limit; :mod:`gac.compression.sensitivity`); when its
    layer-cache check fails, the slower full-forward search is estimated and checked again. ``sensitivity_resume``: a
    file that keeps the table's finished rows, so a search interrupted there resumes (None: none kept). Which path the
    probes took is in ``notes``.
    """
    t_start = time.perf_counter()
    comp = get_compressor(compressor, **(compressor_options or {}))
    proxy_name = proxy or comp.default_proxy
    prox = get_proxy(proxy_name, seed=proxy_seed)
    allocation = resolve_allocation(allocation, comp)
    grid = check_sensitivity_grid(sensitivity_grid if sensitivity_grid is not None
                                  else comp.sensitivity_grid or SENSITIVITY_GRID)
    check_allocation(allocation, comp)  # no ratio yet (a prepared model serves every ratio): the rule's availability
    layout = discover(model)
    units = comp.units(model, layout)
    if not units:
        raise GacError(f"{comp.name} found nothing to compress in this model")
    need_act = comp.needs_act or comp.needs_xtx or "act" in prox.needs
    need_grad = "grad" in prox.needs
    experts = [u.name for u in units if any(p and p.startswith("expert") for _, p in u.weight_parts)]
    if experts and need_act:
        raise GacError(f"proxy {proxy_name!r} scores expert widths with per-expert input activations, which gac does "
                       f"not collect (each expert sees only its routed tokens); score the experts with taylor, "
                       f"gradient, fisher, magnitude or random")
    if layout.experts and not experts:
        log.info("%s compresses the attention%s of this mixture-of-experts model; its expert MLPs are pruned by "
                 "llm_pruner only", comp.name, " and dense MLPs" if any(u.meta.get("role") in (
                     "gate", "up", "down") for u in units) else "")
    cal_json: dict = {}
    if need_act or need_grad or allocation == "sensitivity":
        if calib_ids is None:
            calibration = calibration or Calibration()
            calib_ids = calibration.token_ids(tokenizer)
            cal_json = calibration.to_json()
        else:
            cal_json = {"source": "token_ids", "n_samples": int(calib_ids.shape[0]), "seq_len": int(calib_ids.shape[1])}
    probe_samples = getattr(comp, "sensitivity_samples", None) if allocation == "sensitivity" else None
    check_probe_samples(allocation, comp, int(calib_ids.shape[0]) if calib_ids is not None else 0)
    estimate = limit_s = None
    if allocation == "sensitivity":  # its cost said (and refused above the limit) before the calibration starts
        from gac.compression.sensitivity import check_cost, estimate_cost, sensitivity_limit

        estimate = estimate_cost(model, layout, units, grid, calib_ids, probe_samples)
        limit_s = sensitivity_limit(sensitivity_limit_s)
        log.info("%s", check_cost(estimate, units, grid, limit_s, comp.name))
    mods = comp.stat_modules(units)
    for n in mods:
        w = stat_tensor(model, n)[0]
        if not torch.isfinite(w).all():
            raise GacError(f"the weight of {n!r} contains NaN or inf; the model is damaged and cannot be compressed")
    meter = ResourceMeter(str(model_device(model)))
    scores: dict[str, float] = {}
    factors: dict = {}
    grad_stats: dict = {}
    fault_point("calibration")
    notes = []
    if need_grad:
        if grad_checkpoint is None:
            reserved = 4 * len(prox.elementwise) * sum(stat_tensor(model, n)[0].numel() for n in mods)
            grad_checkpoint, why = _auto_checkpoint(model, layout, calib_ids, reserved)
            if grad_checkpoint:
                notes.append(f"gradient pass used activation checkpointing ({why})")
        grad_report: dict = {}
        with meter.stage("gradients"):
            grad_stats = collect_gradient_stats(model, calib_ids, mods, elementwise=prox.elementwise,
                                                checkpoint=grad_checkpoint, layout=layout,
                                                tokens_ahead=comp.gradient_tokens_ahead, report=grad_report)
        notes.append(gradient_note(grad_report))
    elif comp.gradient_tokens_ahead != 1:  # an option of the gradient pass, and this proxy takes no gradients
        msg = (f"{comp.name}: its gradient loss ({comp.gradient_tokens_ahead} tokens ahead, e.g. PaLU "
               f"fisher_loss=two_ahead) has no effect with proxy {proxy_name!r}, which takes no gradients")
        log.warning("%s", msg)
        notes.append(msg)
    first = [True]

    def score_and_factorize(us: list[Unit], st: dict) -> None:
        if first[0]:  # the fault points of the two stages fire once, at the first layer's scores and factors
            fault_point("scoring")
        with meter.stage("score"):
            scores.update(comp.score(model, us, st, prox))
        if first[0]:
            fault_point("factorize")
            first[0] = False
        with meter.stage("factorize"):
            factors.update(comp.factorize(model, us, st, prox))

    if need_act:
        xtx, yty = comp.stat_requests(model, units)
        by_layer = units_by_layer(units, layout)
        layer_stats = iter_activation_stats(model, layout, calib_ids, mods, xtx=xtx, yty=yty)
        if not stream:  # every layer's statistics first, then every factorisation (for comparison and tests)
            with meter.stage("calibration"):
                layer_stats = list(layer_stats)
        it = iter(layer_stats)
        while True:
            with meter.stage("calibration"):
                item = next(it, None)
            if item is None:
                break
            li, st = item
            for n, g in grad_stats.items():
                if n in st:
                    st[n].merge(g)
            # once per decoder layer: the layer loop shows the progress, so the compressors' own per-call bars and
            # closing lines stay quiet (one line per stage, not one per layer)
            with quiet_scope(True):
                score_and_factorize(by_layer.pop(li, []), st)
            item = st = None  # the layer's X^T X / Y^T Y go here, before the next layer's are accumulated
        if by_layer:  # units whose modules lie in no decoder layer (cannot happen with discover's layouts)
            raise GacError(f"no calibration statistics reached {[u.name for us in by_layer.values() for u in us][:3]}")
    else:
        score_and_factorize(units, grad_stats)
    del grad_stats
    for u in units:
        how = factors.get(u.name, {}).get("whitening")
        if how and how not in ("cholesky", "gram"):
            notes.append(f"{u.name}: whitening used {how}")
    t = meter.timings()
    timings = {"calibration_s": t.get("calibration_s", 0.0) + t.get("gradients_s", 0.0),
               "score_s": t.get("score_s", 0.0), "factorize_s": t.get("factorize_s", 0.0)}
    if need_grad:
        timings["gradients_s"] = t["gradients_s"]
    prepared = Prepared(model, comp, proxy_name, cal_json, allocation, float(power), layout, units, scores, factors,
                        timings, notes=notes,
                        calib_ids=calib_ids.detach().cpu().clone() if comp.keeps_calibration else None)
    if need_grad:
        prepared.paths["gradients"] = grad_report
    if allocation == "sensitivity":
        t0 = time.perf_counter()
        with meter.stage("sensitivity"):
            prepared.sensitivity = sensitivity_table(model, comp, units, factors, calib_ids, grid, layout=layout,
                                                     probe_samples=probe_samples, resume=sensitivity_resume,
                                                     limit_s=limit_s, estimate=estimate)
        prepared.timings["sensitivity_s"] = time.perf_counter() - t0
        probe = prepared.sensitivity.get("probe") or {}
        # what the search was estimated to take before it ran (the full-forward one's when the layer cache failed)
        prepared.timings["sensitivity_estimate_s"] = probe.get("fallback_estimate_s", estimate["seconds"])
        prepared.paths["sensitivity"] = {k: v for k, v in probe.items() if k != "threads"}
        if probe.get("path") == "full_forward":
            prepared.notes.append(f"sensitivity: every probe ran a full forward (slower), because {probe.get('why')}")
        elif probe.get("path") == "layer_cache":
            prepared.notes.append(f"sensitivity: the probes ran from the layer cache (its check against the full "
                                  f"forward: {probe['rel_diff']:.1e} relative, {probe['dtype']} tolerance "
                                  f"{probe['tolerance']:.1e})")
        if probe.get("resumed_rows"):
            prepared.notes.append(f"sensitivity: resumed with {probe['resumed_rows']} of {len(units)} rows saved by "
                                  f"an interrupted search")
        if probe_samples is not None:
            prepared.notes.append(f"sensitivity: probes on {probe_samples} of the {calib_ids.shape[0]} calibration "
                                  f"samples (sensitivity_samples; the reference probes on all)")
    prepared.memory = meter.memory()
    prepared.timings["prepare_s"] = time.perf_counter() - t_start
    log.info("prepared %s/%s on %d units in %.1fs", comp.name, proxy_name, len(units), prepared.timings["prepare_s"])
    return prepared


def gradient_note(report: dict) -> str:
    """The prepared state's note on its gradient pass: the dtype it ran in, any loss scaling, and the fraction of
    weight gradients that were exactly zero (underflow shows there)."""
    how = report["dtype"]
    if report["dtype"] != report["model_dtype"]:
        how += f" (the {report['model_dtype']} weights cast for the pass and restored after it)"
    if report.get("loss_scale") is not None:
        how += (f" with a loss scale of 2^{math.log2(report['loss_scale']):g} ({report['overflow_reruns']} re-runs "
                f"after an overflow)")
    return (f"gradient pass: {how}; {100 * report['zero_fraction']:.3g}% of the {report['gradients']:,} weight "
            f"gradients were exactly zero")


def check_allocation(allocation: str, comp: Compressor, ratio: float | None = None, n_samples: int | None = None,
                     grid=None) -> None:
    """Is this request valid: the allocation rule (resolved: never ``default``) available for the compressor, its
    sensitivity grid reaching ``ratio`` (when one is given), its probe samples within the ``n_samples`` calibration
    samples (when given). The one check a job's config, ``gac compress`` and :func:`prepare` make, before any work."""
    if allocation == "sensitivity" and not comp.supports_sensitivity:
        raise GacError(f"allocation=sensitivity is not available for {comp.name}; use proportional or uniform")
    if ratio is not None:
        check_sensitivity_reach(allocation, comp, ratio, grid)
    if n_samples is not None:
        check_probe_samples(allocation, comp, n_samples)


def check_sensitivity_reach(allocation: str, comp: Compressor, ratio: float, grid=None) -> None:
    """Fail before any work when the sensitivity grid cannot reach ``ratio`` (every weight at the grid's smallest kept
    ratio still keeps more than ``1 - ratio`` of the parameters)."""
    if allocation != "sensitivity":
        return
    grid = check_sensitivity_grid(grid if grid is not None else comp.sensitivity_grid or SENSITIVITY_GRID)
    smallest = min(g for g in grid if g < 1)
    if 1 - ratio < smallest:
        raise GacError(
            f"compression ratio {ratio} removes more than the sensitivity grid allows: its smallest kept ratio is "
            f"{smallest} (at most {1 - smallest:.2f} removed); add smaller kept ratios to the grid "
            f"(sensitivity_grid) or use allocation='proportional'"
        )


def check_probe_samples(allocation: str, comp: Compressor, n_samples: int) -> None:
    """Fail before any work when the sensitivity probes ask for more samples than the calibration has."""
    n = getattr(comp, "sensitivity_samples", None)
    if allocation == "sensitivity" and n is not None and n > n_samples:
        raise GacError(f"{comp.name}: sensitivity_samples={n} is more than the {n_samples} calibration samples; "
                       f"lower it or raise the calibration samples (calibration.n_samples, --calib-samples)")
