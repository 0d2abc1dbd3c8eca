"""The side-by-side bench over a results store (``gac bench``, ``experiments/bench.py``, the after-sweep bench).

:func:`bench_store` selects records (sweep / experiment / record keys / ``--where``: :mod:`gac.results.query`), turns
each into a variant (:mod:`gac.jobs.bench.variants`: its structure, no weights) beside the uncompressed baseline of
the same model, validates everything, measures them with
:func:`gac.evaluation.bench.run_bench` and writes one bench record to ``<results_dir>/bench/<key>.json``. The key
is a hash of the measured record keys (and plan contents), the device, the points and the protocol: running the
same bench again returns the stored one (``force`` measures again, beside it). Nothing is written on bad input.

:func:`bench_from_config` is the same from a plain config dict (``conf/bench.yaml``); :func:`bench_after_sweep`
runs it when a multirun ends, where the end of the sweep runs (:mod:`gac.jobs.sweep.end`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gac.errors import GacError
from gac.jobs.bench.variants import build_variants, config_of, is_baseline_record, plan_variants
from gac.jobs.config.compose import compose
from gac.results import ResultsStore, config_key
from gac.results.query import parse_where, select_records

log = logging.getLogger(__name__)

BENCH_SCHEMA = 1
CONF_NAME = "bench"


# ---------------------------------------------------------------------------------------------- the bench
def bench_key(measured: Sequence[str], model: dict, dtype: str, device: dict, protocol: dict) -> str:
    """The bench record's key: what was measured (record keys / plan digests, model, dtype), where (device type and
    name) and how (points and protocol)."""
    return config_key({"measured": sorted(measured), "model": model, "dtype": str(dtype),
                       "device": {"type": device["type"], "name": device["name"]}, "protocol": protocol})


def bench_store(results_dir: str | os.PathLike | None, *, where=None, sweep: str | None = None,
                experiment: str | None = None, keys: Sequence[str] | None = None, plans: Sequence[str] = (),
                model: str | None = None, compressor: str | None = None, options: dict | None = None,
                device: str | None = None, dtype: str | None = None, points=None, rounds: int | None = None,
                warmup: int | None = None, iters: int | None = None, decode_tokens: int = 0, decode_prompt: int = 128,
                threads: int | None = None, seed: int = 0, bootstrap: int = 2000, memory: str = "auto",
                timer: str = "auto", profile: bool = True, force: bool = False, json_out: str | os.PathLike | None = None,
                json_force: bool = False, predict: str | None = None, engines=("torch",)) -> dict:
    """Select, validate, measure and record one bench; returns the bench document (``skipped`` when it was done).
    ``engines``: what runs the variants' prefill (:func:`engine_list`; several are an axis of the bench)."""
    from gac.evaluation.bench import Protocol
    from gac.evaluation.bench_device import check_device

    if json_out:
        from gac.io import check_output_file

        check_output_file(json_out, "--json", json_force, inputs=list(plans))
    engines = engine_list(engines)
    if predict is not None:
        from gac.predict.predictor import GPUS

        if str(predict).strip().lower() not in GPUS:
            raise GacError(f"--predict {predict!r}: predictions exist for {', '.join(GPUS)} (published kernel data); "
                           f"use one of them")
    store = None
    if results_dir is not None:
        root = Path(results_dir).expanduser()
        if not root.is_dir():
            raise GacError(f"results directory {str(root)!r} does not exist; give the results_dir your sweep wrote to")
        store = ResultsStore(root)
        store.check_layout()  # bench/ (or locks/) a file: refused now, not after measuring
    if plans:
        variants, ident, dtype, measured = plan_variants(plans, model, compressor, options, dtype)
        selection = {"plans": [str(p) for p in plans], "model": model, "compressor": compressor, "options": options}
        devs = []
        seqs = []
    else:
        if store is None:
            raise GacError("give a results directory (gac bench RESULTS_DIR) or plan files (--plan)")
        all_records = list(store.iter_records())
        sel = select_records(all_records, parse_where(where), sweep, experiment, keys)
        variants, ident, dtype = build_variants(sel, all_records, dtype)
        measured = [v.key for v in variants[1:]]
        selection = {"where": parse_where(where), "sweep": sweep, "experiment": experiment,
                     "keys": list(keys) if keys else None}
        devs = sorted({str(config_of(r, "gpu.device") or "cpu") for r in sel})
        seqs = sorted({int((r.get("job") or {}).get("seq_len")) for r in sel if (r.get("job") or {}).get("seq_len")})
    if device is None:
        if len(devs) > 1:
            raise GacError(f"the selected records ran on several devices {devs}; choose one with --device")
        device = devs[0] if devs else "cpu"
    dev = check_device(device)
    if points is None:
        points = [(1, s) for s in seqs] or [(1, min(1024, variants[0].structure.max_length or 1024))]
    protocol = Protocol(points=tuple(tuple(p) for p in points), rounds=rounds, warmup=warmup, iters=iters,
                        decode_tokens=decode_tokens, decode_prompt=decode_prompt, seed=seed, bootstrap=bootstrap,
                        threads=threads, memory=memory, profile=profile, timer=timer, engines=engines)
    resolved = protocol.resolved(dev.type)
    tokenizer = engine_inputs(engines, variants, ident if not plans else {"spec": model})
    limit = variants[0].structure.max_length
    for _, s in resolved["points"]:
        if limit is not None and s > limit:
            raise GacError(f"bench seq_len {s} is above the model's maximum sequence length ({limit}); use at most {limit}")
    from gac.evaluation.latency import device_name

    dev_id = {"type": dev.type, "name": device_name(dev)}
    key_protocol = {k: resolved[k] for k in ("points", "rounds", "warmup", "iters", "decode_tokens", "decode_prompt",
                                             "decode_warmup", "decode_iters", "seed", "bootstrap", "threads", "timer",
                                             "profile")}
    key_protocol["points"] = [list(p) for p in resolved["points"]]
    if engines != ("torch",):  # torch alone: the keys benches had before engines
        key_protocol["engines"] = list(engines)
    key = bench_key(measured, ident, dtype, dev_id, key_protocol)

    def stored(path=None, why="done"):
        doc = store.read_bench(key, path=path)  # checked as job records are: a planted or edited one is refused
        doc["skipped"] = True
        log.info("bench %s is %s (%s); skipping (force re-measures it)", key, why, doc["_path"])
        if predict is not None and (doc.get("predicted") or {}).get("gpu") != str(predict).lower():
            doc["predicted"] = predicted_points(variants, resolved["points"], predict)  # shown, not stored
        if json_out:
            _write_json(json_out, doc, json_force, plans)
        return doc

    if store is None:
        return _measure(key, variants, protocol, dev, ident, dtype, measured, selection, predict, resolved, None,
                        json_out, json_force, tokenizer)

    def done() -> bool:
        p = store.bench_path(key)
        return p.exists() or p.is_symlink()  # a dangling link is read (and refused), never measured over

    if done() and not force:
        return stored()
    # One writer per bench, as one writer per job: a second identical bench (another shell, the after-sweep bench,
    # a colleague on another node of the shared store) waits for the first and then shows its result, as a second
    # identical job does. Measuring both would have them compete for the device and store two disagreeing results;
    # refusing would only make the researcher re-run by hand what waiting gives. The lock is a file in the store
    # (host, pid, heartbeat), so it holds across hosts on NFS, and a killed bench's lock is broken (gac.results.lock).
    t_request = time.time()
    lock = store.bench_lock(key)
    if not lock.try_acquire():
        from gac.results.lock import describe_holder

        lock.acquire(on_wait=lambda h: log.info(
            "bench %s is being measured by %s; waiting for it to finish, then showing its result", key,
            describe_holder(h)))
    try:
        if not force and done():
            return stored(why="measured by the bench this one waited for")
        if force:
            fresh = [p for p in store.bench_paths(key) if p.stat().st_mtime >= t_request]
            if fresh:
                return stored(fresh[-1], why="re-measured by an identical forced bench this one waited for")
        from gac.faults import fault_point

        fault_point("bench_measure")
        return _measure(key, variants, protocol, dev, ident, dtype, measured, selection, predict, resolved, store,
                        json_out, json_force, tokenizer)
    finally:
        lock.release()


