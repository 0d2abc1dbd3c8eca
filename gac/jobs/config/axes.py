"""Which setting matters under which choice: one table, read by one check, so that a setting a job cannot use is
refused before any work, in a single run as in a sweep, instead of launching a job (and a record, and a row of the
report) that differs from another only by a value nothing reads.

Each :class:`Axis` names the config keys (and config groups) that set it and says, for a job (its
:class:`~gac.jobs.config.spec.JobSpec` and resolved config), why the job cannot use it, or None when it can. A setting the
job cannot use, given a value other than the job would have had without it, is refused:

* in a single run (:func:`check_overrides`; ``gac compress`` and ``gac evaluate`` flags away from their defaults,
  :func:`check_given`) always;
* in a sweep (:func:`check_sweep`, when the multirun starts and in ``gac launch status``) where it is one of the
  sweep's axes (it takes several values, so the point would run again with nothing changed), or where no point of
  the sweep can use it. A setting given to the whole sweep that some of its points use stays on the others too: it
  keeps them in one table (``-m experiment=table5_both calibration.n_samples=8``).

A setting another command reads back from the record (``seq_len``: the length ``gac bench`` measures a job's plan at
by default) counts when it is given once, and is refused only as a sweep axis.

Two kinds of job carry settings they do not read by design, so that one record serves a whole sweep's table:

* the uncompressed baseline, whose record key leaves out every compression setting (``compression=True`` rows are
  not checked for it): ``-m compressor=none,asvd ratio=0.1,0.2`` runs one baseline;
* the ``unaligned`` strategy, the reference row of the aligned strategies: it keeps their candidate window and
  hardware-profile settings so that it lands in the same table as they do (``experiment=table5 align.window=8``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gac.align.strategies import OWN_CANDIDATES
from gac.errors import GacError
from gac.jobs.config.spec import JobSpec

#: strategies that read d* alone, never a score (gac.align.strategies and gac.align.authors_dp)
SCORE_FREE = ("round_nearest", "round_up", "round_down", "round_to")


@dataclass(frozen=True)
class Axis:
    """A setting: the config keys and groups that set it (a key covers the keys below it), why a job cannot use it
    (``unused(spec, cfg) -> reason or None``), the fix, and whether only a compressed job reads it."""

    keys: tuple[str, ...]
    unused: Callable[[JobSpec, dict], str | None]
    fix: str
    compression: bool = False
    #: read later from the record by another command (the job's seq_len is the length `gac bench` measures by
    #: default): given once it counts, refused only as a sweep axis
    recorded: bool = False


def _compressor(spec: JobSpec):
    from gac.compression.compressors import get_compressor

    return get_compressor(spec.compressor, **(spec.compressor_options or {}))


def _proxy_needs(spec: JobSpec) -> frozenset:
    from gac.compression.proxies import get_proxy

    return frozenset(get_proxy(spec.proxy or _compressor(spec).default_proxy).needs)


def _proxy(spec: JobSpec, cfg: dict) -> str | None:
    from gac.compression.allocation import PROXY_FREE, STABLE_RANK

    if spec.allocation == STABLE_RANK:
        return (f"compressor={spec.compressor} allocates by the weights' stable rank alone and never reads the proxy, "
                f"so every proxy gives the same d* and plans (and a gradient proxy only adds its cost)")
    if spec.allocation in PROXY_FREE:
        return (f"compressor={spec.compressor} with allocation={spec.allocation} never reads the proxy, so every "
                f"proxy gives the same d* and plans")
    return None


def _calibration(spec: JobSpec, cfg: dict) -> str | None:
    comp = _compressor(spec)
    if comp.needs_act or comp.needs_xtx or spec.allocation == "sensitivity" or _proxy_needs(spec):
        return None
    return (f"compressor={spec.compressor} with proxy {spec.proxy or comp.default_proxy} and allocation="
            f"{spec.allocation} reads no calibration data")


def window_unused(strategy: str) -> str | None:
    """Why the candidate window does nothing under ``strategy`` (None: it is read); the sweep's check and
    ``gac align --window`` both ask this."""
    if strategy in OWN_CANDIDATES:
        return f"align={strategy} chooses among candidates of its own (gac's window does not apply)"
    return None


def _window(spec: JobSpec, cfg: dict) -> str | None:
    return window_unused(spec.strategy)


def _profile_filter(spec: JobSpec, cfg: dict) -> str | None:
    """Why the hardware profile's candidate filter does not run (None: it runs)."""
    if spec.strategy in OWN_CANDIDATES:
        return f"align={spec.strategy} chooses among candidates of its own (no hardware profile filters them)"
    if not spec.use_profile:
        return "align.use_profile=false (no hardware profile filters the candidates)"
    return None


