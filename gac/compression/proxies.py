"""Importance proxies (paper Table 1): one small object per proxy, in a registry (:data:`PROXIES`).

Each gives, for one weight ``W`` and its calibration
statistics:

* ``weight_score`` — the importance *per parameter* of the whole weight (the ``s_i`` of Eq. 2/4), and
* ``row_energy`` / ``col_energy`` — additive importance of each output row / input column, used where a compressor
  works below the weight level (PaLU head groups, LLM-Pruner channels).

==============  ===========================================  =====================================================
proxy           weight_score (per parameter)                 rows / columns
==============  ===========================================  =====================================================
``magnitude``   ``||W||_F / sqrt(|W|)`` (RMS of W)             sum of ``w^2``
``activation``  ``||X||_F / sqrt(tokens)`` (RMS input norm)    Wanda form ``sum_j |w_ij| * ||X_j||``
``gradient``    ``sum_c |dL/dh_c . h_c| / |W|`` (1st-order     rows: ``|dL/dh_c . h_c|`` (= ``|sum_j w_cj g_cj|``);
                Taylor, summed over calibration samples)      columns: ``sum_i |w_ij g_ij|`` (LLM-Pruner's Taylor)
``fisher``      ``tr(F) / |W|`` (sum of squared per-sample     sum of ``g^2``
                gradients, the empirical Fisher diagonal)
``taylor``      ``sum |w * g_bar| / |W|``, ``g_bar`` the       rows ``sum_j |w_cj g_bar_cj|``, columns
                mean gradient over the calibration samples    ``sum_i |w_ij g_bar_ij|`` (LLM-Pruner's
                (LLM-Pruner's element-wise ``param_first``)   ``param_first`` on one batch-mean gradient)
``fisher_rms``  mean over the weight of ``sqrt(mean_s g^2)``   rows / columns: sum of ``sqrt(mean_s g^2)``
                (PaLU's Fisher, ``rank_search.py``)
``random``      seeded uniform (a baseline)                   seeded uniform
==============  ===========================================  =====================================================

The statistics they read come from the calibration passes of :mod:`gac.compression.importance`.
"""

from __future__ import annotations

import math
import zlib

import torch

from gac import registry
from gac.compression.importance import WeightStats
from gac.errors import GacError, unknown_name