def engine_list(engines) -> tuple[str, ...]:
    """``--engine`` values (repeated, or comma lists) or a config's ``engine`` (a name, a comma list or a list) as
    the bench's engines, each known, in the order given; ``engine:type`` picks an engine's type (``llama.cpp:q4_K``;
    :func:`gac.align.engine_types.parse_engine`), spelled as results name it (``llama.cpp:f32`` is ``llama.cpp``)."""
    from gac.align.engine_types import canonical_engine

    items = [engines] if isinstance(engines, str) else list(engines or ())
    out: list[str] = []
    for item in items:
        for name in str(item).split(","):
            try:
                name = canonical_engine(name)
            except GacError as e:
                raise GacError(f"--engine: {e}") from None
            if name not in out:
                out.append(name)
    return tuple(out) or ("torch",)


def engine_inputs(engines, variants, ident: dict):
    """Every engine checked against every variant's structure before anything is built (a refusal names the
    engines that can), its packages installed; returns the tokenizer llama.cpp needs (a GGUF file carries it), else
    None."""
    from gac.align.engine_types import parse_engine
    from gac.engines import check_engine

    tokenizer = None
    gguf = {e for e in engines if parse_engine(e)[0] == "llama.cpp"}
    if gguf and not ident.get("random_weights"):
        from gac.models import load_model

        _, tokenizer = load_model(ident["spec"], dtype="float32")
    for name in engines:  # every model first: installing the packages would not help a model an engine cannot run
        for v in variants:
            try:
                check_engine(name, v.structure.skeleton(), tokenizer if name in gguf else None, packages=False)
            except GacError as e:
                raise GacError(f"{v.label}: {e}") from None
    for name in engines:
        check_engine(name)
    return tokenizer


