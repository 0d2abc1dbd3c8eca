"""How much memory a compression job needs, estimated from the model's config before anything is loaded.

:func:`estimate_footprint` adds up, in bytes, what :func:`gac.compression.preparation.prepare` holds at its peak on the
job's device (and on the host, where the factors are kept):

* **weights**: every parameter in the job's dtype (counted exactly on a meta-device copy of the architecture);
* **calibration**: the hidden states of all calibration samples at one layer (``n * seq_len * hidden``) plus one
  forward through one layer (its projections' inputs and outputs, the float64 copies the statistics take) of one
  sample, or of several short ones together (up to :data:`~gac.compression.importance.CALIB_CHUNK_TOKENS` tokens);
* **statistics**: one decoder layer's float64 ``X^T X`` / ``Y^T Y`` (what the compressor asks for; streaming drops
  them once the layer is factorised, ``stream=False`` keeps every layer's);
* **factorisation**: the working set of the largest weight's factorisation in its method's precision;
* **gradients** (gradient/Fisher proxies, LLM-Pruner): one sample's activations kept for the backward (every layer,
  or with ``grad_checkpoint`` the layers' inputs plus one layer), the logits with their float32 loss and gradient,
  and one weight's gradient with the hook's float32 temporaries; with an element-wise proxy (``taylor``,
  ``fisher_rms``: :data:`~gac.compression.importance.ELEMENTWISE`) also one float32 running sum per weight element
  of the scored projections, held for the whole pass;
* **scores**: what the compressor's scores or allocation read at once (:meth:`Compressor.scoring_bytes
  <gac.compression.compressors.base.Compressor.scoring_bytes>`: ``stable_rank_svd``'s SVD of every Linear, the LM
  head's the largest), while the factors are held;
* **factors**: the low-rank factors at the rank the compressor keeps them until apply (:meth:`Compressor.factor_rank
  <gac.compression.compressors.base.Compressor.factor_rank>`: each weight's break-even rank, about the compressed
  weights' own size; ``stable_rank_svd`` the full rank) in float32, kept on the host (on a GPU job the host also
  holds the weights while the model loads, before it moves to the GPU: the host's peak is the larger of the two);
* a fixed process overhead (the Python interpreter, torch and transformers: ``BASE_MB``) and the tokenizer
  (:data:`TOKENIZER_BYTES_PER_TOKEN` per vocabulary entry), on the host: ``base``;
* on a CPU job, a margin for what the C allocator keeps of freed memory (:data:`ALLOCATOR_RETENTION` of the
  working set, ``retention``): the resident set a job is limited by holds it, torch's tensors do not, and how much
  stays depends on the order of allocations, not on shapes alone;
* **evaluation** (with ``evaluation=EvalLoad(...)``, what a job evaluates after compressing, or the whole work of
  the uncompressed baseline, ``compressor="none"``): the largest of perplexity (one batch of windows through a
  layer, the decoder's last hidden states, the chunked loss: :data:`LOSS_CHUNK_BYTES` of float32 logits, which
  :mod:`gac.evaluation.perplexity` scores at once), the lm-eval tasks (a batch of requests' full logits and their
  log-softmax) and the prefill latency (one forward at its largest point, full logits).

The activation terms use per-token element counts of a Llama decoder layer's saved tensors
(:data:`ACT_PER_TOKEN_H`, :data:`ACT_PER_TOKEN_I`); ``benchmarks/scale.py`` prints each run's estimate beside the
measured peak (docs/scale.md). :func:`check_fits` turns an estimate above what the device has into a
:class:`~gac.errors.GacError` naming the estimate and what to change. For a model spread over devices
(``model.device_map=auto``) the working set is also given by where it lives (``per_device``, ``per_layer``,
``at_head``), so that each device keeps free only what its own layers need (:func:`gac.models.placement.working_set`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.registry import BASELINE
from gac.text import CALIBRATION_SAMPLES, CALIBRATION_SEQ_LEN
from gac.transformers_lock import transformers_lock

log = logging.getLogger(__name__)

MB = 1024.0 * 1024.0
GB = 1024.0 * MB
BASE_MB = 600.0  # interpreter + torch + transformers, measured RSS after import (~390-550 MB)
#: host bytes of a loaded tokenizer per vocabulary entry: measured RSS 322 MiB for gemma3's 262,144 entries (1,289
#: bytes each), 99 MiB for smollm2's 49,152 (with ~50 MiB of the tokenizer modules' import, in BASE_MB)
TOKENIZER_BYTES_PER_TOKEN = 1300
#: freed memory glibc keeps mapped, as a share of the working set (a CPU job's resident set): after LLM-Pruner's
#: gradient pass on gemma3 (923 MiB estimated, ~880 MiB of tensors) the resident set held 210-430 MiB more than
#: its tensors over three runs; not predictable from shapes (it depends on the order of allocations and frees)
ALLOCATOR_RETENTION = 0.5
# Saved-for-backward elements per token of one Llama decoder layer, in units of hidden (h) and intermediate (I)
# widths: norms' inputs and outputs, q/k/v after rotary, attention output, o_proj input, residuals (~10 h); gate and
# up outputs, the activation, the product, down_proj's input (~5 I). Checked against measured peaks (docs/scale.md).
ACT_PER_TOKEN_H, ACT_PER_TOKEN_I = 10, 5
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# Inference (no autograd) transients per token of one decoder layer: residual, norm output, q/k/v, attention output
# (~6 h); gate, up and their product (~3 I). The fused SDPA kernels hold no seq_len^2 scores.
INF_PER_TOKEN_H, INF_PER_TOKEN_I = 6, 3
#: float32 logits the perplexity loss scores at once (gac.evaluation.perplexity reads it; its evaluation term here)
LOSS_CHUNK_BYTES = 2**30
TASK_TOKENS = 256  # tokens per lm-eval request assumed (PiQA / HellaSwag requests are shorter)


@dataclass(frozen=True)
class EvalLoad:
    """What a job evaluates: perplexity batch x window, lm-eval task batch, prefill (batch, seq_len) points."""

    ppl_batch: int = 0
    ppl_seq_len: int = 2048
    task_batch: int = 0
    latency_points: tuple = ()  # ((batch, seq_len), ...)


def _evaluation_parts(config, dtype: str, load: EvalLoad) -> list[tuple[int, int]]:
    """``(through the layers, at the LM head)`` bytes of each evaluation of ``load``: the batch through one decoder
    layer with the hidden states, and the logits with their loss."""
    s = _evaluated_shapes(config)
    h, inter, V = s["h"], s["inter"], s["V"]
    b = _BYTES.get(dtype_str(dtype), 4)
    layer = INF_PER_TOKEN_H * h + INF_PER_TOKEN_I * inter
    out = []
    if load.ppl_batch:
        tok = load.ppl_batch * load.ppl_seq_len
        out.append((tok * (layer + 2 * h) * b, 3 * min(tok * V * 4, LOSS_CHUNK_BYTES)))
    if load.task_batch:
        tok = load.task_batch * TASK_TOKENS
        out.append((tok * layer * b, tok * V * (2 * b + 4)))  # logits, their log-softmax, a float32 copy
    for bt, sl in load.latency_points:
        tok = int(bt) * int(sl)
        out.append((tok * (layer + h) * b, tok * V * b))
    return out


def evaluation_bytes(config, dtype: str, load: EvalLoad) -> int:
    """Peak working set of the evaluation ``load`` on a model of ``config`` (module docstring), beyond the weights."""
    return int(max((a + h for a, h in _evaluation_parts(config, dtype, load)), default=0))


@dataclass
class Footprint:
    """Estimated peak bytes by component; ``device_bytes`` on the job's device, ``host_bytes`` on the host."""

    device: str
    dtype: str
    params: int
    weights: int
    calibration: int
    statistics: int
    factorization: int
    gradients: int
    factors: int
    base: int
    device_bytes: int
    host_bytes: int
    evaluation: int = 0
    # the working set by where it lives, for a model spread over devices (gac.models.placement.working_set): on
    # every device that runs a layer (the largest per-layer transient: calibration, statistics and factorisation of
    # one layer, one weight's gradient, one layer's evaluation, the scores of one layer's weights), with each decoder
    # layer for the whole pass (its activations kept for the backward, its element-wise gradient sums), and with the
    # LM head (the logits, or the scores of the head)
    per_device: int = 0
    per_layer: int = 0
    at_head: int = 0
    retention: int = 0  # a CPU job's margin for the allocator's retained memory (ALLOCATOR_RETENTION)

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"weights {self.weights / GB:.1f}", f"calibration {self.calibration / GB:.2f}",
                 f"statistics {self.statistics / GB:.2f}", f"factorisation {self.factorization / GB:.2f}"]
        if self.gradients:
            parts.append(f"gradients {self.gradients / GB:.2f}")
        parts.append(f"factors {self.factors / GB:.2f}")
        if self.evaluation:
            parts.append(f"evaluation {self.evaluation / GB:.2f}")
        return ", ".join(parts) + " GiB"


