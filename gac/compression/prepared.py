"""The prepared state of one (model, compressor, proxy, calibration): its units, scores, factorisations and, for
ASVD's search, its sensitivity table (:class:`Prepared`, made by :func:`gac.compression.preparation.prepare`). Per
ratio and strategy it gives the allocation's d* (:meth:`Prepared.targets`), the aligned plan (:meth:`Prepared.plan`)
and the compressed model with its report (:meth:`Prepared.compress`: the cheap layer swap, no re-scoring).

The budget (paper Eq. 1) covers the *compressed weights*: ``B = floor((1 - ratio) * |W|)`` where ``|W|`` is the
dense weight count of the units the compressor touches (biases, embeddings, norms and untouched layers excluded).
Every report checks that the weights of the compressed modules, counted on the model, equal the plan's parameter
count and do not exceed B (budget-free peer baselines such as ``round_nearest`` may exceed it; they say so).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from gac import __version__, registry
from gac.align import STRATEGIES, Plan, align
from gac.align.candidates import DEFAULT_UNIT, DEFAULT_WINDOW, CandidateFilter
from gac.align.targets import Target, budget_for_ratio
from gac.compression.allocation import (
    STABLE_RANK,
    fisher_uniform_allocation,
    proportional_allocation,
    sensitivity_allocation,
)
from gac.compression.compressors import Compressor, Unit, get_compressor
from gac.compression.discovery import ModelLayout, discover
from gac.compression.parts import part_params
from gac.compression.prepared_io import load_prepared, save_prepared
from gac.compression.resources import ResourceMeter
from gac.compression.stable_rank import stable_rank_targets
from gac.devices import model_device
from gac.errors import GacError, unknown_name
from gac.registry import DEFAULT_KNAPSACK_SCORE

# Candidate window (in alignment units) used when compressing a real model. Eq. 4's value is linear in parameters,
# so with a wide window the exact knapsack moves up to (window - 1) units of dimension per target towards the
# highest-scored weights, far beyond rounding; with imperfect proxy scores that costs perplexity (measured on tiny,
# see docs/compressors.md). window = 1 keeps the aligned dimensions that bracket d* (plus d_max when within one
# unit): gac then decides exactly which targets round up and which round down under the budget. Pass window=8
# for the paper's +-8-step candidate sets.
COMPRESS_WINDOW = DEFAULT_WINDOW  # one default for the library and the pipeline (1: the dims bracketing d*)
KNAPSACK_SCORES = registry.KNAPSACK_SCORES.names
# Eq. 4's per-parameter score by default (gac.registry.DEFAULT_KNAPSACK_SCORE): "marginal" (the compressor's own
# error of the aligned step at d*, weighted by the proxy) measured no worse than "proxy" on tiny in every benchmark
# cell (docs/compressors.md); "proxy" is the paper's.

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
        if knapsack_score == DEFAULT_KNAPSACK_SCORE:
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
        :meth:`targets` (a latency budget's, :mod:`gac.jobs.run.latency_plan`) and those targets, applied as given."""
        if getattr(self, "_consumed", False):
            raise GacError("this Prepared model was compressed in place already; prepare again or use copy_model=True")
        meter = ResourceMeter(str(model_device(self.model)))
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
                for us in units_by_layer(self.units, self.layout).values():
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


def units_by_layer(units: list[Unit], layout: ModelLayout) -> dict[int, list[Unit]]:
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
