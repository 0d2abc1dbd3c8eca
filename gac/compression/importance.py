"""The calibration passes that feed the importance proxies (:mod:`gac.compression.proxies`, paper Table 1).

Calibration (:func:`iter_activation_stats`) runs the model *one decoder layer at a time*: the inputs of layer
``i`` for all calibration samples are the only activations held, hooks on that layer's projections fold each
sample into running float64 sums (``sum x^2``, ``sum |x|`` per input channel, ``X^T X`` and the output Gram
``Y^T Y`` when asked; projections fed the same tensor share one set), the layer's statistics are *yielded* as
soon as they are complete (the caller factorises that layer and drops them before the next layer runs), and the
layer's outputs become the next layer's inputs. :func:`collect_activation_stats` gathers every layer's at once.
The gradient pass that feeds the gradient proxies is :mod:`gac.compression.gradients`.

Non-finite statistics fail loudly, naming the layer (:class:`~gac.errors.GacError`), instead of surfacing as a NaN
perplexity later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from gac.devices import model_device
from gac.errors import GacError
from gac.progress import track

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ statistics
GRADIENT_STATS = ("taylor_row", "taylor_col", "fisher_row", "fisher_col", "taylor_mean_row", "taylor_mean_col",
                  "fisher_rms_row", "fisher_rms_col")
ELEMENTWISE = ("taylor_mean", "fisher_rms")  # statistics that need a running sum per weight element (module docstring)
# calibration runs a layer on several samples at once, up to this many tokens per forward (one sample when a sample
# is longer): batch-1 forwards of short samples leave small GEMMs to a contended thread pool (SmolLM2-135M, 32 x 256
# tokens on the loaded 2-core CPU: docs/scale.md); the statistics are the same sums, in another order
CALIB_CHUNK_TOKENS = 2048


@dataclass
class WeightStats:
    """Calibration statistics of one projection (float64 sums; projections fed the same input share the input sums'
    tensors, so treat them as read-only)."""

    tokens: int = 0
    act_sq: torch.Tensor | None = None  # [in] sum over tokens of x_j^2
    act_abs: torch.Tensor | None = None  # [in] sum over tokens of |x_j|
    xtx: torch.Tensor | None = None  # [in, in] sum of x x^T (float64), only when asked
    yty: torch.Tensor | None = None  # [out, out] sum of y y^T of the projection's output (float64), only when asked
    samples: int = 0  # gradient samples folded in
    taylor_row: torch.Tensor | None = None  # [out] sum_s |sum_j w_cj g_cj|
    taylor_col: torch.Tensor | None = None  # [in] sum_s sum_i |w_ij g_ij|
    fisher_row: torch.Tensor | None = None  # [out] sum_s sum_j g_cj^2
    fisher_col: torch.Tensor | None = None  # [in] sum_s sum_i g_ij^2
    taylor_mean_row: torch.Tensor | None = None  # [out] sum_j |w_cj g_bar_cj|, g_bar = mean_s g (elementwise "taylor_mean")
    taylor_mean_col: torch.Tensor | None = None  # [in] sum_i |w_ij g_bar_ij|
    fisher_rms_row: torch.Tensor | None = None  # [out] sum_j sqrt(mean_s g_cj^2) (elementwise "fisher_rms")
    fisher_rms_col: torch.Tensor | None = None  # [in] sum_i sqrt(mean_s g_ij^2)
    extra: dict = field(default_factory=dict)

    def act_abs_mean(self) -> torch.Tensor:
        if self.act_abs is None or not self.tokens:
            raise GacError("activation statistics were not collected for this weight")
        return self.act_abs / self.tokens

    def part(self, rows: list[int] | None) -> WeightStats:
        """The statistics of some of the weight's output rows (a role of a fused weight): the input sums are the
        weight's (one input feeds all rows), the per-row sums and the output Gram are restricted to ``rows``; per-column
        gradient sums cannot be split by row and are left out (None: all rows, the statistics themselves)."""
        if rows is None:
            return self
        idx = torch.as_tensor(rows)
        out = WeightStats(tokens=self.tokens, act_sq=self.act_sq, act_abs=self.act_abs, xtx=self.xtx,
                          samples=self.samples)
        if self.yty is not None:
            i = idx.to(self.yty.device)
            out.yty = self.yty.index_select(0, i).index_select(1, i)
        for k in ("taylor_row", "fisher_row", "taylor_mean_row", "fisher_rms_row"):
            v = getattr(self, k)
            if v is not None:
                setattr(out, k, v.index_select(-1, idx.to(v.device)))
        return out

    def expert(self, e: int) -> WeightStats:
        """Expert ``e``'s statistics of a 3-D expert parameter (its gradient sums are kept per expert)."""
        out = WeightStats(samples=self.samples)
        for k in GRADIENT_STATS:
            v = getattr(self, k)
            if v is not None:
                setattr(out, k, v[e])
        return out

    def merge(self, other: WeightStats) -> None:
        for k in ("act_sq", "act_abs", "xtx", "yty", *GRADIENT_STATS):
            v = getattr(other, k)
            if v is not None:
                setattr(self, k, v)
        self.tokens = self.tokens or other.tokens
        self.samples = self.samples or other.samples


