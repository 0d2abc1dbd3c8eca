"""The compression pipeline: score -> unconstrained d* -> aligned plan -> apply, with reusable scored state.

>>> prepared = prepare(model, tokenizer, "asvd", calibration=Calibration("wikitext2", 32, 2048))
>>> for ratio in (0.15, 0.30):
...     for strategy in ("unaligned", "gac"):
...         compressed, plan, report = prepared.compress(ratio, strategy)   # no re-scoring, no new SVD

:func:`prepare` collects calibration statistics, importance scores and the compressor's factorisation once;
:meth:`Prepared.compress` runs only allocation, alignment and the (cheap) layer swap per ratio and strategy.
:func:`compress_model` is the one-shot form.

The budget (paper Eq. 1) covers the *compressed weights*: ``B = floor((1 - ratio) * |W|)`` where ``|W|`` is the
dense weight count of the units the compressor touches (biases, embeddings, norms and untouched layers excluded).
Every report checks that the weights of the compressed modules, counted on the model, equal the plan's parameter
count and do not exceed B (budget-free peer baselines such as ``round_nearest`` may exceed it; they say so).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from gac import __version__, registry
from gac.align import STRATEGIES, Plan, align
from gac.align.candidates import DEFAULT_UNIT, DEFAULT_WINDOW, CandidateFilter, check_unit, check_window
from gac.align.targets import Target, budget_for_ratio, check_ratio
from gac.compression.allocation import (
    SENSITIVITY_GRID,
    STABLE_RANK,
    check_sensitivity_grid,
    fisher_uniform_allocation,
    proportional_allocation,
    resolve_allocation,
    sensitivity_allocation,
)
from gac.compression.compressors import Compressor, Unit, get_compressor
from gac.compression.discovery import ModelLayout, discover
from gac.compression.importance import collect_gradient_stats, iter_activation_stats
from gac.compression.parts import part_params, stat_tensor
from gac.compression.prepared_io import load_prepared, save_prepared
from gac.compression.proxies import get_proxy
from gac.compression.resources import ResourceMeter
from gac.compression.sensitivity import calibration_perplexity, sensitivity_table  # noqa: F401 (re-exported)
from gac.compression.stable_rank import stable_rank_targets
from gac.errors import GacError, unknown_name
from gac.faults import fault_point
from gac.progress import quiet_scope

log = logging.getLogger(__name__)

# Candidate window (in alignment units) used when compressing a real model. Eq. 4's value is linear in parameters,
# so with a wide window the exact knapsack moves up to (window - 1) units of dimension per target towards the
# highest-scored weights, far beyond rounding; with imperfect proxy scores that costs perplexity (measured on tiny,
# see docs/compressors.md). window = 1 keeps the aligned dimensions that bracket d* (plus d_max when within one
# unit): gac then decides exactly which targets round up and which round down under the budget. Pass window=8
# for the paper's +-8-step candidate sets.
COMPRESS_WINDOW = DEFAULT_WINDOW  # one default for the library and the pipeline (1: the dims bracketing d*)
KNAPSACK_SCORES = registry.KNAPSACK_SCORES.names
# Eq. 4's per-parameter score: "marginal" (the compressor's own error of the aligned step at d*, weighted by the
# proxy) measured no worse than "proxy" on tiny in every benchmark cell (docs/compressors.md); "proxy" is the paper's.
DEFAULT_KNAPSACK_SCORE = "marginal"


@dataclass(frozen=True)
class Calibration:
    """Where calibration tokens come from: ``n_samples`` random windows of ``seq_len`` tokens (seeded).

    ``source``: ``"wikitext2"`` (train split, the ASVD / SVD-LLM protocol), ``"tiny"``, or a local text file.
    Defaults follow ASVD (32 x 2048 from WikiText-2 train).
    """

    source: str = "wikitext2"
    n_samples: int = 32
    seq_len: int = 2048
    seed: int = 0
    split: str = "train"

    def to_json(self) -> dict:
        return asdict(self)

    def token_ids(self, tokenizer) -> torch.Tensor:
        from gac.text import calibration_batches

        if tokenizer is None:
            raise GacError("calibration from text needs a tokenizer; pass one, or pass calib_ids directly")
        return calibration_batches(tokenizer, self.source, self.n_samples, self.seq_len, self.seed, self.split)


@dataclass
class Prepared:
    """Scores and factorisations of one (model, compressor, proxy, calibration): reusable across ratios and strategies."""

    model: nn.Module
    compressor: Compressor
    proxy: str
    calibration: dict
    allocation: str
    power: float
    layout: ModelLayout
    units: list[Unit]
    scores: dict[str, float]
    factors: dict
    timings: dict
    sensitivity: dict | None = None
    notes: list[str] = field(default_factory=list)
    memory: dict = field(default_factory=dict)  # stage -> {"peak_rss_mb", ...[, "gpu_peak_mb"]} (ResourceMeter)
    calib_ids: torch.Tensor | None = None  # kept only for a compressor with keeps_calibration (SVD-LLM's update)
    # how this preparation's passes ran (not saved with the state): "gradients" (collect_gradient_stats's report),
    # "sensitivity" (the probes' path); what gac doctor reports
    paths: dict = field(default_factory=dict)

    @property
    def dense_params(self) -> int:
        return sum(u.dense_params for u in self.units)

    def save(self, path) -> None:
        """Write the scored state (not the model) to ``path``: safetensors + JSON, see :mod:`.prepared_io`."""
        save_prepared(self, path)

    @classmethod
    def load(cls, path, model: nn.Module, compressor: str | Compressor, compressor_options: dict | None = None,
             device: str = "cpu") -> Prepared:
        """The state :meth:`save` wrote, for ``model`` (checked against its units and factor shapes)."""
        return cls(**load_prepared(path, model, get_compressor(compressor, **(compressor_options or {})),
                                   device=device))

    def budget(self, ratio: float) -> int:
        return budget_for_ratio(self.dense_params, ratio)

    def targets(self, ratio: float, unit: int = DEFAULT_UNIT, knapsack_score: str = DEFAULT_KNAPSACK_SCORE,
                budget: int | None = None) -> tuple[list[Target], int]:
        """The gac targets (d* from the allocation) and the budget B for ``ratio`` (with the ``stable_rank``
        allocation B is the cost of its ranks, :func:`~gac.compression.stable_rank.stable_rank_targets`).

        ``knapsack_score`` is the per-parameter s_i handed to Eq. 4: ``"proxy"`` (the paper: the importance proxy's
        score) or ``"marginal"`` (default; the compressor's own error per parameter of the aligned step bracketing d* —
        squared singular values for low rank, ranked channel energy for pruning — times ``(s_i / s_bar) ** power``).
        """
        if knapsack_score not in KNAPSACK_SCORES:
            raise unknown_name("knapsack score", knapsack_score, KNAPSACK_SCORES)
        if self.allocation == STABLE_RANK and budget is not None:
            raise GacError("the stable_rank allocation sets its own budget (the parameter cost of the ranks it "
                           "chooses for the ratio); give a ratio, not a budget")
        if budget is None:
            budget = self.budget(ratio)
        elif isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget < self.dense_params:
            raise GacError(f"budget must be a positive number of parameters below the dense {self.dense_params:,}, "
                           f"got {budget!r}")
        dense = [u.dense_params for u in self.units]
        ppd = [u.params_per_dim for u in self.units]
        dmax = [u.d_max(unit) for u in self.units]
        ddims = [u.dense_dim for u in self.units]
        if self.allocation == STABLE_RANK:  # the GAC authors' ranks, scores and budget (gac.compression.stable_rank)
            got, budget = stable_rank_targets(self, ratio, unit)
            d_star = [t.d_star for t in got]
            score_of = {t.name: t.score for t in got}
        elif self.allocation == "sensitivity":
            s = self.sensitivity
            if not s:
                raise GacError("this prepared state has no sensitivity table; prepare it with allocation='sensitivity'")
            d_star, scores, info = sensitivity_allocation(dense, ppd, [u.d_cap for u in self.units], s["table"],
                                                          s["grid"], s["base_ppl"], budget, ddims)
            self._search = info
            score_of = dict(zip([u.name for u in self.units], scores))
        elif self.allocation == "fisher_uniform":
            sc = [self.scores[u.name] for u in self.units]
            d_star = fisher_uniform_allocation(dense, ppd, dmax, sc, [u.projection_key for u in self.units], budget)
            score_of = self.scores
        else:
            sc = [self.scores[u.name] for u in self.units]
            power = 0.0 if self.allocation == "uniform" else self.power
            d_star = proportional_allocation(dense, ppd, dmax, sc, budget, power=power, dense_dims=ddims)
            score_of = self.scores
        if knapsack_score == "marginal":
            total = sum(dense)
            sbar = math.fsum(score_of[u.name] * u.dense_params for u in self.units) / total
            rel = {u.name: (score_of[u.name] / sbar) ** self.power if sbar > 0 else 1.0 for u in self.units}
            margin = {}
            for u, d in zip(self.units, d_star):
                m = self.compressor.marginal_score(u, d, self.factors, unit)
                if m is None:
                    raise GacError(f"{self.compressor.name} has no error curve for {u.name}; use knapsack_score='proxy'")
                margin[u.name] = max(m, 0.0) * rel[u.name]
            score_of = margin
        targets = [
            Target(u.name, float(d if u.is_dense(d) else min(d, dm)), float(score_of[u.name]), u.params_per_dim,
                   d_max=dm, kind=u.kind, meta=self._kernel_meta(u),
                   dense_params=u.dense_params if u.dense_option else None,
                   shape=tuple(u.meta["shape"]) if u.dense_option and "shape" in u.meta else None)
            for u, d, dm in zip(self.units, d_star, dmax)
        ]
        return targets, budget

    def _search_report(self) -> dict | None:
        info = getattr(self, "_search", None)
        if info is None:
            return None
        return {"threshold_ppl": info["threshold_ppl"], "cut": info["cut"], "entries": info["entries"],
                "params": info["params"], "kept_ratio": {u.name: r for u, r in zip(self.units, info["kept_ratio"])}}

    def _kernel_meta(self, u: Unit) -> dict:
        """What the hardware profile needs to measure a target's own kernels (gac.profiling.sweeps.target_shape)."""
        meta = {"d_full": u.d_full, "dense_params": u.dense_params, "hidden_size": self.layout.hidden_size,
                "num_heads": self.layout.num_heads}
        p = u.meta.get("projection")
        if u.kind == "lowrank" and p is not None and p.in_features + p.out_features == u.params_per_dim:
            meta.update(in_features=p.in_features, out_features=p.out_features)
        return meta

    def plan(self, ratio: float, strategy: str = "gac", unit: int = DEFAULT_UNIT, window: int = COMPRESS_WINDOW,
             candidate_filter: CandidateFilter | None = None, knapsack_score: str = DEFAULT_KNAPSACK_SCORE,
             budget: int | None = None) -> tuple[Plan, list[Target]]:
        """The plan of ``strategy`` and the targets it was made for."""
        if strategy not in STRATEGIES:
            raise unknown_name("strategy", strategy, STRATEGIES)
        targets, budget = self.targets(ratio, unit, knapsack_score, budget)
        plan = align(targets, budget, strategy, unit, window, candidate_filter)
        if strategy in ("authors_dp", "authors_round") and knapsack_score != "proxy":
            plan.notes.append(f"the GAC authors' procedure valued the compressor's own scores (knapsack_score=proxy; "
                              f"with stable_rank_svd their stable-rank 'fisher'); this plan used {knapsack_score}")
        return plan, targets

    def compress(
        self,
        ratio: float,
        strategy: str = "gac",
        unit: int = DEFAULT_UNIT,
        window: int = COMPRESS_WINDOW,
        candidate_filter: CandidateFilter | None = None,
        copy_model: bool = True,
        knapsack_score: str = DEFAULT_KNAPSACK_SCORE,
        budget: int | None = None,
        planned: tuple[Plan, list[Target]] | None = None,
    ) -> tuple[nn.Module, Plan, dict]:
        """Allocate, align and apply for one ratio and strategy. ``copy_model=False`` compresses the prepared model
        in place, one layer at a time, dropping each layer's factors as it goes (saves memory; the Prepared object
        cannot be reused afterwards). ``budget``: see :meth:`targets`; ``planned``: a plan made by the caller for
        :meth:`targets` (a latency budget's, :mod:`gac.jobs.latency_plan`) and those targets, applied as given."""
        if getattr(self, "_consumed", False):
            raise GacError("this Prepared model was compressed in place already; prepare again or use copy_model=True")
        meter = ResourceMeter(str(_device_of(self.model)))
        with meter.stage("plan"):
            plan, targets = planned or self.plan(ratio, strategy, unit, window, candidate_filter, knapsack_score, budget)
        keep_originals = self.compressor.keeps_calibration  # after_apply (SVD-LLM's update) reads the dense weights
        with meter.stage("apply"):
            model = copy.deepcopy(self.model) if copy_model else self.model
            if copy_model:
                originals = self.compressor.apply(model, self.units, plan.dims, self.factors) or {}
            else:
                self._consumed = True
                originals = {}
                # in place, one decoder layer at a time: each layer's dense weights and factors are freed before the
                # next layer's compressed modules are built, so apply never holds a second copy of the weights
                # (unless after_apply needs the originals)
                for us in _units_by_layer(self.units, self.layout).values():
                    old = self.compressor.apply(model, us, {u.name: plan.dims[u.name] for u in us if u.name in plan.dims},
                                                self.factors)
                    if keep_originals:
                        originals.update(old or {})
                    del old
                    for u in us:
                        self.factors.pop(u.name, None)
            extra = self.compressor.after_apply(model, self.units, plan.dims, originals, self.calib_ids, self.layout)
            del originals
        t_plan, t_apply = meter.timings()["plan_s"], meter.timings()["apply_s"]
        actual = compressed_weight_params(model, self.units)
        if actual != plan.params:
            raise AssertionError(f"parameter accounting bug: modules hold {actual} weights, the plan says {plan.params}")
        recipe = {
            "compressor": self.compressor.name,
            "options": self.compressor.options(),
            "proxy": self.proxy,
            "allocation": self.allocation,
            "power": self.power,
            "ratio": ratio,
            "budget": budget,  # None: floor((1 - ratio) * dense)
            "strategy": strategy,
            "unit": unit,
            "window": window,
            "knapsack_score": knapsack_score,
            "candidate_filter": None if candidate_filter is None else repr(candidate_filter),
            "calibration": self.calibration,
        }
        report = {
            "recipe": recipe,
            "budget": plan.budget,
            "params": plan.params,
            "params_counted": actual,
            "dense_params": self.dense_params,
            "budget_met": plan.budget_met,
            "aligned_fraction": plan.aligned_fraction,
            "aligned_by_unit": {str(k): v for k, v in plan.aligned_by_unit.items()},
            "n_targets": len(self.units),
            "d_star": {t.name: t.d_star for t in targets},
            "dims": dict(plan.dims),
            "dense": list(plan.dense),
            "allocation_search": self._search_report() if self.allocation == "sensitivity" else None,
            "timings": {**self.timings, "plan_s": t_plan, "apply_s": t_apply},
            "memory": {**self.memory, **meter.memory()},
            "compression_wall_s": self.timings["prepare_s"] + t_plan + t_apply,
            "notes": list(self.notes) + list(plan.notes),
            "gac_version": __version__,
            **extra,
        }
        model._gac_recipe = recipe  # picked up by gac.compression.checkpoint.save_checkpoint
        model._gac_plan = plan
        return model, plan, report


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


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


