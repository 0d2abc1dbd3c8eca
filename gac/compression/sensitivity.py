"""ASVD's sensitivity table: calibration perplexity with one weight at a time truncated to each kept ratio of a grid.

The table is the slowest step of ASVD (224 weights x 6 ratios on Llama-3-8B, each a calibration perplexity), so it is
computed once per (model, calibration, compressor options) and cached with the prepared state. Two things make one
probe cheaper than a full forward without changing its value:

* the layers before the probed weight's layer are unchanged, so their output is computed once per layer and kept
  (the inputs of the current layer for every calibration sample, one layer at a time): a probe of a weight in layer
  ``l`` runs layers ``l .. L-1``, the final norm and the LM head only (on Llama-3-8B about half the work on average);
* the calibration samples go through the layers together, in chunks of at most ``chunk_tokens`` tokens (a batch of
  one sample at a time leaves small GEMMs to a contended thread pool: 94 s instead of 7 s per perplexity on ``tiny``
  on the loaded 2-core CI machine).

* on the CPU, small probes (hidden size x chunk tokens up to ``SMALL_CPU_WORK``) run on one thread: on a busy
  machine the thread pool's barriers cost more than they save (tiny's table with 4 x 64 calibration tokens: 9 s on
  one thread, 61 s on two, measured at load average 7 on the 2-core CI machine).

The first perplexity (the dense model) is computed both ways; if they disagree (an architecture whose layers need
something the shortcut does not pass) every probe falls back to the plain full forward, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time

import torch
from torch import nn

from gac.compression.allocation import check_sensitivity_grid, reference_rank
from gac.compression.modules import replace_module
from gac.errors import GacError

log = logging.getLogger(__name__)

CHUNK_TOKENS = 16384
SMALL_CPU_WORK = 1 << 22  # hidden_size * tokens per chunk below which CPU probes run single-threaded


@contextlib.contextmanager
def _threads_for(model: nn.Module, calib_ids: torch.Tensor, chunk_tokens: int):
    dev = next(model.parameters()).device
    hidden = int(getattr(getattr(model, "config", None), "hidden_size", 0) or 0)
    work = hidden * min(int(calib_ids.numel()), int(chunk_tokens))
    old = torch.get_num_threads()
    small = dev.type == "cpu" and work <= SMALL_CPU_WORK and old > 1
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small:
            torch.set_num_threads(old)


@torch.no_grad()
def calibration_perplexity(model: nn.Module, calib_ids: torch.Tensor) -> float:
    """exp(mean next-token NLL) over ``calib_ids`` [n, seq_len], one sample per forward (the reference's loop)."""
    dev = next(model.parameters()).device
    nll, n = 0.0, 0
    for s in range(calib_ids.shape[0]):
        ids = calib_ids[s : s + 1].to(dev)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        nll += float(loss) * (ids.shape[1] - 1)
        n += ids.shape[1] - 1
    return math.exp(nll / n)


class _LayerCache:
    """The inputs of one decoder layer for every calibration sample, and the tail forward from there."""

    @torch.no_grad()
    def __init__(self, model: nn.Module, layout, calib_ids: torch.Tensor, chunk_tokens: int = CHUNK_TOKENS):
        from gac.compression.importance import _capture_layer_inputs

        self.model = model
        self.layers = model.get_submodule(layout.layers_path)
        parent = layout.layers_path.rpartition(".")[0]
        self.norm = model.get_submodule(f"{parent}.norm") if parent else model.get_submodule("norm")
        self.head = model.get_output_embeddings()
        dev = next(model.parameters()).device
        self.ids = calib_ids.to(dev)
        h0, self.kwargs = _capture_layer_inputs(model, self.layers, self.ids[:1])
        hidden = [h0] + [_capture_layer_inputs(model, self.layers, self.ids[s : s + 1], all_kwargs=False)[0]
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
    def perplexity(self) -> float:
        """Calibration perplexity with the model as it is now, from the cached inputs of layer ``self.layer``."""
        nll, n = 0.0, 0
        for a in range(0, self.hidden.shape[0], self.chunk):
            h = self.norm(self._run(self.hidden[a : a + self.chunk], self.layer))
            for s in range(h.shape[0]):  # the head one sample at a time: [seq, vocab] logits only
                logits = self.head(h[s, :-1]).float()
                nll += float(nn.functional.cross_entropy(logits, self.ids[a + s, 1:], reduction="sum"))
                n += logits.shape[0]
        return math.exp(nll / n)

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
                      layout=None, progress_every: int = 1, chunk_tokens: int = CHUNK_TOKENS) -> dict:
    """ASVD's sensitivity table: calibration perplexity with one unit at a time truncated to each kept parameter
    ratio in ``grid`` (the reference's rank ``int(g * |W|) // params_per_dim``; a ratio of 1, or a rank that would
    not save parameters, is the dense model), every other unit dense. Logs one line per ``progress_every`` units
    with the elapsed time and an ETA. Returns ``{"grid", "base_ppl", "table"}`` (``table[i][k]``: unit i, ratio k).
    """
    grid = check_sensitivity_grid(grid)
    was = model.training
    model.eval()
    t0 = time.perf_counter()
    with _threads_for(model, calib_ids, chunk_tokens):
        try:
            return _table(model, comp, units, factors, calib_ids, grid, layout, progress_every, chunk_tokens, t0)
        finally:
            model.train(was)


def _table(model, comp, units, factors, calib_ids, grid, layout, progress_every, chunk_tokens, t0) -> dict:
    from gac.compression.discovery import discover

    layout = layout or discover(model)
    base = calibration_perplexity(model, calib_ids)
    layers = [_layer_of(u, layout) for u in units]
    cache = None
    order = list(range(len(units)))
    if all(x is not None for x in layers):
        order.sort(key=lambda i: layers[i])  # probe layer by layer; the table keeps the units' order
        cache = _LayerCache(model, layout, calib_ids, chunk_tokens)
        fast = cache.perplexity()
        if not math.isclose(fast, base, rel_tol=1e-4):
            log.warning("sensitivity: the layer-cached perplexity (%.6f) differs from the full forward (%.6f) on "
                        "this architecture; probing with full forwards (slower)", fast, base)
            cache = None
    n_probe = sum(g < 1 for g in grid)
    log.info("sensitivity: %d weights x %d kept ratios %s on %d x %d calibration tokens (dense perplexity %.3f)%s",
             len(units), n_probe, list(grid), calib_ids.shape[0], calib_ids.shape[1], base,
             "" if cache else "; full forward per probe")
    table: list = [None] * len(units)
    for done, k in enumerate(order, start=1):
        u = units[k]
        if cache is not None:
            cache.advance_to(layers[k])
        row = []
        for g in grid:
            d = max(1, reference_rank(u.dense_params, u.params_per_dim, g)) if g < 1 else None
            if d is None or d > u.d_cap:  # dense: ratio 1, or the factorisation would not save parameters
                row.append(base)
                continue
            old = comp.apply(model, units, {u.name: d}, factors)
            try:
                row.append(cache.perplexity() if cache is not None else calibration_perplexity(model, calib_ids))
            finally:
                for n, m in old.items():
                    replace_module(model, n, m)
        if not all(math.isfinite(v) for v in row):
            raise GacError(f"sensitivity: non-finite calibration perplexity for {u.name} ({row}); the truncated "
                           f"model diverges: check the calibration data or use allocation='proportional'")
        table[k] = row
        if done % max(1, progress_every) == 0 or done == len(units):
            el = time.perf_counter() - t0
            log.info("sensitivity %d/%d %s: ppl %s; %.0fs elapsed, ETA %.0fs", done, len(units), u.name,
                     " ".join(f"{v:.2f}" for v in row), el, el / done * (len(units) - done))
    return {"grid": list(grid), "base_ppl": base, "table": table}