def _shapes(config) -> dict:
    """The widths the estimate reads, and one decoder layer's projections ``(out, in)`` by role, from the model's
    layout (:func:`~gac.compression.discovery.discover_config`: its family's, on the meta device), never from config
    fields a family may lack (GPT-2 has no ``intermediate_size``)."""
    from gac.compression.discovery import discover_config

    lay = discover_config(config)
    lin = {p.role: (p.out_features, p.in_features) for p in lay.projections if p.layer == 0}
    block = lay.experts_of(0)
    if block is not None:  # the experts of a mixture-of-experts layer, all of them
        E, H, w = block.num_experts, block.hidden, block.width
        lin.update(experts_gate_up=(E * 2 * w, H), experts_down=(H, E * w))
    q, kv = lay.num_heads * lay.head_dim, lay.num_kv_heads * lay.head_dim
    return {"h": lay.hidden_size, "inter": lay.intermediate_size, "L": lay.num_layers, "V": lay.vocab_size, "q": q,
            "kv": kv, "lin": lin}


def _evaluated_shapes(config) -> dict:
    """The widths an evaluation's estimate reads: from the family's layout (:func:`_shapes`), or, for a causal LM
    gac has no layout for (Bloom, DeepSeek-V3: evaluated, never compressed), read off its architecture on the
    ``meta`` device: the embedding's rows and width, and the widest weight dimension that is not the vocabulary
    (an MLP's, as an upper bound of one layer's transients)."""
    from gac.compression.layouts import family_of

    try:
        family_of(config)
    except GacError:
        pass
    else:
        return _shapes(config)
    from gac.compression.discovery import skeleton

    model = skeleton(config)
    emb = model.get_input_embeddings().weight
    V, h = (int(x) for x in emb.shape)
    widths = [int(x) for p in model.parameters() if p.dim() >= 2 for x in p.shape[-2:] if int(x) != V]
    return {"h": h, "inter": max(widths, default=h), "V": V}