def _use_profile(spec: JobSpec, cfg: dict) -> str | None:
    if spec.strategy in OWN_CANDIDATES:
        return _profile_filter(spec, cfg)
    if spec.profile == "none":
        return f"gpu.profile=none (gpu={spec.gpu} has no hardware profile whose cliffs could be dropped)"
    return None


def _allow_mismatch(spec: JobSpec, cfg: dict) -> str | None:
    if spec.profile == "none":
        return f"gpu.profile=none (gpu={spec.gpu}: no profile is read, from this device or another)"
    return _profile_filter(spec, cfg)


def _knapsack_score(spec: JobSpec, cfg: dict) -> str | None:
    if spec.strategy in SCORE_FREE:
        return f"align={spec.strategy} rounds d* and reads no score"
    return None


def _seq_len(spec: JobSpec, cfg: dict) -> str | None:
    if spec.eval.latency or spec.latency is not None:
        return None
    if not spec.is_baseline and spec.strategy not in OWN_CANDIDATES and spec.use_profile and spec.profile != "none":
        return None  # the hardware profile measures the targets' kernels at seq_len
    return ("eval.latency=false and no latency budget or hardware profile reads it, so every length gives the same "
            "job (the record keeps it only as the length gac bench measures by default)")


def _ppl(spec: JobSpec, cfg: dict) -> str | None:
    if spec.eval.ppl:  # asked for (a model path that is not there has no text yet: the preflight names the path)
        return None
    return "eval.ppl=false: no perplexity is measured"


def _tasks(spec: JobSpec, cfg: dict) -> str | None:
    return None if spec.eval.tasks else "eval.tasks is empty: no task is run"


def _batch_size(spec: JobSpec, cfg: dict) -> str | None:
    if spec.eval.tasks or (spec.eval.ppl and spec.ppl_source):
        return None
    return "neither perplexity nor a task is evaluated (eval.ppl=false, eval.tasks=[])"


def _latency(spec: JobSpec, cfg: dict) -> str | None:
    return None if spec.eval.latency else "eval.latency=false: no latency is measured"


def _decode(spec: JobSpec, cfg: dict) -> str | None:
    if not spec.eval.latency:
        return "eval.latency=false: no latency is measured"
    return None if spec.eval.decode_tokens > 0 else "eval.decode_tokens=0: no decode is measured"


def _latency_batch(spec: JobSpec, cfg: dict) -> str | None:
    if spec.eval.latency or spec.latency is not None:
        return None
    return "eval.latency=false and no latency budget (align=gac_latency) reads it"


def _sensitivity(spec: JobSpec, cfg: dict) -> str | None:
    if spec.allocation == "sensitivity":
        return None
    return f"allocation={spec.allocation}: no sensitivity search runs (it is allocation=sensitivity's)"


def _sensitivity_grid(spec: JobSpec, cfg: dict) -> str | None:
    from gac.compression.allocation import STABLE_RANK

    return None if spec.allocation == STABLE_RANK else _sensitivity(spec, cfg)


def _gradient_loss(spec: JobSpec, cfg: dict) -> str | None:
    if "grad" in _proxy_needs(spec):
        return None
    return f"proxy {spec.proxy or _compressor(spec).default_proxy} takes no gradients, so no gradient loss is computed"


def _offload_dir(spec: JobSpec, cfg: dict) -> str | None:
    if spec.device_map == "auto":
        return None
    return "model.device_map=single: the model is on one device and nothing goes to disk"


def _bench_overrides(spec: JobSpec, cfg: dict) -> str | None:
    if (cfg.get("bench") or {}).get("after_sweep"):
        return None
    return "bench.after_sweep=false: no bench runs after the sweep"


