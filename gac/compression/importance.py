"""The calibration passes that feed the importance proxies (:mod:`gac.compression.proxies`, paper Table 1).

Calibration (:func:`iter_activation_stats`) runs the model *one decoder layer at a time*: the inputs of layer
``i`` for all calibration samples are the only activations held, hooks on that layer's projections fold each
sample into running float64 sums (``sum x^2``, ``sum |x|`` per input channel, ``X^T X`` and the output Gram
``Y^T Y`` when asked; projections fed the same tensor share one set), the layer's statistics are *yielded* as
soon as they are complete (the caller factorises that layer and drops them before the next layer runs), and the
layer's outputs become the next layer's inputs. :func:`collect_activation_stats` gathers every layer's at once.
Gradient proxies (:func:`collect_gradient_stats`) need a backward pass through the whole model, one calibration
sample at a time; a per-parameter hook folds each gradient into per-row/column sums and frees it at once, so no
model-sized gradient buffer is ever held, and ``checkpoint=True`` re-computes each layer in the backward instead of
holding its activations. The two element-wise proxies (``taylor``, ``fisher_rms``) are the exception to "no model-
sized buffer": ``|w * g_bar|`` and ``sqrt(mean g^2)`` cannot be reduced before the last sample, so for the
projections they score the pass keeps one float32 running sum per weight element (``sum_s g`` or ``sum_s g^2``: 4
bytes per compressed parameter) and reduces it to rows and columns at the end.

The gradient pass's precision (:func:`gradient_precision`): a float16 model's backward has no range for the small
weight gradients (they underflow to zero, and zero gradients are zero Taylor scores) and little for the large
activation gradients (an overflow), so a float16 model runs the pass in bfloat16 where the device has it (its
weights cast for the pass, the float16 originals kept on the host and put back bit for bit afterwards), else in
float16 with a dynamic loss scale (a sample whose scaled gradients overflow runs again at half the scale, for the
weights whose gradients were not finite). The fraction of weight gradients that were exactly zero is reported.

Non-finite statistics fail loudly, naming the layer (:class:`~gac.errors.GacError`), instead of surfacing as a NaN
perplexity later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from gac.dtypes import dtype_str
from gac.errors import GacError, unknown_name
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


def _check_finite(t: torch.Tensor, what: str, name: str) -> None:
    if not torch.isfinite(t).all():
        bad = "NaN" if torch.isnan(t).any() else "inf"
        raise GacError(
            f"{bad} in the {what} of {name!r} during calibration; the model produces non-finite values on the "
            f"calibration data (check the model weights, use float32/bfloat16 instead of float16, or other calibration text)"
        )


class _StopForward(Exception):
    pass


def _capture_layer_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor, all_kwargs: bool = True):
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


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


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
    ``X^T X`` for the modules in ``xtx`` (``True``: all) and the output Gram ``Y^T Y`` (``Y = X W^T``, out x out) for
    the modules in ``yty``. Projections fed the *same* input tensor (q/k/v, gate/up) share one set of input sums (the
    same tensors, computed once), so a layer's X^T X memory is one matrix per distinct input.
    """
    if calib_ids.ndim != 2 or calib_ids.numel() == 0:
        raise GacError(f"calibration ids must be a non-empty [n_samples, seq_len] tensor, got shape {tuple(calib_ids.shape)}")
    dev = _device_of(model)
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
            h0, kw = _capture_layer_inputs(model, layers, calib_ids[:1].to(dev))
            hidden = [h0] + [_capture_layer_inputs(model, layers, calib_ids[s : s + 1].to(dev), all_kwargs=False)[0]
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
    outs: list = []  # (module, output tensor) for the output Grams
    handles = []
    for n in names:
        mod = model.get_submodule(n)
        handles.append(mod.register_forward_pre_hook(lambda m, args, _n=n: seen.append((_n, args[0]))))
        if n in want_yty:
            handles.append(mod.register_forward_hook(lambda m, args, out, _n=n: outs.append((_n, out))))
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
            _check_finite(out, f"output activations (sample {s})" if e == s + 1 else
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
            for n, y in outs:
                y2 = y.detach().reshape(-1, y.shape[-1]).to(torch.float64)
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
                _check_finite(v, f"input activation statistics ({what})", n)
        st = WeightStats(tokens=a.tokens, act_sq=a.act_sq, act_abs=a.act_abs,
                         xtx=a.xtx if n in want_xtx else None)
        if n in want_yty:
            _check_finite(yty[n], "output Gram (Y^T Y)", n)
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


LOSS_SCALE_INIT = 2.0 ** 16  # the float16 pass's first loss scale (torch.amp.GradScaler's); halved on an overflow
LOSS_SCALE_MIN = 1.0
PRECISIONS = ("auto", "model", "bfloat16", "loss_scale")


def bf16_native(device) -> bool:
    """Whether ``device`` runs bfloat16 natively: a CUDA GPU of compute capability 8.0+ (A100, H100; not emulated),
    and the CPU (torch's CPU kernels take bfloat16)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # a torch without the argument
            return bool(torch.cuda.is_bf16_supported())
    return dev.type == "cpu"


def gradient_precision(model_dtype: torch.dtype, bf16: bool, precision: str = "auto") -> tuple[torch.dtype, bool]:
    """``(dtype, loss_scaled)``: the dtype the gradient pass runs in, and whether its loss is scaled.

    ``"auto"``: a float16 model runs it in bfloat16 when the device has it (``bf16``), else in float16 with a loss
    scale; any other dtype as it is. ``"model"``: the model's dtype, unscaled; ``"bfloat16"`` / ``"loss_scale"``:
    that path for a float16 model (the others stay as they are)."""
    if precision not in PRECISIONS:
        raise unknown_name("gradient precision", precision, PRECISIONS)
    if model_dtype != torch.float16 or precision == "model":
        return model_dtype, False
    if precision == "bfloat16" or (precision == "auto" and bf16):
        return torch.bfloat16, False
    return torch.float16, True


def _cast_floating(model: nn.Module, src: torch.dtype, dst: torch.dtype):
    """Cast ``model``'s ``src`` parameters and buffers to ``dst`` in place (the same Parameter objects, so hooks
    stay); returns the function that puts the originals back bit for bit (kept on the host meanwhile, so the cast
    costs no device memory; idempotent)."""
    saved, undo = [], []
    # a unit memory-mapped from disk (gac.models.placement) is cast through a file of its own, so that the cast
    # stays on disk instead of becoming host memory
    on_disk = [m for m in model.modules() if getattr(m, "_gac_offload", None) is not None]
    cast_there = {id(x) for m in on_disk for x in (*m.parameters(), *m.modules())}
    for m in on_disk:
        undo.append(m._gac_offload.cast(src, dst))
    for p in model.parameters():
        if p.dtype == src and id(p) not in cast_there:
            saved.append((p, None, None, p.data if p.device.type == "cpu" else p.data.to("cpu")))
            p.data = p.data.to(dst)
    for m in model.modules():
        for k, b in list(m._buffers.items()):
            if b is not None and b.dtype == src and id(m) not in cast_there:
                saved.append((None, m, k, b))
                m._buffers[k] = b.to(dst)

    def restore():
        while saved:
            p, m, k, orig = saved.pop()
            if p is not None:
                p.data = orig.to(p.device)
            else:
                m._buffers[k] = orig
        while undo:
            undo.pop()()

    return restore


def collect_gradient_stats(model: nn.Module, calib_ids: torch.Tensor, modules: list[str], elementwise=(), *,
                           checkpoint: bool = False, layout=None, tokens_ahead: int = 1, precision: str = "auto",
                           report: dict | None = None) -> dict[str, WeightStats]:
    """Per-projection gradient statistics (Taylor and Fisher), one calibration sample per backward pass.

    Memory: the weights, one sample's activations for the backward, the logits, and one weight's gradient at a time
    (each is folded into row/column sums by a hook and freed). ``checkpoint=True`` re-computes each decoder layer in
    the backward instead of keeping its activations (activation checkpointing, in eval mode): the activations held
    drop from every layer's to the layers' inputs plus one layer's, for about one more forward of compute
    (docs/scale.md has the measured growth). ``layout`` (from :func:`~gac.compression.discovery.discover`) is
    needed with ``checkpoint``.

    ``tokens_ahead``: the loss whose gradients are taken predicts the token this many places ahead: 1, the ordinary
    next-token loss; 2, PaLU's reference code (inputs ``x[:, :-1]`` and labels ``x[:, 1:]`` handed to a Hugging Face
    model, which shifts the labels once more; PaLU's ``fisher_loss="two_ahead"``).

    ``elementwise`` (a subset of :data:`ELEMENTWISE`) also yields the statistics that need the whole gradient:
    ``"taylor_mean"`` -> ``taylor_mean_row/col`` from ``g_bar = mean_s g_s``, the gradient of the batch-mean loss
    (the samples have equal length, so the mean of the per-sample gradients *is* the one batch gradient LLM-Pruner
    takes); ``"fisher_rms"`` -> ``fisher_rms_row/col`` from ``sqrt(mean_s g_s^2)`` (PaLU). Each costs one float32
    running sum per weight element of ``modules`` while the pass runs.

    ``precision``: see :func:`gradient_precision` (module docstring); in bfloat16 the statistics read the weights as
    cast for the pass. ``report``, when given, is filled with how the pass ran: ``dtype``, ``model_dtype``,
    ``loss_scale`` (the last scale, or None), ``overflow_reruns``, ``gradients`` (weight-gradient elements seen) and
    ``zero_fraction`` (of them, exactly zero).
    """
    bad = [e for e in elementwise if e not in ELEMENTWISE]
    if bad:
        raise unknown_name("element-wise gradient statistic", str(bad[0]), ELEMENTWISE)
    if tokens_ahead not in (1, 2):
        raise GacError(f"tokens_ahead={tokens_ahead!r}: the gradient loss predicts the next token (1) or, as PaLU's "
                       f"reference code does, the one after it (2)")
    if tokens_ahead == 2 and calib_ids.shape[1] < 3:
        raise GacError(f"a two-ahead loss needs calibration samples of at least 3 tokens, got {calib_ids.shape[1]}")
    dev = _device_of(model)
    model_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    run_dtype, scaled = gradient_precision(model_dtype, bf16_native(dev), precision)
    scale = LOSS_SCALE_INIT if scaled else 1.0
    from gac.compression.parts import stat_tensor

    stats = {n: WeightStats() for n in modules}
    params, row_axis = {}, {}
    for n in modules:
        params[n], row_axis[n] = stat_tensor(model, n)
    # the axes a weight's rows and columns are summed over: rows are its outputs (per expert for a 3-D expert
    # parameter [E, out, in]), columns its inputs (a Conv1D stores in x out)
    axes = {n: ((2, 1) if p.dim() == 3 else (1 - row_axis[n], row_axis[n])) for n, p in params.items()}
    g_sum = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()} if "taylor_mean" in elementwise else {}
    g2_sum = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()} if "fisher_rms" in elementwise else {}
    saved_flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    handles = []
    active: set[str] = set()  # the weights whose gradients this backward adds (after an overflow: those left)
    finite: dict[str, torch.Tensor] = {}  # loss scaling: whether each weight's scaled gradient was finite
    # per device: [exactly-zero gradient elements, elements seen], counted where each weight lives (no sync, and a
    # model spread over devices never adds a count from one device to another's); summed on the host at the end
    counts: dict[torch.device, torch.Tensor] = {}
    reruns = 0

    def make_hook(n):
        def hook(p):
            if n not in active:
                p.grad = None
                return
            g = p.grad.detach().float()
            c = counts.get(g.device)
            if c is None:
                c = counts[g.device] = torch.zeros(2, dtype=torch.float64, device=g.device)
            if scaled:  # an overflowed gradient adds nothing; the sample runs again for it at half the scale
                ok = torch.isfinite(g).all()
                finite[n] = ok
                g = torch.where(ok, g / scale, torch.zeros((), device=g.device))
                c[0] += torch.where(ok, (g == 0).sum().double(), 0.0)
                c[1] += ok.double() * g.numel()
            else:
                c[0] += (g == 0).sum().double()
                c[1] += g.numel()
            w = p.detach().float()
            wg = w * g
            st = stats[n]
            ia, ra = axes[n]
            row, col = wg.sum(ia).abs(), wg.abs().sum(ra)
            g2 = g * g
            fr, fc = g2.sum(ia), g2.sum(ra)
            for what, v in (("taylor_row", row), ("taylor_col", col), ("fisher_row", fr), ("fisher_col", fc)):
                cur = getattr(st, what)  # float64 on the weight's device: no host copy (and no sync) per sample
                if cur is None:
                    setattr(st, what, v.double())
                else:
                    cur.add_(v)
            if n in g_sum:
                g_sum[n].add_(g)
            if n in g2_sum:
                g2_sum[n].add_(g2)
            p.grad = None  # never hold a model-sized gradient buffer (beyond the element-wise sums asked for)

        return hook

    was_training = model.training
    model.eval()
    restore = _cast_floating(model, model_dtype, run_dtype) if run_dtype != model_dtype else (lambda: None)
    wrapped = _checkpoint_layers(model, layout) if checkpoint else []
    try:
        for n, p in params.items():
            p.requires_grad_(True)
            handles.append(p.register_post_accumulate_grad_hook(make_hook(n)))
        for s in track(range(calib_ids.shape[0]), "calibration (gradients)", "samples"):
            ids = calib_ids[s : s + 1].to(dev)
            inp, lab = (ids, ids) if tokens_ahead == 1 else (ids[:, :-1], ids[:, 1:])  # the model shifts once more
            pending = list(modules)
            while pending:
                active.clear()
                active.update(pending)
                finite.clear()
                with torch.enable_grad():
                    out = model(input_ids=inp, labels=lab, use_cache=False)
                    loss = out.loss
                    if not torch.isfinite(loss):
                        raise GacError(
                            f"calibration loss is {loss.item()} on sample {s}; the model produces non-finite values "
                            f"(check its weights, or use float32/bfloat16 instead of float16)"
                        )
                    (loss * scale if scaled else loss).backward()
                    del out, loss
                if not scaled:
                    break
                ok = _on_host({n: finite[n] for n in pending if n in finite})
                bad = [n for n, f in ok.items() if not f]
                if bad:
                    scale /= 2
                    reruns += 1
                    if scale < LOSS_SCALE_MIN:
                        raise GacError(f"the float16 gradient pass overflows on sample {s} even unscaled; run it in "
                                       f"bfloat16 or float32 (gpu.dtype=bfloat16 / float32)")
                pending = bad
            for n in modules:
                stats[n].samples += 1
        restore()  # the statistics below read the model's own weights again
        n_s = max(int(calib_ids.shape[0]), 1)
        for n, st in stats.items():
            ia, ra = axes[n]
            if n in g_sum:  # |w * g_bar| with g_bar the mean gradient
                t = (params[n].detach().float() * g_sum.pop(n).div_(n_s)).abs_()
                st.taylor_mean_row, st.taylor_mean_col = t.sum(ia).double().cpu(), t.sum(ra).double().cpu()
            if n in g2_sum:  # sqrt(mean_s g^2)
                f = g2_sum.pop(n).div_(n_s).sqrt_()
                st.fisher_rms_row, st.fisher_rms_col = f.sum(ia).double().cpu(), f.sum(ra).double().cpu()
            for what in GRADIENT_STATS:
                if getattr(st, what) is not None:
                    setattr(st, what, getattr(st, what).cpu())  # one copy per statistic, after the last sample
                    _check_finite(getattr(st, what), f"gradient statistics ({what})", n)
        if report is not None:
            per_device = [c.cpu().tolist() for c in counts.values()]  # each device's two counts, added on the host
            zeros, total = sum(c[0] for c in per_device), sum(c[1] for c in per_device)
            report.update(dtype=dtype_str(run_dtype), model_dtype=dtype_str(model_dtype),
                          loss_scale=scale if scaled else None, overflow_reruns=reruns, gradients=int(total),
                          zero_fraction=zeros / total if total else 0.0)
    finally:
        restore()
        for layer in wrapped:
            del layer.forward  # back to the class method
        for h in handles:
            h.remove()
        for p, f in saved_flags.items():
            p.requires_grad_(f)
            p.grad = None
        model.train(was_training)
    return stats


def _on_host(flags: dict[str, torch.Tensor]) -> dict[str, bool]:
    """Each flag (a 0-dim tensor on its weight's device) read on the host, one copy per device: the weights of a
    model spread over devices hold their flags on different devices, which one ``torch.stack`` cannot join."""
    by_dev: dict[torch.device, list[str]] = {}
    for n, f in flags.items():
        by_dev.setdefault(f.device, []).append(n)
    out = {}
    for names in by_dev.values():
        out.update(zip(names, torch.stack([flags[n] for n in names]).cpu().tolist()))
    return {n: bool(out[n]) for n in flags}


def _checkpoint_layers(model: nn.Module, layout) -> list[nn.Module]:
    """Wrap every decoder layer's forward in non-reentrant activation checkpointing (works in eval mode, unlike the
    Hugging Face switch, which needs ``model.train()``); the caller deletes the instance attribute to undo it."""
    from torch.utils.checkpoint import checkpoint as _ckpt

    if layout is None:
        raise GacError("gradient checkpointing needs the model layout (gac.compression.discovery.discover(model))")
    layers = model.get_submodule(layout.layers_path)
    for layer in layers:
        layer.forward = lambda *a, _f=layer.forward, **k: _ckpt(_f, *a, use_reentrant=False, **k)
    return list(layers)


# ------------------------------------------------------------------------------------------------ proxies
