"""The gradient pass that feeds the gradient proxies (Taylor, Fisher; :mod:`gac.compression.proxies`):
:func:`collect_gradient_stats`. Gradient proxies need a backward pass through the whole model, one calibration
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

Non-finite statistics fail loudly, naming the weight (:class:`~gac.errors.GacError`).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from gac.compression.importance import ELEMENTWISE, GRADIENT_STATS, WeightStats, check_finite
from gac.devices import model_device
from gac.dtypes import dtype_str
from gac.errors import GacError, unknown_name
from gac.progress import track

log = logging.getLogger(__name__)


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
    dev = model_device(model)
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
                    check_finite(getattr(st, what), f"gradient statistics ({what})", n)
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
