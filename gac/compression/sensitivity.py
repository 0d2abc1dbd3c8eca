"""ASVD's sensitivity table: calibration perplexity with one weight at a time truncated to each kept ratio of a grid.

The table is the slowest step of ASVD (224 weights x 6 ratios on Llama-3-8B, 210 x 6 on SmolLM2-135M, each a
calibration perplexity), so it is computed once per (model, calibration, compressor options) and cached with the
prepared state. Two things make one probe cheaper than a full forward without changing its value:

* the layers before the probed weight's layer are unchanged, so their output is computed once per layer and kept
  (the inputs of the current layer for every calibration sample, one layer at a time): a probe of a weight in layer
  ``l`` runs layers ``l .. L-1``, the final norm and the LM head only (on Llama-3-8B about half the work on average);
* the calibration samples go through the layers together, in chunks of at most ``chunk_tokens`` tokens (a batch of
  one sample at a time leaves small GEMMs to a contended thread pool: 94 s instead of 7 s per perplexity on ``tiny``
  on the loaded 2-core CI machine).

* on the CPU the probes use whichever is faster *now*, the thread pool or one thread (:class:`_ThreadChooser`:
  probes of one weight timed alternately, again every :data:`RECHECK_PROBES` probes): on a quiet 2-core machine the
  pool is 1.5-1.9x faster for every probe size measured (tiny 4 x 64 tokens: 2.6 s against 4.3 s for its table;
  SmolLM2-135M 1 x 256 to 32 x 256 tokens per probe, docs/scale.md), while on a busy one its barriers can cost more
  than they save (tiny's 4 x 64 table: 9 s on one thread, 61 s on two at load average 7). The choices made are in
  the table's ``probe`` record.

The dense perplexity (the table's base) is computed through the same cached path, and checked against the plain
full forward (the reference's loop, one sample per forward) on the first :data:`CHECK_SAMPLES` samples: if the two
disagree by more than the tolerance of the model's dtype (:func:`probe_tolerance`; an architecture whose layers need
something the shortcut does not pass) every probe falls back to the plain full forward. The fallback is announced
with a warning and recorded in the table (``probe``: the path taken, the measured disagreement, the tolerance), and
:func:`gac.compression.preparation.prepare` adds it to the prepared state's notes (and so to every record made from it).

When the check fails, the cost estimate made before the search (for the layer-cached probes) no longer holds: the
fallback's cost is estimated again from the check's own timed full forwards (:func:`fallback_estimate`) and checked
against the same limit, so a search that would now take 2x longer is refused before its probes run.

Resuming (``resume=PATH``; :func:`gac.jobs.run.prepared_cache.prepare_cached` keys it by the prepared-state cache key):
each finished row is written to a JSON file atomically as it completes (:class:`RowStore`), and a search that finds
the file of an interrupted one (a Slurm requeue, a killed job) re-uses its rows and probes only the rest. The rows
are kept only when the file was made for the same weights, grid, probe tokens and a dense perplexity equal within
the check's tolerance (the dense base of the saved rows is used, so a resume that runs the same kernels, on the same
device with the same thread count, gives the table an uninterrupted search gives, bit for bit).

``probe_samples``: the probes may run on the first N calibration samples only (ASVD's ``sensitivity_samples``
option; the reference uses all of them). A probe's cost is linear in its tokens; what fewer tokens change in the
chosen allocation is measured in docs/scale.md.
"""

from __future__ import annotations

import logging
import math
import time

import torch
from torch import nn

from gac.compression.allocation import check_sensitivity_grid, reference_rank
from gac.compression.layouts import transform_logits
from gac.compression.swap import replace_module
from gac.devices import model_device
from gac.dtypes import dtype_str
from gac.errors import ConfigRefused, GacError
from gac.faults import fault_point

log = logging.getLogger(__name__)