def _measure(key, variants, protocol, dev, ident, dtype, measured, selection, predict, resolved, store, json_out,
             json_force, tokenizer=None) -> dict:
    """Measure the bench ``key`` (under its lock when it has a store), store it there and return it as stored."""
    import torch

    from gac.engines import open_engine
    from gac.evaluation.bench import run_bench

    log.info("bench %s: %d variants of %s on %s (%s)", key, len(variants), ident["name"], dev, dtype)
    doc = run_bench(variants, protocol, dev, open_engine=open_engine, tokenizer=tokenizer)
    doc = {"schema": BENCH_SCHEMA, "kind": "bench", "key": key, "model": ident, "records": measured,
           "baseline_record": variants[0].key, "selection": selection, **doc, "provenance": _provenance(dev)}
    if predict is not None:
        doc["predicted"] = predicted_points(variants, resolved["points"], predict)
    if torch.device(dev).type == "cuda":
        doc["provenance"]["device_name"] = doc["device"]["name"]
    if store is not None:
        path = store.write_bench(key, doc)
        doc = store.read_bench(key, path=path)  # exactly what was stored (created added)
    if json_out:
        _write_json(json_out, doc, json_force, selection.get("plans") or ())
    return doc


def predicted_points(variants, points, gpu: str) -> dict:
    """Every variant's predicted prefill ms on ``gpu`` (gac.predict, published kernel data) at the bench's points."""
    from gac.metrics import prefill_point
    from gac.predict import Predictor
    from gac.predict.report import column_label

    pred = Predictor(gpu)
    out = {"gpu": pred.gpu, "label": column_label(pred.gpu), "issue_ms": pred.issue_ms, "points": {}}
    for b, s in points:
        name = prefill_point(int(b), int(s))  # the bench's own point names, so records and tables match
        vs = {}
        for v in variants:
            vs[v.label] = {"ms": pred.predict(v.structure, int(b), int(s)).total_ms, "record_key": v.key}
        out["points"][name] = {"batch": int(b), "seq_len": int(s), "baseline_ms": vs[variants[0].label]["ms"],
                               "variants": vs}
    return out


def _write_json(path, doc, force, plans=()):
    from gac.io import write_output

    write_output(path, {k: v for k, v in doc.items() if not k.startswith("_")}, "--json", force, inputs=list(plans))


