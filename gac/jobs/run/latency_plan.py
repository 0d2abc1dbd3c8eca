"""A job's latency-budget plan (``align=gac_latency``): its latency tables, the budget, the plan and its record block.

The tables give each target's latency at each of its candidate dimensions at the job's prefill point (batch
``eval.latency_batch``, ``seq_len`` tokens):

* ``latency_source: measured``: the job's device times the targets' own kernels
  (:func:`gac.profiling.latency_tables.measure_latency_tables`, cached per device under ``cache/latency_tables``);
  on a CPU with the clock of ``gac bench`` (the thread's CPU time on one torch thread), so a budget and the bench's
  measurement are in the same units and a loaded machine does not inflate either;
* ``latency_source: predicted``: :mod:`gac.predict` gives them for ``gpu=a100`` / ``gpu=h100`` from published kernel
  data, with a bootstrap interval over its calibration (:meth:`gac.predict.Predictor.replicas`).

The plan's latency is the whole prefill's: the targets' kernels plus ``fixed_ms``, everything the plan does not
change (attention, norms, the head, the framework's overhead). ``fixed_ms`` is the uncompressed model's prefill
(measured on the device, or predicted) less its targets' kernels at full size (a low-rank target's dense weight, a
pruned MLP at its full width), so a budget in ms means the prefill a researcher measures. The relative budget
``latency_budget: r`` is ``r`` times the latency of a reference plan at the ratio's parameter budget, by the same
table: ``latency_reference: unaligned`` (the compressor's own dimensions) or ``gac`` (the parameter-budget gac plan;
``r = 1`` asks for the best plan at the latency gac reaches).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from dataclasses import dataclass, field
from fractions import Fraction

from gac.errors import ConfigRefused

log = logging.getLogger(__name__)

#: bootstrap replicates of the predictor's calibration for a predicted plan's interval (each one recalibrates)
REPLICATES = 20
INTERVAL = (5.0, 95.0)  # percentiles of the replicates: a 90% interval


@dataclass
class Tables:
    """Latency tables of one job's targets (ms) and what they were taken from."""

    table: dict  # target name -> {dim: ms}
    fixed_ms: float
    whole_ms: float  # the uncompressed model's prefill (measured or predicted)
    source: str
    device: str
    batch: int
    seq_len: int
    replicas: list = field(default_factory=list)  # predicted: (table, fixed_ms) per bootstrap replicate
    timer: str | None = None  # measured: the clock
    notes: list = field(default_factory=list)


def _table_dims(targets, cands, unaligned):
    """Per target: its candidates, its unaligned dimension (the relative budget's reference) and its full size where
    the table can hold it (:func:`_full_dim`: the uncompressed model's kernels, for ``fixed_ms``)."""
    out = []
    for t, cs, d in zip(targets, cands, unaligned):
        ds = set(int(c) for c in cs) | {int(d)}
        if _full_dim(t) is not None:
            ds.add(_full_dim(t))
        out.append(sorted(ds))
    return out


def _full_dim(t) -> int | None:
    """The dimension at which a target's table entry is its uncompressed kernels (None: a low-rank target without a
    dense option, whose full size is one dense GEMM timed apart)."""
    if t.kind == "lowrank":
        return t.dense_dim if t.has_dense else None
    return int(t.meta["d_full"]) if t.meta.get("d_full") else None


def _in_out(t) -> tuple[int, int]:
    from gac.profiling.sweeps import target_shape

    if t.shape is not None:
        return int(t.shape[1]), int(t.shape[0])
    shape = target_shape(t)
    return int(shape["in"]), int(shape["out"])