AXES: tuple[Axis, ...] = (
    Axis(("proxy",), _proxy, "drop it, or (with a compressor other than stable_rank_svd, whose allocation is its "
         "only one) add allocation=proportional (Eq. 2), which allocates by the proxy", compression=True),
    Axis(("calibration", "model.calibration_source", "model.calibration_seq_len"), _calibration,
         "drop it (the compression is data-free), or pick a proxy or compressor that reads calibration data",
         compression=True),
    Axis(("align.window",), _window, "drop it, or use a strategy that reads it (gac, gac_latency, rebalance, "
         "round_nearest, round_up, round_down)", compression=True),
    Axis(("align.use_profile",), _use_profile, "drop it, or run on a GPU with a profile (gpu=a100/h100/h200/auto) and "
         "a strategy that filters candidates", compression=True),
    Axis(("gpu.profile",), _profile_filter, "drop it, or use a strategy that filters candidates with "
         "align.use_profile=true", compression=True),
    Axis(("gpu.allow_profile_mismatch",), _allow_mismatch, "drop it, or give gpu.profile a profile to check",
         compression=True),
    Axis(("align.knapsack_score",), _knapsack_score, "drop it, or use a strategy that weighs scores (gac, "
         "gac_latency, rebalance, unaligned, authors_dp, authors_round)", compression=True),
    Axis(("compressor.options.sensitivity_samples",), _sensitivity, "drop it, or use allocation=sensitivity",
         compression=True),
    Axis(("compressor.options.sensitivity_grid",), _sensitivity_grid, "drop it, or use allocation=sensitivity",
         compression=True),
    Axis(("compressor.options.fisher_loss",), _gradient_loss, "drop it, or use a gradient proxy (fisher_rms, "
         "fisher, gradient, taylor)", compression=True),
    Axis(("seq_len",), _seq_len, "sweep it with eval.latency=true (e.g. eval=default); to bench the same plans at "
         "several lengths, give gac bench --point 1,512 --point 1,1024", recorded=True),
    Axis(("eval.ppl_seq_len", "eval.ppl_max_windows", "eval.ppl_stride", "model.ppl_source"), _ppl,
         "drop it, or measure perplexity (eval.ppl=true)"),
    Axis(("eval.limit", "model.task_files"), _tasks, "drop it, or run tasks (eval.tasks=[piqa,hellaswag])"),
    Axis(("eval.batch_size",), _batch_size, "drop it, or evaluate perplexity or tasks"),
    Axis(("eval.latency_seq_lens", "eval.latency_batches", "eval.decode_tokens", "eval.warmup", "eval.iters",
          "eval.trials", "eval.engine"), _latency, "drop it, or measure latency (eval.latency=true)"),
    Axis(("eval.decode_prompt",), _decode, "drop it, or measure decode (eval.latency=true, eval.decode_tokens=128)"),
    Axis(("eval.latency_batch",), _latency_batch, "drop it, or measure latency (eval.latency=true)"),
    Axis(("model.offload_dir",), _offload_dir, "drop it, or spread the model with model.device_map=auto"),
    Axis(("bench.overrides",), _bench_overrides, "drop it, or add bench.after_sweep=true"),
    Axis(("sensitivity_limit",), _sensitivity, "drop it, or use allocation=sensitivity", compression=True),
)


def axis_of(key: str) -> Axis | None:
    """The row of the table that config key (or group) ``key`` sets, or None."""
    for axis in AXES:
        if any(key == k or key.startswith(f"{k}.") for k in axis.keys):
            return axis
    return None


def why_unused(axis: Axis, spec: JobSpec, cfg: Mapping) -> str | None:
    """Why ``spec`` cannot use ``axis`` (None: it can, or it is a baseline's compression setting)."""
    if axis.compression and spec.is_baseline:
        return None
    return axis.unused(spec, dict(cfg))


def refusal(given: str, axis: Axis, why: str) -> GacError:
    return GacError(f"{given} changes nothing in this job: {why}; {axis.fix}")


