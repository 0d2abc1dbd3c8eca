"""A model (any gac checkpoint: low-rank pairs, split parts, pruned widths, PaLU groups, per-expert widths) as an ONNX
graph for onnxruntime: ``input_ids`` ``[batch, sequence]`` (int64, both axes dynamic) to ``logits``
``[batch, sequence, vocab]`` (float32), one full forward pass without a KV cache (a prefill).

The graph is traced by torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``; the TorchScript exporter
fails on ``aten::diff`` in transformers' mask code). Two modules are traced through an equivalent of their forward
that has no data-dependent loop: gac's :class:`~gac.compression.modules.ExpertMLPs` computes every expert for every
token and weights it by its routing weight (zero where the token was not routed there), and transformers' fused
experts use their ``batched_mm`` implementation. :func:`verify_onnx` runs the file in onnxruntime and compares its
logits with the model's before the export counts as done.
"""

from __future__ import annotations

import contextlib
import logging
import types
import warnings
from pathlib import Path

import torch
from torch import nn

from gac.errors import GacError

#: ONNX f32 logits against the model's: max |difference| / max |logit|
ONNX_TOLERANCE = 1e-4
#: a graph larger than this keeps its weights in a file beside it (protobuf's 2 GiB limit)
INLINE_LIMIT = 1536 << 20


def data_file(path: str | Path) -> Path:
    """The file beside the graph ``path`` that holds its weights when they are not inline (``<path>.data``, the name
    torch's exporter gives it)."""
    p = Path(path)
    return p.with_name(p.name + ".data")


class _Logits(nn.Module):
    """``input_ids -> logits`` of a causal LM, no cache: the graph's one input and one output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """:class:`ExpertMLPs`' forward without routing loops: every expert on every token, times its routing weight."""
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        w = (top_k_weights * (top_k_index == e).to(top_k_weights.dtype)).sum(-1, keepdim=True)
        gate, up = self.gate_up[e](hidden_states).chunk(2, dim=-1)
        out = out + (self.down[e](self.act_fn(gate) * up) * w).to(out.dtype)
    return out


@contextlib.contextmanager
def traceable(model: nn.Module):
    """``model`` with its expert blocks in a form the exporter traces (module docstring), restored afterwards."""
    from gac.compression.modules import ExpertMLPs

    swapped, configs = [], {}
    for m in model.modules():
        if isinstance(m, ExpertMLPs):
            m.forward = types.MethodType(_dense_experts_forward, m)
            swapped.append(m)
        cfg = getattr(m, "config", None)
        if getattr(cfg, "_experts_implementation", None) is not None and id(cfg) not in configs:
            configs[id(cfg)] = (cfg, cfg._experts_implementation)
            cfg._experts_implementation = "batched_mm"  # read by transformers' fused experts only
    try:
        yield model
    finally:
        for m in swapped:
            del m.forward
        for cfg, impl in configs.values():
            cfg._experts_implementation = impl


def sample_ids(vocab: int, shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Token ids for a trace or a check, the same for the same arguments."""
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def export_onnx(model: nn.Module, path: Path) -> Path:
    """Write ``model`` (float32, eval mode) to ``path`` as an ONNX graph (module docstring); the weights go to
    :func:`data_file` beside it when the model is larger than :data:`INLINE_LIMIT`."""
    vocab = int(model.config.get_text_config().vocab_size)
    wrapper = _Logits(model).eval()
    batch, seq = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("sequence", min=2, max=1 << 16)
    ids = sample_ids(vocab, (2, 8), seed=0)
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "torchvision is not installed", once per operator
    try:
        with traceable(model), torch.no_grad(), contextlib.redirect_stdout(None), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's exporter warns about its own internals
            program = torch.onnx.export(wrapper, (ids,), dynamo=True, input_names=["input_ids"],
                                        output_names=["logits"], dynamic_shapes={"input_ids": {0: batch, 1: seq}},
                                        verbose=False, optimize=True)
    except Exception as e:  # noqa: BLE001 - the exporter raises many kinds; one line with the first of it
        why = " ".join(str(e).split())[:300] or type(e).__name__
        from gac.layout import CHECKPOINT_FILE

        raise GacError(f"torch's ONNX exporter could not trace this model ({why}); report it with the checkpoint's "
                       f"{CHECKPOINT_FILE}") from None
    finally:
        quiet.setLevel(level)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    program.save(str(path), external_data=size > INLINE_LIMIT)
    return path


def verify_onnx(path: Path, model: nn.Module, threads: int | None = None) -> dict:
    """Run ``path`` in onnxruntime on two batch/sequence shapes (neither the traced one) and compare its logits
    with ``model``'s: a :class:`GacError` when the largest difference is above :data:`ONNX_TOLERANCE` of the largest
    logit. Returns ``{"engine", "version", "shapes", "max_rel_diff"}``."""
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = int(threads)
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    vocab = int(model.config.get_text_config().vocab_size)
    worst, shapes = 0.0, [(1, 19), (3, 7)]
    for i, shape in enumerate(shapes):
        ids = sample_ids(vocab, shape, seed=1 + i)
        with torch.no_grad():
            ref = model(input_ids=ids, use_cache=False).logits.float().numpy()
        got = sess.run(["logits"], {"input_ids": ids.numpy()})[0]
        if got.shape != ref.shape or not np.isfinite(got).all():
            raise GacError(f"the ONNX export gives logits of shape {got.shape} (finite: {bool(np.isfinite(got).all())}) "
                           f"for input {list(shape)}, the model {ref.shape}; the export is wrong and was not kept")
        worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)))
    if worst > ONNX_TOLERANCE:
        raise GacError(f"the ONNX export's logits differ from the model's by {worst:.2e} of the largest logit (above "
                       f"{ONNX_TOLERANCE:g}); the export is wrong and was not kept")
    return {"engine": "onnxruntime", "version": ort.__version__, "shapes": [list(s) for s in shapes],
            "max_rel_diff": worst}