def measured_tables(spec, model, targets, cands, unaligned, cache_dir) -> Tables:
    """Tables timed on the job's device (cached per device and dtype), with ``fixed_ms`` from the uncompressed
    model's measured prefill."""
    import torch
    import torch.nn.functional as F

    from gac.dtypes import dtype_name, resolve_dtype
    from gac.profiling.device import device_info, resolve_device, stack_key
    from gac.profiling.job_profile import cache_name
    from gac.profiling.latency_tables import measure_latency_tables
    from gac.profiling.profile import META_FILE, HardwareProfile
    from gac.profiling.timing import TimingProtocol, cpu_thread_clock, time_op

    batch, seq_len = int(spec.eval.latency_batch), int(spec.seq_len)
    dev = resolve_device(spec.device)
    dt = resolve_dtype(spec.dtype or "auto", dev)
    info = device_info(dev)
    path = None if cache_dir is None else cache_dir / "latency_tables" / cache_name(info, dtype_name(dt))
    cached = None
    if path is not None and (path / META_FILE).is_file():
        cached = HardwareProfile.load(path)
        if stack_key(cached.meta) != stack_key(info):
            log.warning("ignoring cached latency tables %s: measured on another device/stack", path)
            cached = None
    cpu = dev.type == "cpu"
    with cpu_thread_clock() if cpu else contextlib.nullcontext():
        table, merged = measure_latency_tables(targets, _table_dims(targets, cands, unaligned), dev, dt, seq_len,
                                               batch, profile=cached)
        if path is not None and merged is not cached:
            merged.save(path)
        protocol = TimingProtocol.paper() if not cpu else TimingProtocol.quick()
        dense: dict[tuple[int, int], float] = {}
        torch.manual_seed(0)
        with torch.inference_mode():
            for t in targets:
                if _full_dim(t) is None and _in_out(t) not in dense:
                    inp, out = _in_out(t)

                    def make(inp=inp, out=out):
                        return (torch.randn(batch * seq_len, inp, device=dev, dtype=dt),
                                torch.randn(out, inp, device=dev, dtype=dt))

                    dense[(inp, out)] = time_op(make, F.linear, dev, protocol).median_ms
            whole = _prefill_ms(model, dev, batch, seq_len, spec.seed)
    full = math.fsum(table[t.name][_full_dim(t)] if _full_dim(t) is not None else dense[_in_out(t)] for t in targets)
    out = Tables(table, 0.0, float(whole), "measured", str(info.get("device_name") or spec.device), batch, seq_len)
    out.timer = "thread CPU time, 1 torch thread (as gac bench times a CPU)" if cpu else "CUDA events"
    out.fixed_ms = _fixed(whole, full, out.notes)
    return out


def _prefill_ms(model, dev, batch: int, seq_len: int, seed: int) -> float:
    """The uncompressed model's prefill (ms, the median of the timed calls of ``DEFAULTS["plan_prefill"]`` after its
    warm-up) with the clock the tables were timed with (:func:`gac.evaluation.latency.timer_for`: inside
    :func:`gac.profiling.timing.cpu_thread_clock` on a CPU, thread CPU time)."""
    import statistics

    import torch

    from gac.evaluation.latency import DEFAULTS, time_calls

    warmup, calls, _ = DEFAULTS["plan_prefill"]["cuda" if dev.type == "cuda" else "cpu"]

    vocab = int(getattr(model.config, "vocab_size", 1000))
    ids = torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed)).to(dev)

    def step():
        return lambda: model(input_ids=ids, use_cache=False)

    for _ in range(warmup):
        step()()
    return float(statistics.median(time_calls(step, dev, calls)))


def _fixed(whole: float, full: float, notes: list) -> float:
    if whole >= full:
        return whole - full
    notes.append(f"the uncompressed prefill ({whole:.4g} ms) is shorter than its targets' kernels timed alone "
                 f"({full:.4g} ms); fixed_ms is 0 (the kernels do not add up at this batch x seq_len)")
    log.warning("latency plan: %s", notes[-1])
    return 0.0


def predicted_tables(spec, model, targets, cands, unaligned) -> Tables:
    """Tables predicted for ``spec.gpu`` (a100/h100), with ``fixed_ms`` from the uncompressed model's predicted
    prefill, and :data:`REPLICATES` bootstrap replicates of both for the plan's interval."""
    from gac.compression.structure import Structure
    from gac.predict import Predictor, gemm_ms
    from gac.predict.latency_tables import predicted_latency_tables
    from gac.predict.predictor import retime as retimed
    from gac.predict.predictor import simulate

    batch, seq_len = int(spec.eval.latency_batch), int(spec.seq_len)
    dims = _table_dims(targets, cands, unaligned)
    pred = Predictor(spec.gpu)
    kernels = pred.kernels(Structure(model.config, "float16"), batch, seq_len)

    def one(p, cal, issue):
        table = predicted_latency_tables(targets, dims, p, batch, seq_len)
        full = math.fsum(table[t.name][_full_dim(t)] if _full_dim(t) is not None
                         else gemm_ms(cal, batch * seq_len, _in_out(t)[1], _in_out(t)[0]) for t in targets)
        return table, simulate(retimed(kernels, cal), issue), full

    table, whole, full = one(pred, pred.cal, pred.issue_ms)
    out = Tables(table, 0.0, float(whole), "predicted", pred.gpu, batch, seq_len)
    out.fixed_ms = _fixed(whole, full, out.notes)
    quiet = logging.getLogger("gac.predict.latency_tables")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the launch-bound warning was given once, for the point estimate
    try:
        for cal, issue in pred.replicas(REPLICATES):
            p = copy.copy(pred)
            p.cal, p.issue_ms = cal, issue
            t_r, whole_r, full_r = one(p, cal, issue)
            out.replicas.append((t_r, max(whole_r - full_r, 0.0)))
    finally:
        quiet.setLevel(level)
    return out