CHUNK_TOKENS = 16384
RECHECK_PROBES = 120  # probes between two timings of pool against one thread (a multiple of the grid's 6)
ADAPTIVE_THREADS = True  # False: the probes keep torch's thread count (benchmarks that time a fixed count)
CHECK_SAMPLES = 2  # samples on which the layer-cached perplexity is checked against the full forward

# Relative tolerance of the layer-cached dense perplexity against the full forward (GEMMs of other shapes round
# differently): float32 far above its measured ~2e-7 (docs/scale.md), half precision 4 unit roundoffs of the format,
# since another kernel differs by about an ulp per layer. A shortcut that misses a mask or a position moves it far more.
PROBE_RTOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 4 * 2.0 ** -11, torch.bfloat16: 4 * 2.0 ** -8}


class _ThreadChooser:
    """Thread count for the next CPU probe: the pool (torch's setting) or one thread, whichever was faster on the last
    trial (four probes of one weight, alternately, every :data:`RECHECK_PROBES` probes)."""

    TRIAL = 4

    def __init__(self, pool: int, every: int = RECHECK_PROBES):
        self.pool, self.every = int(pool), max(self.TRIAL + 1, int(every))
        self.n, self.best, self.trial = 0, self.pool, {}
        self.used: dict[int, int] = {}
        self.trials: list[dict] = []

    def threads(self) -> int:
        phase = self.n % self.every
        if phase < self.TRIAL:
            return self.pool if phase % 2 == 0 else 1
        return self.best

    def record(self, threads: int, seconds: float) -> None:
        phase = self.n % self.every
        if phase < self.TRIAL:
            self.trial.setdefault(threads, []).append(seconds)
            if phase == self.TRIAL - 1:
                self.best = min(self.trial, key=lambda t: sum(self.trial[t]) / len(self.trial[t]))
                self.trials.append({"probe": self.n, **{f"{t}_threads_s": round(sum(v) / len(v), 4)
                                                         for t, v in self.trial.items()}, "chose": self.best})
                self.trial = {}
        self.used[threads] = self.used.get(threads, 0) + 1
        self.n += 1

    def report(self) -> dict:
        return {"pool": self.pool, "probes_by_threads": {str(k): v for k, v in sorted(self.used.items())},
                "trials": self.trials}


#: the longest sensitivity search that starts without being asked for (seconds): the estimate above it refuses with
#: the options that make the search cheaper. ``GAC_SENSITIVITY_LIMIT`` sets another (``90m``, ``12h``, ``3600``;
#: ``none``: no limit). 2 h: about the reference's search on Llama-3-8B on one GPU; a search of hours on a CPU is
#: almost always a configuration that meant something smaller.
DEFAULT_LIMIT_S = 2 * 3600.0
LIMIT_ENV = "GAC_SENSITIVITY_LIMIT"


def parse_duration(text: str, what: str = LIMIT_ENV) -> float | None:
    """``"90m"``, ``"12h"``, ``"3600"`` / ``"3600s"`` -> seconds; ``"none"``/``"off"`` -> None (no limit)."""
    t = str(text).strip().lower()
    if t in ("none", "off", "inf"):  # 0 is no duration (it read as "no limit" once): refused with the others
        return None
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(t[-1:])
    num = t[:-1] if scale else t
    try:
        v = float(num) * (scale or 1)
    except ValueError:
        v = -1.0
    if not (v > 0 and math.isfinite(v)):
        zero = " (0 would refuse every search)" if v == 0 else ""
        raise GacError(f"{what}={text!r} is not a duration > 0{zero}; write e.g. 90m, 12h or 3600 (seconds), or none "
                       f"for no limit")
    return v


def sensitivity_limit(limit_s: float | None | str = "env") -> float | None:
    """The limit in seconds: ``limit_s`` if given (None: no limit), else ``$GAC_SENSITIVITY_LIMIT``, else
    :data:`DEFAULT_LIMIT_S`."""
    import os

    if limit_s != "env":
        return None if limit_s is None else float(limit_s)
    env = os.environ.get(LIMIT_ENV)
    return parse_duration(env) if env not in (None, "") else DEFAULT_LIMIT_S