def _host_base(config) -> int:
    """The fixed host part of a job: the process (``BASE_MB``) and its tokenizer (by the vocabulary's size)."""
    return int(BASE_MB * MB) + TOKENIZER_BYTES_PER_TOKEN * int(_evaluated_shapes(config)["V"])


@transformers_lock()
def count_params(config) -> int:
    """Exact parameter count of ``config``'s causal LM (built on the meta device: no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _linears(s: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of one decoder layer's projections, by role."""
    return s["lin"]


def _scored_params(comp, s: dict, lin: dict) -> tuple[int, int]:
    """``(layers, elements per layer)`` of the projections the gradient pass scores (its statistics modules), from
    shapes alone."""
    projs = comp.scored_roles if comp.scored_roles is not None else _roles(comp, lin)
    return len(comp.layer_indices(s["L"])), sum(o * i for p, (o, i) in lin.items() if p in projs)


def _roles(comp, lin: dict) -> tuple[str, ...]:
    """The roles a compressor's ``projections`` option names (None: every projection of the layer)."""
    from gac.compression.layouts import ROLES, role_of

    named = getattr(comp, "projections", None)
    return tuple(role_of(str(p)) for p in named) if named is not None else tuple(r for r in lin if r in ROLES)


def estimate_footprint(config, compressor: str, *, dtype: str = "float32", device: str = "cpu",
                       n_samples: int = CALIBRATION_SAMPLES, seq_len: int = CALIBRATION_SEQ_LEN, proxy: str | None = None, compressor_options: dict | None = None,
                       stream: bool = True, grad_checkpoint: bool = False, params: int | None = None,
                       evaluation: EvalLoad | None = None) -> Footprint:
    """The estimated peak memory of ``prepare`` for ``compressor`` on a model of ``config`` (see module docstring);
    ``compressor="none"``: the uncompressed baseline (weights and ``evaluation`` only)."""
    from gac.compression.compressors import get_compressor
    from gac.compression.compressors.lowrank_math import DEFAULT_SVD
    from gac.compression.proxies import get_proxy

    ev = 0 if evaluation is None else evaluation_bytes(config, dtype, evaluation)
    ev_parts = [] if evaluation is None else _evaluation_parts(config, dtype, evaluation)
    ev_layer, ev_head = (max(x) for x in zip(*ev_parts)) if ev_parts else (0, 0)
    if compressor == BASELINE:
        P = params if params is not None else count_params(config)
        weights = P * _BYTES.get(dtype_str(dtype), 4)
        base = _host_base(config)
        on_gpu = str(device).startswith("cuda")
        retention = 0 if on_gpu else int(ALLOCATOR_RETENTION * ev)
        device_bytes = weights + ev if on_gpu else base + weights + ev + retention
        return Footprint(str(device), str(dtype), int(P), int(weights), 0, 0, 0, 0, 0, base, int(device_bytes),
                         int(base + weights if on_gpu else device_bytes), int(ev),  # loaded on the host first
                         per_device=int(ev_layer), at_head=int(ev_head), retention=retention)
    comp = get_compressor(compressor, **(compressor_options or {}))
    prox = get_proxy(proxy or comp.default_proxy)
    b = _BYTES.get(dtype_str(dtype), 4)
    s = _shapes(config)
    h, inter, L, V = s["h"], s["inter"], s["L"], s["V"]
    P = params if params is not None else count_params(config)
    lin = _linears(s)
    method = getattr(comp, "svd", DEFAULT_SVD)
    lowrank = comp.low_rank  # the compressor's own kind: a new low-rank compressor is counted without a list here

    need_act = comp.needs_act or comp.needs_xtx or "act" in prox.needs
    need_grad = "grad" in prox.needs
    calibration = 0
    if need_act:
        from gac.compression.importance import CALIB_CHUNK_TOKENS

        t = seq_len * max(1, min(n_samples, CALIB_CHUNK_TOKENS // max(1, seq_len)))  # tokens of one layer forward
        inputs = t * (3 * h + inter) * b  # the distinct projection inputs of one forward at one layer
        f64 = 2 * t * max(h, inter) * 8  # float64 copy of the widest input and its square
        calibration = n_samples * seq_len * h * b + t * (4 * h + 3 * inter + 2 * s["kv"]) * b + inputs + f64
    statistics = 0
    if comp.needs_xtx and comp.xtx_of == "whitening":
        if method.startswith("gram"):  # X^T X where out > in (gate/up share it), Y^T Y where out <= in
            ins = {h} if any(o > i for o, i in lin.values()) else set()
            statistics = 8 * (sum(n * n for n in ins) + sum(o * o for o, i in lin.values() if o <= i))
        else:  # X^T X per distinct input: q/k/v, o, gate/up, down
            statistics = 8 * (h * h + s["q"] ** 2 + h * h + inter * inter)
    elif comp.needs_xtx and comp.xtx_of == "kv":  # k_proj and v_proj share their input
        statistics = 8 * h * h
    elif comp.needs_xtx:
        statistics = 8 * (h * h + s["q"] ** 2 + h * h + inter * inter)
    if not stream:
        statistics *= L
    factorization = 0
    if lowrank:
        c = 4 if method in ("gram32", "randomized") else 8
        for o, i in (v for r, v in lin.items() if r in _roles(comp, lin)):
            mn, lo = o * i, min(o, i)
            k = comp.factor_rank(o, i)
            if method == "exact":
                ws = (2 * mn + o * lo + lo * i + 4 * lo * lo) * 8
            elif comp.xtx_of == "whitening" and o > i:  # through the whitening, float64
                ws = (2 * mn + 4 * i * i) * 8 + k * (o + i) * 8
            else:
                ws = 2 * mn * c + 3 * lo * lo * c + k * (o + i) * c
            factorization = max(factorization, ws + k * (o + i) * 4)
    gradients = grad_device = grad_layer = logits = 0
    if need_grad:
        per_layer = seq_len * (ACT_PER_TOKEN_H * h + ACT_PER_TOKEN_I * inter) * b
        acts = (L * seq_len * h * b + per_layer) if grad_checkpoint else L * per_layer
        logits = seq_len * V * (b + 12)  # lm_head output, float32 copy, log-softmax, its gradient
        one_grad = max(o * i for o, i in lin.values()) * (b + 16)  # a weight's gradient and the hook's float32 temps
        scored_layers, scored_per_layer = _scored_params(comp, s, lin)
        sums = len(prox.elementwise) * 4 * scored_per_layer  # the element-wise running sums of one scored layer
        gradients = acts + logits + one_grad + scored_layers * sums
        # spread over devices: each layer keeps its own activations (with checkpointing, its input; the layer being
        # recomputed is a transient) and, when scored, its sums (counted for every layer: an upper bound)
        grad_layer = (seq_len * h * b if grad_checkpoint else per_layer) + (sums if scored_layers else 0)
        grad_device = one_grad + (per_layer if grad_checkpoint else 0)
    factors = 0
    if lowrank:
        targets = _roles(comp, lin)
        factors = L * sum(comp.factor_rank(o, i) * (o + i) * 4 for p, (o, i) in lin.items() if p in targets)
    # what its scores or allocation read at once (the stable-rank SVD of every Linear, the LM head's the largest),
    # while the factors are held: over every Linear, and over one layer's alone (a model spread over devices)
    scoring = comp.scoring_bytes([*lin.values(), (V, h)], b)
    scoring_layer = comp.scoring_bytes(list(lin.values()), b)
    weights = P * b
    base = _host_base(config)
    work = max(calibration + statistics + factorization, gradients, ev, scoring)
    on_gpu = str(device).startswith("cuda")
    retention = 0 if on_gpu else int(ALLOCATOR_RETENTION * work)
    if on_gpu:
        device_bytes = weights + work
        host_bytes = base + max(factors, weights)  # gac.models loads on the host, then moves the model to the GPU
    else:
        device_bytes = host_bytes = base + weights + factors + work + retention
    return Footprint(str(device), str(dtype), int(P), int(weights), int(calibration), int(statistics),
                     int(factorization), int(gradients), int(factors), base, int(device_bytes), int(host_bytes), int(ev),
                     per_device=int(max(calibration + statistics + factorization, grad_device, ev_layer,
                                        scoring_layer)),
                     per_layer=int(grad_layer), at_head=int(max(logits, ev_head, scoring)), retention=retention)


def check_fits(fp: Footprint, available: dict[str, float | None], host_available_mb: float | None = None,
               what: str = "this job") -> None:
    """Raise :class:`GacError` when ``fp`` needs more than ``available`` (``resources.device_memory``) holds.

    This is the check of a model on one device: a model whose weights alone exceed the GPU's total memory
    (Llama-3-70B in fp16, ~131 GiB, on any single A100/H100) is refused here, before a long load that would end in
    an out-of-memory error. A job with ``model.device_map=auto`` is checked over all its devices instead
    (:func:`gac.models.placement.check_placed_fits`)."""
    need_dev = fp.device_bytes / MB
    have = available.get("available_mb")
    total = available.get("total_mb")
    on_gpu = str(fp.device).startswith("cuda")
    if on_gpu and total is not None and fp.weights / MB > total:
        raise GacError(
            f"{what} will not fit: its weights alone take about {fp.weights / GB:.1f} GiB ({fp.dtype}) but "
            f"{available.get('device', fp.device)} has {total / 1024:.1f} GiB in all; this job runs the model on one GPU, "
            f"so spread it over the node's GPUs (model.device_map=auto; latency is then not measured), use a GPU "
            f"with at least {fp.device_bytes / GB:.0f} GiB, a smaller model, or model.random_weights=true with fewer "
            f"layers (model.arch.num_hidden_layers) for latency studies")
    problems = []
    if have is not None and need_dev > have:
        problems.append(f"{'GPU' if on_gpu else 'host'} memory: needs about {need_dev / 1024:.1f} GiB, "
                        f"{have / 1024:.1f} GiB available on {available.get('device', fp.device)}")
    if on_gpu and host_available_mb is not None and fp.host_bytes / MB > host_available_mb:
        problems.append(f"host memory (the weights while loading, the factors): needs about {fp.host_bytes / GB:.1f} GiB, "
                        f"{host_available_mb / 1024:.1f} GiB available")
    if not problems:
        return
    raise GacError(f"{what} will not fit: {'; '.join(problems)} (estimate: {fp.summary()}); try "
                   + ", or ".join(memory_fixes(fp)) + " (see docs/scale.md)")


def memory_fixes(fp: Footprint) -> list[str]:
    """What would make ``fp`` smaller (the advice of :func:`check_fits` and of an out-of-memory error)."""
    on_gpu = str(fp.device).startswith("cuda")
    fixes = []
    if fp.dtype == "float32":
        fixes.append("a 16-bit dtype (gpu.dtype=bfloat16) halves the weights")
    if not on_gpu:
        fixes.append("a GPU (gpu=h100) holds the weights and working set off the host")
    if fp.calibration > 0.05 * fp.device_bytes:
        fixes.append("fewer calibration samples (calibration.n_samples) or a shorter calibration.seq_len")
    if fp.gradients > 0.2 * fp.device_bytes:
        fixes.append("a shorter calibration.seq_len (the gradient pass holds one sample's activations and logits)")
    if fp.evaluation > 0.2 * fp.device_bytes:
        fixes.append("a smaller evaluation batch (eval.batch_size) or shorter latency points")
    fixes.append("a smaller model or fewer layers (compressor.options.layers)")
    return fixes