def flags_given(args, add_arguments, flag_keys: Mapping[str, str]) -> dict[str, str]:
    """``{setting: the flag as given}`` for each flag of ``flag_keys`` (``{dest: setting}``) whose value in ``args``
    is not its default in the parser ``add_arguments`` builds (the first flag of a setting names it)."""
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    out: dict[str, str] = {}
    for dest, key in flag_keys.items():
        v = getattr(args, dest, None)
        if v is not None and v != p.get_default(dest) and key not in out:
            out[key] = f"--{dest.replace('_', '-')} {v}"
    return out


def check_given(spec: JobSpec, cfg: Mapping, given: Mapping[str, str]) -> None:
    """Refuse the first of ``given`` (``{config key: how it was given, e.g. '--window 3'}``) that ``spec`` cannot
    use. The caller passes only what was given a value other than the default."""
    for key, shown in given.items():
        axis = axis_of(key)
        why = None if axis is None else why_unused(axis, spec, cfg)
        if why:
            raise refusal(shown, axis, why)


def _unused_overrides(spec: JobSpec, cfg: Mapping, parsed) -> list[tuple[int, Axis, str]]:
    """``(index, axis, why)`` of each override in ``parsed`` that sets an axis ``spec`` cannot use."""
    out = []
    for i, o in enumerate(parsed):
        if o.is_delete() or o.is_sweep_override():
            continue
        axis = axis_of(o.key_or_group.removeprefix("+"))
        why = None if axis is None else why_unused(axis, spec, cfg)
        if why:
            out.append((i, axis, why))
    return out


def _changes_config(cfg: Mapping, overrides: Sequence[str], i: int, axis: Axis, config_dir=None) -> bool:
    """Whether override ``i`` changes ``axis``'s keys in the composed config (composed again without it; a value
    equal to what the job would have had anyway is harmless)."""
    from omegaconf import OmegaConf

    from gac.jobs.config.compose import compose
    from gac.jobs.config.schema import register
    from gac.results.query import config_value

    register()
    rest = [x for j, x in enumerate(overrides) if j != i]
    try:
        without = OmegaConf.to_container(compose("config", rest, config_dir=config_dir), resolve=True)
    except Exception:  # noqa: BLE001 - the config does not compose without it: it counts
        return True
    return any(config_value(dict(cfg), k) != config_value(without, k) for k in axis.keys)


def _parse(overrides: Sequence[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 - composing the job has parsed them already; nothing to judge here
        return None


def check_overrides(spec: JobSpec, cfg: Mapping, overrides: Sequence[str], config_dir=None) -> None:
    """A single run: refuse an override of ``overrides`` (the job's, as composed) that sets what ``spec`` cannot
    use and changes the composed config. Only such overrides cost a composition."""
    parsed = _parse(overrides)
    for i, axis, why in _unused_overrides(spec, cfg, parsed or ()):
        if not axis.recorded and _changes_config(cfg, overrides, i, axis, config_dir):
            raise GacError(f"config: {refusal(parsed[i].input_line, axis, why)}")


def check_sweep(points: Sequence[Mapping], config_dir=None) -> None:
    """A sweep (``points``: ``{"overrides", "config", "spec"}`` each): refuse a point's override that sets what the
    point cannot use and changes its config, where that override is one of the sweep's axes (it takes several values,
    so the point would run again with nothing changed) or where no point of the sweep can use it. A setting given to
    the whole sweep that some points use stays with the others too: it keeps them in one table."""
    parsed = [_parse(p["overrides"]) or [] for p in points]
    values: dict[str, set] = {}
    for ps in parsed:
        for o in ps:
            values.setdefault(o.key_or_group.removeprefix("+"), set()).add(o.input_line)
    for p, ps in zip(points, parsed):
        for i, axis, why in _unused_overrides(p["spec"], p["config"], ps):
            key = ps[i].key_or_group.removeprefix("+")
            swept = len(values.get(key, ())) > 1
            used = axis.recorded or any(why_unused(axis, q["spec"], q["config"]) is None for q in points)
            if (swept or not used) and _changes_config(p["config"], p["overrides"], i, axis, config_dir):
                where = "" if swept or len(points) == 1 else " (nor in any other point of the sweep)"
                raise GacError(f"sweep point [{' '.join(p['overrides'])}]: config: "
                               f"{refusal(ps[i].input_line, axis, why + where)}")