def format_duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def count_probes(units: list, grid) -> int:
    """Probes the table will run: every (unit, kept ratio < 1) whose rank saves parameters (as :func:`_table`)."""
    n = 0
    for u in units:
        for g in grid:
            if g < 1 and max(1, reference_rank(u.dense_params, u.params_per_dim, g)) <= u.d_cap:
                n += 1
    return n


@torch.no_grad()
def estimate_cost(model: nn.Module, layout, units: list, grid, calib_ids: torch.Tensor,
                  probe_samples: int | None = None, chunk_tokens: int = CHUNK_TOKENS) -> dict:
    """What the sensitivity table will cost here, before it (and the calibration before it) starts. Timed on this
    machine, now: the decoder layers on one chunk of calibration samples as the probes batch them (after a short
    warm-up), and the LM head on one sample; each probe is then the layers' time per token x the probe's tokens x
    the share of the layers it runs (from the probed weight's layer on; all where a weight lies in no layer), plus
    the head over its tokens. Returns ``{"seconds", "probes", "forward_s", "tokens_per_probe", "model_share",
    "samples", "calibration_samples", "seq_len"}`` (``forward_s``: one whole pass over the probe tokens)."""
    grid = check_sensitivity_grid(grid)
    n_calib, seq = int(calib_ids.shape[0]), int(calib_ids.shape[1])
    n = min(n_calib, int(probe_samples)) if probe_samples is not None else n_calib
    dev = model_device(model)
    parent = layout.layers_path.rpartition(".")[0]
    body = model.get_submodule(parent) if parent else model
    head = model.get_output_embeddings()
    chunk = calib_ids[: max(1, min(n, int(chunk_tokens) // max(1, seq)))].to(dev)

    gpus = {p.device for p in model.parameters() if p.device.type == "cuda"}  # every GPU a spread model runs on

    def timed(fn) -> float:
        for d in gpus:
            torch.cuda.synchronize(d)
        t = time.perf_counter()
        out = fn()
        for d in gpus:
            torch.cuda.synchronize(d)
        return time.perf_counter() - t, out

    was = model.training
    model.eval()
    try:
        body(input_ids=chunk[:1, : min(seq, 16)], use_cache=False)  # warm-up
        layers_s, out = timed(lambda: body(input_ids=chunk, use_cache=False))
        h = out[0] if isinstance(out, tuple) else getattr(out, "last_hidden_state", out)
        head_s = timed(lambda: head(h[0, :-1]).float())[0] if head is not None else 0.0
    finally:
        model.train(was)
    layers_per_token = layers_s / chunk.numel()
    head_per_token = head_s / max(1, seq - 1)
    layers = model.get_submodule(layout.layers_path)
    layer_params = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    total = sum(layer_params) or 1
    tail = [sum(layer_params[i:]) / total for i in range(len(layer_params))]
    share, probes = 0.0, 0
    for u in units:
        k = count_probes([u], grid)
        layer = _layer_of(u, layout)
        share += k * (tail[layer] if layer is not None else 1.0)
        probes += k
    tokens = n * seq
    full = tokens * (layers_per_token + head_per_token)  # one whole pass over the probe tokens
    # the probes, then the dense base, its check and moving the cache through the layers (about three passes)
    seconds = tokens * (layers_per_token * share + head_per_token * probes) + 3 * full
    return {"seconds": seconds, "probes": probes, "forward_s": full, "tokens_per_probe": tokens,
            "model_share": share / probes if probes else 0.0, "samples": n, "calibration_samples": n_calib,
            "seq_len": seq}


def check_cost(estimate: dict, units: list, grid, limit_s: float | None, compressor: str = "asvd") -> str:
    """The line that announces the estimate; :class:`GacError` naming what makes it cheaper when it is above
    ``limit_s`` (None: no limit)."""
    grid = check_sensitivity_grid(grid)
    kept = [g for g in grid if g < 1]
    line = (f"sensitivity search: {estimate['probes']} probes ({len(units)} weights x {len(kept)} kept ratios), each "
            f"{estimate['samples']} x {estimate['seq_len']} calibration tokens through {100 * estimate['model_share']:.0f}% "
            f"of the layers on average: about {format_duration(estimate['seconds'])} here (one timed pass over them: "
            f"{estimate['forward_s']:.3g} s)")
    if limit_s is not None and estimate["seconds"] > limit_s:
        allow = f"{max(1, math.ceil(estimate['seconds'] / 3600 * 1.2))}h"
        raise ConfigRefused(
            f"{line}, above the limit of {format_duration(limit_s)}; make it cheaper with the {compressor} options "
            f"sensitivity_samples=N (probe on N of the {estimate.get('calibration_samples', estimate['samples'])} "
            f"calibration samples; now {estimate['samples']}), a shorter sensitivity_grid "
            f"(now {len(kept)} kept ratios) or layers=START:END (fewer weights), or fewer or shorter calibration "
            f"samples, or skip the search with allocation=proportional (gac compress: --option "
            f"sensitivity_samples=8, --layers, --calib-samples, --allocation; a job: compressor.options.*, "
            f"calibration.n_samples, allocation=); or allow it: --sensitivity-limit {allow} (gac compress) or "
            f"{LIMIT_ENV}={allow}")
    return line


def fallback_estimate(estimate: dict | None, check: dict, probes: int, samples: int, seq_len: int) -> dict:
    """The cost of the search when every probe runs a full forward, from the layer-cache check's own timed full
    forwards (``check["full_s"]`` over ``check["check_samples"]`` samples, one sample per forward as the fallback's
    probes run): ``probes`` probes of ``samples`` samples plus the dense base. ``estimate``: the estimate made before
    the search (for its ``calibration_samples``), or None."""
    per_sample = check["full_s"] / max(1, check["check_samples"])
    full = per_sample * samples
    return {"seconds": (probes + 1) * full, "probes": probes, "forward_s": full, "tokens_per_probe": samples * seq_len,
            "model_share": 1.0, "samples": samples, "seq_len": seq_len, "path": "full_forward",
            "calibration_samples": (estimate or {}).get("calibration_samples", samples),
            "before_check_s": None if estimate is None else estimate["seconds"]}


def probe_tolerance(dtype: torch.dtype) -> float:
    """The relative tolerance of the layer-cache check for a model in ``dtype`` (:data:`PROBE_RTOL`; another dtype:
    float32's)."""
    return PROBE_RTOL.get(dtype, PROBE_RTOL[torch.float32])


def _model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


@torch.no_grad()
def sample_nll(model: nn.Module, calib_ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token NLL of each sample of ``calib_ids`` [n, seq_len] (float64 [n]), one sample per forward: the
    reference's loop (``model(ids, labels=ids).loss`` times the sample's predicted tokens)."""
    dev = model_device(model)
    out = torch.empty(calib_ids.shape[0], dtype=torch.float64)
    for s in range(calib_ids.shape[0]):
        ids = calib_ids[s : s + 1].to(dev)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        out[s] = float(loss) * (ids.shape[1] - 1)
    return out


def _ppl(nll: torch.Tensor, tokens_per_sample: int) -> float:
    return math.exp(float(nll.sum()) / (nll.numel() * tokens_per_sample))


def calibration_perplexity(model: nn.Module, calib_ids: torch.Tensor) -> float:
    """exp(mean next-token NLL) over ``calib_ids`` [n, seq_len], one sample per forward (the reference's loop)."""
    return _ppl(sample_nll(model, calib_ids), calib_ids.shape[1] - 1)


class LayerCache:
    """The inputs of one decoder layer for every calibration sample, and the tail forward from there."""

    @torch.no_grad()
    def __init__(self, model: nn.Module, layout, calib_ids: torch.Tensor, chunk_tokens: int = CHUNK_TOKENS):
        from gac.compression.importance import capture_layer_inputs

        self.model = model
        self.layers = model.get_submodule(layout.layers_path)
        self.norm = model.get_submodule(layout.norm)  # the family's tail: norm -> head -> logit transform
        self.head = model.get_output_embeddings()
        self.transform = (layout.logits, layout.logit_value)
        dev = model_device(model)
        self.ids = calib_ids.to(dev)
        self.targets = self.ids[:, 1:]  # moved to the logits' device at the first probe (below)
        h0, self.kwargs = capture_layer_inputs(model, self.layers, self.ids[:1])
        hidden = [h0] + [capture_layer_inputs(model, self.layers, self.ids[s : s + 1], all_kwargs=False)[0]
                         for s in range(1, self.ids.shape[0])]
        self.hidden = torch.cat(hidden)
        self.layer = 0
        self.chunk = max(1, int(chunk_tokens) // max(1, self.ids.shape[1]))

    def _run(self, h: torch.Tensor, start: int) -> torch.Tensor:
        for i in range(start, len(self.layers)):
            out = self.layers[i](h, **self.kwargs[i])
            h = out[0] if isinstance(out, tuple) else out
        return h

    @torch.no_grad()
    def sample_nll(self) -> torch.Tensor:
        """Summed next-token NLL of each sample (float64 [n]) with the model as it is now, from the cached inputs of
        layer ``self.layer``."""
        out = torch.empty(self.hidden.shape[0], dtype=torch.float64)
        for a in range(0, self.hidden.shape[0], self.chunk):
            h = self.norm(self._run(self.hidden[a : a + self.chunk], self.layer))
            for s in range(h.shape[0]):  # the head one sample at a time: [seq, vocab] logits only
                logits = transform_logits(self.head(h[s, :-1]), *self.transform).float()
                if self.targets.device != logits.device:  # a model spread over devices: the head on the last one
                    self.targets = self.targets.to(logits.device)
                out[a + s] = float(nn.functional.cross_entropy(logits, self.targets[a + s], reduction="sum"))
        return out

    def perplexity(self) -> float:
        """Calibration perplexity with the model as it is now, from the cached inputs of layer ``self.layer``."""
        return _ppl(self.sample_nll(), self.ids.shape[1] - 1)

    @torch.no_grad()
    def advance_to(self, layer: int) -> None:
        """Move the cached inputs forward through the (dense) layers before ``layer``."""
        while self.layer < layer:
            outs = []
            for a in range(0, self.hidden.shape[0], self.chunk):
                out = self.layers[self.layer](self.hidden[a : a + self.chunk], **self.kwargs[self.layer])
                outs.append(out[0] if isinstance(out, tuple) else out)
            self.hidden = torch.cat(outs)
            self.layer += 1


class RowStore:
    """The finished rows of one sensitivity search in a JSON file, rewritten atomically as each row completes, for a
    later search to resume from (module docstring). The file names the weights, the grid and the probe tokens it was
    made for, and the dense perplexity its rows were measured against."""

    VERSION = 1
    MAX_BYTES = 64 << 20

    def __init__(self, path, units: list, grid, samples: int, seq_len: int):
        from pathlib import Path

        self.path = Path(path)
        self.ident = {"version": self.VERSION, "units": [u.name for u in units], "grid": [float(g) for g in grid],
                      "samples": int(samples), "seq_len": int(seq_len)}
        self.rows: dict[str, list[float]] = {}
        self.base_ppl: float | None = None
        self.broken = False

    def load(self, base_ppl: float, tolerance: float) -> dict[str, list[float]]:
        """The rows an earlier search of the same weights, grid and probe tokens saved, when its dense perplexity
        equals ``base_ppl`` within ``tolerance`` (relative); sets :attr:`base_ppl` to the one to use (the saved one
        when rows are kept). Anything else is reported and ignored: the search starts afresh."""
        from gac.io import read_json

        self.base_ppl, self.rows = float(base_ppl), {}
        if not self.path.exists():
            return {}
        try:
            doc = read_json(self.path, "sensitivity resume file", max_bytes=self.MAX_BYTES)
        except GacError as e:
            log.warning("sensitivity: ignoring the resume file: %s", e)
            return {}
        if not isinstance(doc, dict) or any(doc.get(k) != v for k, v in self.ident.items()):
            log.warning("sensitivity: ignoring %s: it was made for other weights, grid or probe tokens", self.path)
            return {}
        saved = doc.get("base_ppl")
        if not (isinstance(saved, float) and math.isfinite(saved) and saved > 0):
            log.warning("sensitivity: ignoring %s: no valid dense perplexity", self.path)
            return {}
        rel = abs(saved - base_ppl) / base_ppl
        if rel > tolerance:
            log.warning("sensitivity: ignoring %s: its dense perplexity %.6f differs from this run's %.6f by %.2e "
                        "relative (tolerance %.1e)", self.path, saved, base_ppl, rel, tolerance)
            return {}
        n = len(self.ident["grid"])
        rows = doc.get("rows")
        if not isinstance(rows, dict):
            return {}
        self.rows = {k: [float(v) for v in r] for k, r in rows.items()
                     if k in self.ident["units"] and isinstance(r, list) and len(r) == n
                     and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in r)}
        self.base_ppl = saved
        return dict(self.rows)

    def save(self, name: str, row: list[float]) -> None:
        """Add ``row`` and rewrite the file atomically (a failed write is reported once; the search goes on)."""
        from gac.io import write_json_atomic

        self.rows[name] = [float(v) for v in row]
        if self.broken:
            return
        try:
            write_json_atomic(self.path, {**self.ident, "base_ppl": self.base_ppl, "rows": self.rows},
                              overwrite=True)
        except GacError as e:
            self.broken = True
            log.warning("sensitivity: cannot save the finished rows for a resume (%s); the search goes on", e)


def _layer_of(unit, layout) -> int | None:
    layer = unit.meta.get("layer")
    if isinstance(layer, int):
        return layer
    try:
        return layout.layer_of(unit.modules[0])
    except Exception:  # noqa: BLE001 - any failure means: no layer shortcut for this unit
        return None


@torch.no_grad()
def sensitivity_table(model: nn.Module, comp, units: list, factors: dict, calib_ids: torch.Tensor, grid,
                      layout=None, progress_every: int = 1, chunk_tokens: int = CHUNK_TOKENS,
                      probe_samples: int | None = None, keep_samples: bool = False, resume=None,
                      limit_s: float | None = None, estimate: dict | None = None) -> dict:
    """ASVD's sensitivity table: calibration perplexity with one unit at a time truncated to each kept parameter
    ratio in ``grid`` (the reference's rank ``int(g * |W|) // params_per_dim``; a ratio of 1, or a rank that would
    not save parameters, is the dense model), every other unit dense. Logs one line per ``progress_every`` units
    with the elapsed time and an ETA.

    ``probe_samples``: probe on the first N samples of ``calib_ids`` only (None: all, the reference).
    ``keep_samples``: also return every probe's per-sample summed NLL (``sample_nll[i][k]``, a list per sample, and
    ``base_sample_nll``), for studies of what fewer probe samples change (no resume then).
    ``resume``: the path of the file that keeps the finished rows (:class:`RowStore`; None: none kept).
    ``limit_s``: when the layer-cache check fails, the full-forward search's cost is estimated again
    (:func:`fallback_estimate`) and :class:`GacError` raised above this limit (None: not checked); ``estimate``: the
    estimate made before the search (:func:`estimate_cost`), for the message.

    Returns ``{"grid", "base_ppl", "table", "probe"}`` (``table[i][k]``: unit i, ratio k; ``probe``: the path the
    probes took, ``layer_cache`` or ``full_forward``, with the check's measured disagreement, its tolerance and
    why a fallback happened, the probe tokens, the rows taken from the resume file (``resumed_rows``) and, after a
    fallback, its estimated cost ``fallback_estimate_s``).
    """
    grid = check_sensitivity_grid(grid)
    if probe_samples is not None:
        n = int(probe_samples)
        if not 1 <= n <= calib_ids.shape[0]:
            raise GacError(f"sensitivity: probe_samples={probe_samples} is outside 1..{calib_ids.shape[0]} (the "
                           f"calibration samples); lower sensitivity_samples or raise calibration.n_samples")
        calib_ids = calib_ids[:n]
    was = model.training
    model.eval()
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    try:
        store = None
        if resume is not None and not keep_samples:
            store = RowStore(resume, units, grid, calib_ids.shape[0], calib_ids.shape[1])
        return _table(model, comp, units, factors, calib_ids, grid, layout, progress_every, chunk_tokens, t0,
                      keep_samples, store, limit_s, estimate)
    finally:
        torch.set_num_threads(threads)
        model.train(was)


def _check_cache(model, cache: LayerCache, calib_ids: torch.Tensor, base_nll: torch.Tensor) -> dict:
    """The layer-cached dense NLL against the plain full forward on the first :data:`CHECK_SAMPLES` samples."""
    k = min(CHECK_SAMPLES, calib_ids.shape[0])
    seq = calib_ids.shape[1] - 1
    t = time.perf_counter()
    full = _ppl(sample_nll(model, calib_ids[:k]), seq)  # float() of each loss: synchronised with the device
    full_s = time.perf_counter() - t
    fast = _ppl(base_nll[:k], seq)
    dtype = _model_dtype(model)
    tol = probe_tolerance(dtype)
    rel = abs(fast - full) / abs(full) if full else math.inf
    return {"dtype": dtype_str(dtype), "check_samples": k, "cached_ppl": fast, "full_ppl": full,
            "rel_diff": rel, "tolerance": tol, "ok": bool(rel <= tol), "full_s": full_s}


def _table(model, comp, units, factors, calib_ids, grid, layout, progress_every, chunk_tokens, t0,
           keep_samples=False, store: RowStore | None = None, limit_s: float | None = None,
           estimate: dict | None = None) -> dict:
    from gac.compression.discovery import discover

    layout = layout or discover(model)
    layers = [_layer_of(u, layout) for u in units]
    cache = check = None
    order = list(range(len(units)))
    probe: dict = {"samples": int(calib_ids.shape[0]), "seq_len": int(calib_ids.shape[1])}
    base_nll = None
    if all(x is not None for x in layers):
        order.sort(key=lambda i: layers[i])  # probe layer by layer; the table keeps the units' order
        cache = LayerCache(model, layout, calib_ids, chunk_tokens)
        base_nll = cache.sample_nll()
        check = _check_cache(model, cache, calib_ids, base_nll)
        probe.update(check)
        if check["ok"]:
            probe["path"] = "layer_cache"
        else:
            why = (f"the layer-cached perplexity ({check['cached_ppl']:.6f}) differs from the full forward "
                   f"({check['full_ppl']:.6f}) by {check['rel_diff']:.2e} relative, more than the {check['dtype']} "
                   f"tolerance {check['tolerance']:.1e}")
            log.warning("sensitivity: %s; probing with full forwards (slower: every probe runs the whole model)", why)
            probe.update(path="full_forward", why=why)
            cache = base_nll = None
    else:
        missing = [u.name for u, x in zip(units, layers) if x is None]
        why = f"{len(missing)} weight(s) lie in no decoder layer (e.g. {missing[0]})"
        log.warning("sensitivity: %s; probing with full forwards (slower: every probe runs the whole model)", why)
        probe.update(path="full_forward", why=why)
    if base_nll is None:
        base_nll = sample_nll(model, calib_ids)
    seq = calib_ids.shape[1] - 1
    base = _ppl(base_nll, seq)
    done_rows: dict = {}
    if store is not None:
        done_rows = store.load(base, probe_tolerance(_model_dtype(model)))
        base = store.base_ppl  # the saved rows' dense base (equal within the check's tolerance)
        probe["resumed_rows"] = len(done_rows)
        if done_rows:
            log.info("sensitivity: resuming with %d of %d rows saved by an interrupted search (%s)", len(done_rows),
                     len(units), store.path)
    if check is not None and not check["ok"]:  # the estimate before the search was for the layer-cached probes
        left = [u for u in units if u.name not in done_rows]
        est = fallback_estimate(estimate, check, count_probes(left, grid), int(calib_ids.shape[0]), seq + 1)
        probe["fallback_estimate_s"] = est["seconds"]
        try:
            line = check_cost(est, left or units, grid, limit_s, comp.name)
        except GacError as e:
            raise GacError(f"the layer-cache check failed, so every probe would run a full forward: {e}") from None
        log.warning("sensitivity: with full forwards the %s", line.removeprefix("sensitivity search: "))
    n_probe = sum(g < 1 for g in grid)
    log.info("sensitivity: %d weights x %d kept ratios %s on %d x %d calibration tokens (dense perplexity %.3f)%s",
             len(units), n_probe, list(grid), calib_ids.shape[0], calib_ids.shape[1], base,
             "" if cache else "; full forward per probe")
    table: list = [None] * len(units)
    samples: list = [None] * len(units)
    dev = model_device(model)
    pool = torch.get_num_threads()
    chooser = _ThreadChooser(pool, RECHECK_PROBES) if ADAPTIVE_THREADS and dev.type == "cpu" and pool > 1 else None
    for done, k in enumerate(order, start=1):
        u = units[k]
        if u.name in done_rows:  # finished by an interrupted search
            table[k] = done_rows[u.name]
            continue
        if cache is not None:
            cache.advance_to(layers[k])
        row, srow = [], []
        for g in grid:
            d = max(1, reference_rank(u.dense_params, u.params_per_dim, g)) if g < 1 else None
            if d is None or d > u.d_cap:  # dense: ratio 1, or the factorisation would not save parameters
                row.append(base)
                srow.append(base_nll)
                continue
            old = comp.apply(model, units, {u.name: d}, factors)
            try:
                if chooser is not None:
                    th = chooser.threads()
                    torch.set_num_threads(th)
                tp = time.perf_counter()
                nll = cache.sample_nll() if cache is not None else sample_nll(model, calib_ids)
                if chooser is not None:
                    chooser.record(th, time.perf_counter() - tp)
            finally:
                for n, m in old.items():
                    replace_module(model, n, m)
            row.append(_ppl(nll, seq))
            srow.append(nll)
        if not all(math.isfinite(v) for v in row):
            raise GacError(f"sensitivity: non-finite calibration perplexity for {u.name} ({row}); the truncated "
                           f"model diverges: check the calibration data or use allocation='proportional'")
        table[k] = row
        samples[k] = [x.tolist() for x in srow]
        if store is not None:
            store.save(u.name, row)
            fault_point("sensitivity_row")
        if done % max(1, progress_every) == 0 or done == len(units):
            el = time.perf_counter() - t0
            log.info("sensitivity %d/%d %s: ppl %s; %.0fs elapsed, ETA %.0fs", done, len(units), u.name,
                     " ".join(f"{v:.2f}" for v in row), el, el / done * (len(units) - done))
    if chooser is not None:
        torch.set_num_threads(pool)
        probe["threads"] = chooser.report()
    out = {"grid": list(grid), "base_ppl": base, "table": table, "probe": probe}
    if keep_samples:
        out.update(sample_nll=samples, base_sample_nll=base_nll.tolist())
    return out