def _provenance(dev) -> dict:
    from gac.provenance import provenance

    p = provenance(device=str(dev))
    p["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    return p


# ---------------------------------------------------------------------------------------------- config / Hydra
def bench_from_config(cfg: dict) -> dict:
    """Run :func:`bench_store` from a plain config (``conf/bench.yaml`` resolved); print the table; return the doc."""
    doc = bench_of_config(cfg)
    print(describe(doc))
    return doc


def bench_of_config(cfg: dict) -> dict:
    """:func:`bench_store` from a plain config (``conf/bench.yaml`` resolved): the bench document, nothing printed."""
    known = {"results_dir", "where", "sweep", "experiment", "keys", "plans", "model", "compressor", "options", "device",
             "dtype", "points", "rounds", "warmup", "iters", "decode_tokens", "decode_prompt", "threads", "seed",
             "bootstrap", "memory", "timer", "profile", "force", "json", "quiet", "verbose", "predict", "engine"}
    extra = sorted(set(cfg) - known - {"hydra"})
    if extra:
        raise GacError(f"bench config: unknown key(s) {extra}; known: {sorted(known)}")
    from gac.checks import check_environment
    from gac.progress import quiet_libraries, set_quiet

    check_environment()
    if cfg.get("quiet") is not None:
        set_quiet(bool(cfg["quiet"]))
    quiet_libraries(verbose=bool(cfg.get("verbose", False)))
    doc = bench_store(
        cfg.get("results_dir"), where=cfg.get("where"), sweep=cfg.get("sweep"), experiment=cfg.get("experiment"),
        keys=cfg.get("keys") or None, plans=cfg.get("plans") or (), model=cfg.get("model"),
        compressor=cfg.get("compressor"), options=cfg.get("options"), device=cfg.get("device"),
        dtype=cfg.get("dtype"), points=cfg.get("points"), rounds=cfg.get("rounds"), warmup=cfg.get("warmup"),
        iters=cfg.get("iters"), decode_tokens=_given(cfg, "decode_tokens", 0),
        decode_prompt=_given(cfg, "decode_prompt", 128), threads=cfg.get("threads"), seed=_given(cfg, "seed", 0),
        bootstrap=_given(cfg, "bootstrap", 2000), memory=str(cfg.get("memory") or "auto"),
        timer=str(cfg.get("timer") or "auto"),
        profile=bool(cfg.get("profile", True)), force=bool(cfg.get("force", False)), json_out=cfg.get("json"),
        json_force=bool(cfg.get("force", False)), predict=cfg.get("predict"), engines=cfg.get("engine") or "torch")
    return doc


def _given(cfg: dict, key: str, default):
    """``cfg[key]`` as given (null: ``default``), checked by the protocol with the rest, never converted here."""
    v = cfg.get(key)
    return default if v is None else v


def describe(doc: dict) -> str:
    from gac.evaluation.bench_format import format_bench, format_predicted

    head = ("bench already measured (force=true measures again): " if doc.get("skipped") else "bench: ") + \
        str(doc.get("_path") or doc.get("key"))
    return head + "\n" + format_bench(doc) + format_predicted(doc)


def compose_bench(overrides: Sequence[str] = ()) -> dict:
    """``conf/bench.yaml`` composed with ``overrides``, resolved, as a plain dict (tests, the after-sweep bench)."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from gac.jobs.config.compose import conf_root, hydra_text
    from gac.jobs.sweep.site_files import check_site_files

    check_site_files(conf_root())
    try:
        cfg = compose(CONF_NAME, overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise GacError(f"bench config: {hydra_text(e)}") from None
    return OmegaConf.to_container(cfg, resolve=True)


def check_bench_overrides(overrides: Sequence[str]) -> None:
    """The after-sweep bench's ``bench.overrides`` compose to a bench config whose protocol is valid (rounds,
    warm-up, points, timer, ...), checked when the sweep starts rather than after every point has run."""
    from gac.evaluation.bench import Protocol

    cfg = compose_bench([str(o) for o in overrides])
    known = {f for f in Protocol.__dataclass_fields__ if f not in ("top",)}
    fields = {k: cfg[k] for k in known if cfg.get(k) is not None}
    if "points" in fields:
        fields["points"] = tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in fields["points"])
    device = str(cfg.get("device") or "cpu")
    try:
        Protocol(**fields).resolved("cuda" if device.startswith("cuda") else "cpu")
    except GacError as e:
        raise GacError(f"bench.overrides: {e} (the after-sweep bench would refuse it once the sweep ended)") from None


def bench_from_hydra(cfg) -> dict | None:
    """The body of ``experiments/bench.py``: bad input exits 2 with one line (in a multirun the error propagates so
    the launcher reports the job as failed)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        doc = bench_from_config(OmegaConf.to_container(cfg, resolve=True))
    except GacError as e:
        if multirun:
            raise
        print(f"experiments/bench.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    return {"key": doc.get("key"), "path": doc.get("_path")}


# ---------------------------------------------------------------------------------------------- after a sweep
def bench_after_sweep(results_dir: str | os.PathLike, keys: Sequence[str], overrides: Sequence[str] = ()
                      ) -> dict | None:
    """The bench a multirun asks for (``bench.after_sweep: true``) over its done points' ``keys``, measured here
    (:mod:`gac.jobs.sweep.end` runs it where the end of the sweep runs: the launching process of a local sweep, the
    end-of-sweep Slurm job of a Slurm one). ``overrides``: ``bench.overrides`` (``conf/bench.yaml`` settings).
    Returns the bench document, or None when no compressed point is done."""
    results_dir = str(Path(results_dir).expanduser().resolve())
    store = ResultsStore(results_dir)
    done = sorted({k for k in keys if store.is_done(k)})
    if not [k for k in done if not _is_baseline_key(store, k)]:
        log.warning("after-sweep bench: no compressed record to bench")
        return None
    cfg = compose_bench([f"results_dir={results_dir}", f"keys=[{','.join(done)}]", *[str(o) for o in overrides]])
    return bench_of_config(cfg)  # the end of the sweep prints it with its report


def _is_baseline_key(store: ResultsStore, key: str) -> bool:
    from gac.io import read_json

    return is_baseline_record(read_json(store.record_path(key), "result record"))