def _units_by_layer(units: list[Unit], layout: ModelLayout) -> dict[int, list[Unit]]:
    """Units keyed by the last decoder layer their modules lie in (when that layer's statistics are complete)."""
    out: dict[int, list[Unit]] = {}
    for u in units:
        out.setdefault(max(layout.layer_of(m) for m in u.modules), []).append(u)
    return out


def compressed_weight_params(model: nn.Module, units: list[Unit]) -> int:
    """Weight parameters of the weights the units cover (their parts: whole modules, roles of fused ones, experts),
    counted on the model as it is (low-rank factors, pruned Linears)."""
    parts = sorted({wp for u in units for wp in u.weight_parts}, key=lambda mp: (mp[0], mp[1] or ""))
    layout = discover(model) if any(part and not part.startswith("expert") for _, part in parts) else None
    return sum(part_params(model, m, part, layout) for m, part in parts)


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
    if allocation == "sensitivity" and not comp.supports_sensitivity:
        raise GacError(f"the sensitivity allocation is not available for {comp.name}; use 'proportional' or 'uniform'")
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
    meter = ResourceMeter(str(_device_of(model)))
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
        by_layer = _units_by_layer(units, layout)
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


def compress_model(
    model: nn.Module,
    tokenizer=None,
    compressor: str | Compressor = "asvd",
    ratio: float = 0.15,
    strategy: str = "gac",
    proxy: str | None = None,
    unit: int = DEFAULT_UNIT,
    window: int = COMPRESS_WINDOW,
    calibration: Calibration | None = None,
    calib_ids: torch.Tensor | None = None,
    candidate_filter: CandidateFilter | None = None,
    cache: dict | None = None,
    allocation: str | None = None,
    compressor_options: dict | None = None,
    knapsack_score: str = DEFAULT_KNAPSACK_SCORE,
    sensitivity_limit_s: float | None | str = "env",
) -> tuple[nn.Module, Plan, dict]:
    """One-shot compression. Without ``cache`` the model is compressed in place; with a ``cache`` dict, the
    scored state is stored there (keyed by compressor, options, proxy, calibration and allocation) and reused by
    later calls on the same model, which then return compressed copies. ``allocation`` and
    ``sensitivity_limit_s``: see :func:`prepare`."""
    check_ratio(ratio)  # before any calibration work
    check_unit(unit)
    check_window(window)
    if strategy not in STRATEGIES:
        raise unknown_name("strategy", strategy, STRATEGIES)
    comp = get_compressor(compressor, **(compressor_options or {}))
    check_sensitivity_reach(resolve_allocation(allocation, comp), comp, ratio)
    n_cal = int(calib_ids.shape[0]) if calib_ids is not None else (calibration or Calibration()).n_samples
    check_probe_samples(resolve_allocation(allocation, comp), comp, n_cal)
    key = None
    if cache is not None:
        key = json.dumps([id(model), str(compressor), compressor_options or {}, proxy, asdict(calibration) if calibration
                          else None, None if calib_ids is None else [list(calib_ids.shape), int(calib_ids.sum())], allocation],
                         sort_keys=True, default=str)
    prepared = cache.get(key) if cache is not None else None
    if prepared is None:
        prepared = prepare(model, tokenizer, comp, proxy, calibration, calib_ids, allocation,
                           sensitivity_limit_s=sensitivity_limit_s)
        if cache is not None:
            cache[key] = prepared
    return prepared.compress(ratio, strategy, unit, window, candidate_filter, copy_model=cache is not None,
                             knapsack_score=knapsack_score)