def check_finite(t: torch.Tensor, what: str, name: str) -> None:
    if not torch.isfinite(t).all():
        bad = "NaN" if torch.isnan(t).any() else "inf"
        raise GacError(
            f"{bad} in the {what} of {name!r} during calibration; the model produces non-finite values on the "
            f"calibration data (check the model weights, use float32/bfloat16 instead of float16, or other calibration text)"
        )


class _StopForward(Exception):
    pass


def capture_layer_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor, all_kwargs: bool = True):
    """Layer 0's input for ``ids`` and (with ``all_kwargs``) every layer's keyword arguments (masks, rotary embeddings).

    Decoder layers are short-circuited to the identity and the forward stops at the last layer needed, so this costs
    the embedding lookup only (never the LM head).
    """
    n = len(layers) if all_kwargs else 1
    kwargs_per_layer: list[dict] = [None] * n  # type: ignore[list-item]
    first_input: list[torch.Tensor] = []
    handles = []

    def make_hook(i):
        def hook(mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            if i == 0:
                first_input.append(h.detach())
            kwargs_per_layer[i] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            if i == n - 1:
                raise _StopForward
            return None

        return hook

    for i in range(n):
        handles.append(layers[i].register_forward_pre_hook(make_hook(i), with_kwargs=True))
        layers[i].forward = lambda *a, **k: a[0] if a else k["hidden_states"]  # identity: only the kwargs are wanted
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    except _StopForward:
        pass
    finally:
        for i in range(n):
            del layers[i].forward  # back to the class method
        for h in handles:
            h.remove()
    if not first_input:
        raise GacError("calibration could not capture the decoder layers' inputs; is this a supported decoder model?")
    for kw in kwargs_per_layer:
        kw.pop("past_key_values", None)
        kw["use_cache"] = False
    return first_input[0], kwargs_per_layer


def _names(sel, modules) -> set[str]:
    """``True`` -> all ``modules``; ``False``/None -> none; a collection -> those names."""
    if sel is True:
        return set(modules)
    if not sel:
        return set()
    return set(sel)


class _InputAcc:
    """Running float64 sums of one distinct layer input (shared by the projections fed the same tensor)."""

    __slots__ = ("tokens", "act_sq", "act_abs", "xtx")

    def __init__(self):
        self.tokens, self.act_sq, self.act_abs, self.xtx = 0, None, None, None

    def add(self, x: torch.Tensor, want_xtx: bool) -> None:
        x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        sq, ab = (x2 * x2).sum(0), x2.abs().sum(0)
        if self.act_sq is None:
            self.act_sq, self.act_abs = sq, ab
        else:
            self.act_sq.add_(sq)
            self.act_abs.add_(ab)
        if want_xtx:
            if self.xtx is None:
                self.xtx = x2.T @ x2
            else:
                self.xtx.addmm_(x2.T, x2)
        self.tokens += x2.shape[0]


def iter_activation_stats(
    model: nn.Module, layout, calib_ids: torch.Tensor, modules: list[str], xtx=False, yty=(),
):
    """Calibration statistics streamed one decoder layer at a time.

    Yields ``(layer_index, {module: WeightStats})`` for every decoder layer that holds one of ``modules``, in order,
    as soon as that layer's statistics are complete; the calibration forward is paused while the caller works (e.g.
    factorises the layer's weights) and resumes when the next item is asked for, so a caller that drops each
    layer's statistics after use holds one layer's worth at a time. Layers after the last one needed are not run.

    Statistics stay on the model's device, in float64: per input channel ``sum x^2`` and ``sum |x|`` always,
    ``X^T X`` for the modules in ``xtx`` (``True``: all) and the output Gram ``Y^T Y`` (``Y = X W^T``: the module's
    output less its bias, out x out) for the modules in ``yty``. Projections fed the *same* input tensor (q/k/v, gate/up) share one set of input sums (the
    same tensors, computed once), so a layer's X^T X memory is one matrix per distinct input.
    """
    if calib_ids.ndim != 2 or calib_ids.numel() == 0:
        raise GacError(f"calibration ids must be a non-empty [n_samples, seq_len] tensor, got shape {tuple(calib_ids.shape)}")
    dev = model_device(model)
    layers = model.get_submodule(layout.layers_path)
    wanted = set(modules)
    want_xtx, want_yty = _names(xtx, modules), _names(yty, modules)
    per_layer = []
    for li in layout.layers:
        names = sorted(n for n in wanted if n.startswith(li.prefix + "."))
        if names:
            per_layer.append((li, names))
    missing = wanted - {n for _, ns in per_layer for n in ns}
    if missing:
        raise GacError(f"no calibration statistics for {sorted(missing)[:3]}...: these modules are not in the decoder layers")
    if not per_layer:
        return
    last = per_layer[-1][0].index
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            h0, kw = capture_layer_inputs(model, layers, calib_ids[:1].to(dev))
            hidden = [h0] + [capture_layer_inputs(model, layers, calib_ids[s : s + 1].to(dev), all_kwargs=False)[0]
                             for s in range(1, calib_ids.shape[0])]
            todo = dict(per_layer)
            for li in track(layout.layers[: last + 1], "calibration", "layers"):
                layer = layers[li.index]
                names = todo.get(li)
                if not names:  # a layer without statistics to record: just advance the hidden states
                    for s in range(len(hidden)):
                        out = layer(hidden[s], **kw[li.index])
                        hidden[s] = out[0] if isinstance(out, tuple) else out
                    continue
                yield li.index, _layer_stats(model, li, layer, names, hidden, kw[li.index], want_xtx, want_yty)
    finally:
        model.train(was_training)


def _layer_stats(model, li, layer, names, hidden, kw, want_xtx, want_yty) -> dict[str, WeightStats]:
    """Run ``layer`` on every sample (``hidden`` is advanced in place) and return its modules' statistics."""
    seen: list = []  # (module, input tensor) of the current sample, in call order
    outs: list = []  # (module, output tensor, its bias) for the output Grams
    handles = []
    for n in names:
        mod = model.get_submodule(n)
        handles.append(mod.register_forward_pre_hook(lambda m, args, _n=n: seen.append((_n, args[0]))))
        if n in want_yty:
            handles.append(mod.register_forward_hook(
                lambda m, args, out, _n=n: outs.append((_n, out, getattr(m, "bias", None)))))
    acc_of: dict[str, _InputAcc] = {}
    yty: dict[str, torch.Tensor] = {}
    per = max(1, CALIB_CHUNK_TOKENS // max(1, int(hidden[0].shape[-2]))) if hidden else 1  # samples per forward
    try:
        for s in range(0, len(hidden), per):
            seen.clear()
            outs.clear()
            e = min(s + per, len(hidden))
            out = layer(hidden[s] if e == s + 1 else torch.cat(hidden[s:e]), **kw)
            out = out[0] if isinstance(out, tuple) else out
            check_finite(out, f"output activations (sample {s})" if e == s + 1 else
                          f"output activations (samples {s}..{e - 1})", li.prefix)
            hidden[s:e] = list(out.split(hidden[s].shape[0])) if e > s + 1 else [out]
            # group this sample's projections by the input tensor object they received (q/k/v, gate/up)
            groups: list[tuple[torch.Tensor, list[str]]] = []
            for n, x in seen:
                g = next((g for g in groups if g[0] is x), None)
                if g is None:
                    groups.append((x, [n]))
                else:
                    g[1].append(n)
            for x, members in groups:
                a = acc_of.get(members[0])
                if a is None:
                    a = _InputAcc()
                if any(acc_of.get(n, a) is not a for n in members):
                    raise GacError(f"{li.prefix}: projections {members} shared an input on sample {s} but not before; "
                                   f"calibration statistics would be inconsistent")
                a.add(x, any(n in want_xtx for n in members))
                for n in members:
                    acc_of[n] = a
            for n, y, b in outs:
                y2 = y.detach().reshape(-1, y.shape[-1]).to(torch.float64)
                if isinstance(b, torch.Tensor):  # the Gram of X W^T: the bias is not part of the factorised weight
                    y2 = y2 - b.detach().to(torch.float64)
                if n in yty:
                    yty[n].addmm_(y2.T, y2)
                else:
                    yty[n] = y2.T @ y2
            seen.clear()
            outs.clear()
    finally:
        for h in handles:
            h.remove()
        seen.clear()
        outs.clear()
    stats = {}
    for n in names:
        a = acc_of.get(n)
        if a is None:
            raise GacError(f"{n} was never called in the calibration forward of {li.prefix}; is it part of the layer?")
        for what in ("act_sq", "act_abs", "xtx"):
            v = getattr(a, what)
            if v is not None:
                check_finite(v, f"input activation statistics ({what})", n)
        st = WeightStats(tokens=a.tokens, act_sq=a.act_sq, act_abs=a.act_abs,
                         xtx=a.xtx if n in want_xtx else None)
        if n in want_yty:
            check_finite(yty[n], "output Gram (Y^T Y)", n)
            st.yty = yty[n]
        stats[n] = st
    return stats


def collect_activation_stats(
    model: nn.Module, layout, calib_ids: torch.Tensor, modules: list[str], xtx=False, yty=(), device: str = "cpu",
) -> dict[str, WeightStats]:
    """Per-projection input statistics of every layer at once (:func:`iter_activation_stats` collected, moved to
    ``device``). ``xtx`` (``True`` or a set of names) also accumulates ``X^T X``; ``yty`` the output Grams.

    Holds every layer's statistics until it returns; :func:`gac.compression.preparation.prepare` streams instead."""
    stats: dict[str, WeightStats] = {}
    moved: dict[int, torch.Tensor] = {}  # shared tensors stay shared after the move

    def mv(t):
        if t is None:
            return None
        if id(t) not in moved:
            moved[id(t)] = t.to(device)
        return moved[id(t)]

    for _, layer_stats in iter_activation_stats(model, layout, calib_ids, modules, xtx=xtx, yty=yty):
        for n, st in layer_stats.items():
            for what in ("act_sq", "act_abs", "xtx", "yty"):
                setattr(st, what, mv(getattr(st, what)))
            stats[n] = st
        moved.clear()
    return stats