class Proxy:
    """An importance proxy: per-parameter weight score plus additive row/column energies."""

    name: str = ""
    needs: frozenset[str] = frozenset()  # subset of {"act", "grad"}
    elementwise: tuple[str, ...] = ()  # element-wise gradient statistics it reads (collect_gradient_stats)
    sqrt_energy = False  # True when the per-parameter score is sqrt(energy / numel) (norm-like proxies)

    def weight_score(self, name: str, W: torch.Tensor, st: WeightStats | None) -> float:
        e = float(self.row_energy(name, W, st).sum())
        return self.group_score(e, W.numel())

    def group_score(self, energy: float, numel: int) -> float:
        v = energy / max(numel, 1)
        return math.sqrt(max(v, 0.0)) if self.sqrt_energy else v

    def row_energy(self, name: str, W: torch.Tensor, st: WeightStats | None) -> torch.Tensor:
        raise NotImplementedError

    def col_energy(self, name: str, W: torch.Tensor, st: WeightStats | None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<proxy {self.name}>"


def _need(st: WeightStats | None, attr: str, proxy: str, name: str) -> torch.Tensor:
    v = None if st is None else getattr(st, attr)
    if v is None:
        raise GacError(f"proxy {proxy!r} needs calibration statistics ({attr}) for {name!r}; none were collected")
    return v


class Magnitude(Proxy):
    name, needs, sqrt_energy = "magnitude", frozenset(), True

    def row_energy(self, name, W, st):
        return W.detach().double().pow(2).sum(1).cpu()

    def col_energy(self, name, W, st):
        return W.detach().double().pow(2).sum(0).cpu()


class Activation(Proxy):
    name, needs = "activation", frozenset({"act"})

    def weight_score(self, name, W, st):
        sq = _need(st, "act_sq", self.name, name)
        return math.sqrt(float(sq.sum()) / max(st.tokens, 1))

    def _xnorm(self, name, st):
        return (_need(st, "act_sq", self.name, name) / max(st.tokens, 1)).sqrt()

    # computed on W's device (streamed calibration leaves the statistics there; a W on the GPU with statistics on
    # the host works too), returned on the host like every proxy's energies
    def row_energy(self, name, W, st):
        xn = self._xnorm(name, st).to(W.device)
        return (W.detach().double().abs() * xn[None, :]).sum(1).cpu()

    def col_energy(self, name, W, st):
        xn = self._xnorm(name, st).to(W.device)
        return (W.detach().double().abs().sum(0) * xn).cpu()


class Gradient(Proxy):
    name, needs = "gradient", frozenset({"grad"})

    def row_energy(self, name, W, st):
        return _need(st, "taylor_row", self.name, name)

    def col_energy(self, name, W, st):
        return _need(st, "taylor_col", self.name, name)


class Fisher(Proxy):
    name, needs = "fisher", frozenset({"grad"})

    def row_energy(self, name, W, st):
        return _need(st, "fisher_row", self.name, name)

    def col_energy(self, name, W, st):
        return _need(st, "fisher_col", self.name, name)


class Taylor(Proxy):
    """LLM-Pruner's element-wise first-order Taylor importance (``--taylor param_first``, its default): the sum over
    a group's weights of ``|w * g_bar|``, ``g_bar`` the gradient of the mean loss over the calibration samples."""

    name, needs, elementwise = "taylor", frozenset({"grad"}), ("taylor_mean",)

    def row_energy(self, name, W, st):
        return _need(st, "taylor_mean_row", self.name, name)

    def col_energy(self, name, W, st):
        return _need(st, "taylor_mean_col", self.name, name)


class FisherRMS(Proxy):
    """PaLU's Fisher information (``rank_search.py``): per weight element ``sqrt(mean_s g_s^2)`` over the calibration
    samples; a weight's (or head group's) score is the mean over its elements."""

    name, needs, elementwise = "fisher_rms", frozenset({"grad"}), ("fisher_rms",)

    def row_energy(self, name, W, st):
        return _need(st, "fisher_rms_row", self.name, name)

    def col_energy(self, name, W, st):
        return _need(st, "fisher_rms_col", self.name, name)


class Random(Proxy):
    """A seeded random baseline: the same (seed, weight name) always gives the same scores."""

    name, needs = "random", frozenset()

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def _gen(self, name, salt):
        return torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(f"{name}/{salt}".encode()))

    def weight_score(self, name, W, st):
        return float(torch.rand((), generator=self._gen(name, "w"), dtype=torch.float64))

    def row_energy(self, name, W, st):
        return torch.rand(W.shape[0], generator=self._gen(name, "r"), dtype=torch.float64)

    def col_energy(self, name, W, st):
        return torch.rand(W.shape[1], generator=self._gen(name, "c"), dtype=torch.float64)


PROXIES: dict[str, type[Proxy]] = registry.PROXIES.bind({
    "magnitude": Magnitude,
    "activation": Activation,
    "gradient": Gradient,
    "fisher": Fisher,
    "taylor": Taylor,
    "fisher_rms": FisherRMS,
    "random": Random,
})


def get_proxy(name: str, seed: int = 0) -> Proxy:
    if isinstance(name, Proxy):
        return name
    if name not in PROXIES:
        raise unknown_name("importance proxy", str(name), PROXIES)
    cls = PROXIES[name]
    return cls(seed) if cls is Random else cls()


def check_score(value: float, name: str, proxy: str) -> float:
    if not math.isfinite(value):
        raise GacError(
            f"importance score of {name!r} under proxy {proxy!r} is {value}; non-finite scores usually come from NaN "
            f"or inf weights or calibration activations (check the model and the calibration data)"
        )
    if value < 0:
        raise GacError(f"importance score of {name!r} under proxy {proxy!r} is negative ({value})")
    return float(value)