def latency_plan(spec, model, targets, param_budget: int, candidate_filter, cache_dir):
    """The plan of ``align=gac_latency`` for ``targets`` at ``param_budget`` (the ratio's) and its record block
    ``{budget_kind, source, budget_ms, table_ms, params, latency_held, ...}``. Raises :class:`GacError` (the job stops
    before applying anything) for a budget no plan reaches, naming the minimum reachable."""
    from gac.align import align
    from gac.align.candidates import candidate_sets
    from gac.align.latency_budget import (
        align_latency,
        align_min_latency,
        plan_latency,
        plan_latency_exact,
        round_up,
    )

    lat = spec.latency
    cands = candidate_sets(targets, spec.unit, spec.window, candidate_filter)
    unaligned = align(targets, param_budget, "unaligned", spec.unit, spec.window, candidate_filter)
    u_dims = [unaligned.dims[t.name] for t in targets]
    if lat["source"] == "predicted":
        tabs = predicted_tables(spec, model, targets, cands, u_dims)
    else:
        tabs = measured_tables(spec, model, targets, cands, u_dims, cache_dir)
    table, fixed = tabs.table, tabs.fixed_ms
    unaligned_ms = plan_latency(targets, u_dims, table, fixed)
    gac = align(targets, param_budget, "gac", spec.unit, spec.window, candidate_filter)
    gac_ms = plan_latency(targets, [gac.dims[t.name] for t in targets], table, fixed)
    ref_name = lat.get("reference", "unaligned")
    ref_dims = [gac.dims[t.name] for t in targets] if ref_name == "gac" else u_dims
    reference = gac_ms if ref_name == "gac" else unaligned_ms
    fastest = round_up(Fraction(fixed) + sum((min(Fraction(table[t.name][int(d)]) for d in cs)
                                              for t, cs in zip(targets, cands)), Fraction(0)))
    budget_ms = None
    if lat["budget_kind"] == "latency":
        if lat["budget_ms"] is not None:
            budget_ms = lat["budget_ms"]
        else:  # rounded up: a share of 1 keeps the reference plan itself within its own latency, exactly
            exact = plan_latency_exact(targets, ref_dims, table, fixed)
            budget_ms = round_up(Fraction(repr(lat["budget"])) * exact)
        if budget_ms < fastest:
            asked = (f"align.latency_budget_ms={lat['budget_ms']:g}" if lat["budget_ms"] is not None else
                     f"align.latency_budget={lat['budget']:g} ({budget_ms:.4g} ms)")
            raise ConfigRefused(f"infeasible latency budget: {asked} is below the fastest plan the candidates allow, "
                           f"{fastest:.4g} ms by the {tabs.source} table on {tabs.device} (align.latency_budget="
                           f"{fastest / reference:.3f} of the {ref_name} plan's {reference:.4g} ms); give at least that")
        plan = align_latency(targets, table, budget_ms, param_budget, spec.unit, spec.window, candidate_filter,
                             fixed_ms=fixed)
    else:
        plan = align_min_latency(targets, table, param_budget, "at_least", spec.unit, spec.window, candidate_filter,
                                 fixed_ms=fixed)
    dims = [plan.dims[t.name] for t in targets]
    table_ms = plan_latency(targets, dims, table, fixed)
    interval = None
    if tabs.replicas:
        import numpy as np

        reps = [plan_latency(targets, dims, t_r, f_r) for t_r, f_r in tabs.replicas]
        interval = [float(x) for x in np.percentile(reps, INTERVAL)]
    block = {
        "budget_kind": lat["budget_kind"], "source": tabs.source, "device": tabs.device, "batch": tabs.batch,
        "seq_len": tabs.seq_len, "budget_ms": budget_ms, "budget_share": lat["budget"], "table_ms": table_ms,
        "interval_ms": interval, "interval": None if interval is None else
        f"{INTERVAL[1] - INTERVAL[0]:g}% bootstrap over the predictor's calibration ({len(tabs.replicas)} replicates)",
        "reference": ref_name if lat["budget"] is not None else None, "unaligned_ms": unaligned_ms,
        "gac_ms": gac_ms, "fastest_ms": fastest, "fixed_ms": fixed, "uncompressed_ms": tabs.whole_ms,
        "timer": tabs.timer, "params": int(plan.params), "param_budget": int(param_budget),
        "latency_held": None if budget_ms is None else bool(table_ms <= budget_ms),
        "params_held": bool(plan.params >= param_budget) if budget_ms is None else bool(plan.budget_met),
        "notes": tabs.notes,
    }
    plan.stats["latency_budget"] = block
    return plan, block
