"""One model over several devices: the node's GPUs, then CPU memory, then disk (``model.device_map=auto``).

The model is cut at layer boundaries into *units*: the embedding, each decoder layer, the final norm, the LM head
and any other top-level block (:func:`placement_units`); a unit is never split. :func:`plan_placement` (a pure
function over unit sizes and device capacities) fills the devices in order, the job's own device first, and
refuses with one line when the units do not fit all devices together. Each device that gac sizes from its free
memory keeps free what the job needs beside the weights there, and only that (:class:`WorkingSet`): one layer's
transient work, plus what each decoder layer it holds keeps for the gradient pass, plus the logits where the LM
head is. :func:`dispatch` then puts each unit on its device and registers a forward pre-hook that moves the unit's
inputs (hidden states, masks, rotary embeddings) to that device, so layer-by-layer calibration, gradient passes,
compression (a compressed module is built on its weight's device, so it replaces the original on the same device)
and evaluation run unchanged; the model's outputs come back to the device of its inputs. What joins tensors of
several devices beyond that (counts, flags, targets against logits) moves them explicitly (tested on a CPU with two
fake devices, tests/models/fake_devices.py).

A unit placed on ``disk`` keeps its weights in a file gac writes under the offload directory, memory-mapped
copy-on-write (:mod:`gac.models.offload`, which also says what gac writes there and when it goes): they are ordinary
CPU tensors that the operating system pages in while the unit runs (and may page out again), so every weight read,
gradient and module swap of compression works on them as on any CPU tensor, and nothing is ever written back to the
file; a cast of their dtype goes through a file of its own (:class:`gac.models.offload.Offloaded`). Disk units run
on the CPU.

Latency stays a single-GPU measurement: :func:`spans_devices` tells the job that the model is spread, and the job
records its quality metrics with a note instead of a latency.
"""

from __future__ import annotations

import logging
import math
import re
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gac.errors import GacError
from gac.transformers_lock import transformers_lock

log = logging.getLogger(__name__)

DEVICE_MAPS = ("single", "auto")  # model.device_map: one device (the default), or spread over the devices
GPU_FRACTION = 0.9  # of a GPU's free memory given to weights when model.max_memory does not name that GPU
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
GIB = 2.0**30


def parse_size(value, key: str = "model.max_memory") -> int:
    """Bytes of ``value``: an integer (bytes) or a string such as ``"70GiB"``, ``"500MB"``, ``"2.5 TiB"``."""
    if isinstance(value, bool):
        raise GacError(f"config: {key}: {value!r} is not a size; write e.g. 70GiB, 500MB or a number of bytes")
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return int(value)
    if isinstance(value, (int, float)):
        raise GacError(f"config: {key}: {value!r} is not a size; write a finite number of bytes >= 0, or e.g. 70GiB")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b|b)?\s*", str(value), re.IGNORECASE)
    if m is None:
        raise GacError(f"config: {key}: {value!r} is not a size; write e.g. 70GiB, 500MB or a number of bytes")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])


def device_key(key) -> str:
    """A ``model.max_memory`` key as a device name: ``0``/``"0"``/``"cuda:0"`` -> ``"cuda:0"``; ``cpu``, ``disk``."""
    k = str(key).strip().lower()
    if k.isdigit():
        return f"cuda:{int(k)}"
    if k in ("cpu", "disk") or re.fullmatch(r"cuda:\d+", k):
        return k
    raise GacError(f"config: model.max_memory: unknown device {key!r}; use cuda:N (or N), cpu or disk")


def parse_max_memory(max_memory: Mapping | None) -> dict[str, int]:
    """``model.max_memory`` as ``{device: bytes}`` (checked; None -> {})."""
    if max_memory is None:
        return {}
    if not isinstance(max_memory, Mapping):
        raise GacError(f"config: model.max_memory must be a mapping of device to size, e.g. "
                       f"'{{cuda:0: 70GiB, cpu: 200GiB}}', got {max_memory!r}")
    out: dict[str, int] = {}
    for k, v in max_memory.items():
        d = device_key(k)
        if d in out:
            raise GacError(f"config: model.max_memory names {d} twice")
        out[d] = parse_size(v, f"model.max_memory.{k}")
    return out


def check_device_map(device_map) -> str:
    if device_map not in DEVICE_MAPS:
        raise GacError(f"config: model.device_map must be one of {', '.join(DEVICE_MAPS)}, got {device_map!r} "
                       f"(auto spreads a model over the GPUs, and over CPU memory or disk where model.max_memory "
                       f"names them)")
    return device_map


def device_capacities(device: str, max_memory: Mapping | None = None, reserve: int = 0,
                      available=None) -> dict[str, int]:
    """The bytes of weights each device may hold, in the order they are filled: the job's ``device`` first, then
    the other visible GPUs (when ``device`` is a GPU), then ``cpu`` and ``disk`` where ``max_memory`` names them.

    A device named in ``max_memory`` holds what it says; any other GPU :data:`GPU_FRACTION` of its free memory less
    ``reserve`` (what the job keeps free on every device that runs a layer: :attr:`WorkingSet.per_device`); the CPU,
    when it is the job's device and not named, its available memory less ``reserve``. ``available(device) -> bytes
    or None`` (for tests; default: :func:`gac.compression.resources.device_memory`)."""
    limits = parse_max_memory(max_memory)
    if available is None:
        from gac.compression.resources import device_memory

        def available(d):
            mb = device_memory(d).get("available_mb")
            return None if mb is None else int(mb * 2**20)

    order: list[str] = []
    if str(device).startswith("cuda"):
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        first = int(str(device).split(":")[1]) if ":" in str(device) else 0
        order = [f"cuda:{first}"] + [f"cuda:{i}" for i in range(n) if i != first]
        for d in limits:
            if d.startswith("cuda") and d not in order:
                raise GacError(f"config: model.max_memory names {d} but this node has {n} GPU(s) "
                               f"(cuda:0..cuda:{max(n - 1, 0)}); name only the GPUs it has")
        order += [d for d in ("cpu", "disk") if d in limits]
    else:
        bad = [d for d in limits if d.startswith("cuda")]
        if bad:
            raise GacError(f"config: model.max_memory names {bad[0]} but the job runs on {device}; set gpu=... to a "
                           f"GPU config or drop the GPU limits")
        order = ["cpu"] + (["disk"] if "disk" in limits else [])
    caps: dict[str, int] = {}
    for d in order:
        if d in limits:
            caps[d] = limits[d]
        else:
            have = available(d)
            if have is None:
                raise GacError(f"cannot tell how much memory {d} has; name it in model.max_memory (e.g. {d}: 100GiB)")
            frac = GPU_FRACTION if d.startswith("cuda") else 1.0
            caps[d] = max(int(frac * have) - int(reserve), 0)
    return caps


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n < 10 * GIB else f"{n / GIB:.0f} GiB"


def plan_placement(units: Sequence[tuple[str, int]], capacities: Mapping[str, int],
                   follow: Mapping[str, str] | None = None, extra: Mapping[str, int] | None = None,
                   extra_on: Collection[str] | None = None) -> dict[str, str]:
    """``{unit: device}``: the units, in model order, on the devices, in ``capacities`` order, each device filled
    before the next is used; a unit is never split and no device holds more than its capacity. A unit in ``follow``
    goes where the unit it names went (it shares that unit's tensors, e.g. a tied LM head: its size is not counted
    again; its ``extra`` is counted with that unit). ``extra``: bytes a unit needs beside its weights on the device
    that runs it (its share of the job's working set, :func:`unit_working_set`), counted on the devices in
    ``extra_on`` (default: all). Raises one :class:`GacError` line when the units do not fit all devices together."""
    follow = dict(follow or {})
    names = [n for n, _ in units]
    if len(set(names)) != len(names):
        raise GacError(f"placement: a unit is listed twice ({sorted({n for n in names if names.count(n) > 1})[0]})")
    for f, t in follow.items():
        if t not in names or f not in names or names.index(t) > names.index(f) or t in follow:
            raise GacError(f"placement: {f} follows {t}, which is not an earlier unit placed on its own")
    devices = list(capacities)
    if not devices:
        raise GacError("placement: no device to place the model on")
    extra_on = set(devices if extra_on is None else extra_on)
    work = {n: 0 for n in names}
    for n, b in (extra or {}).items():
        work[follow.get(n, n)] += int(b)  # a follower runs where its leader is
    sized = [(n, int(b)) for n, b in units if n not in follow]
    need = sum(b for _, b in sized)
    need_work = sum(work.values())
    room = sum(int(c) for c in capacities.values())
    listing = ", ".join(f"{d} {_gib(int(c))}" for d, c in capacities.items())
    if need > room or (extra_on >= set(devices) and need + need_work > room):
        beside = f" and the working set of its layers {_gib(need_work)} more" if need <= room else ""
        raise GacError(f"the model does not fit all its devices together: its weights take {_gib(need)}{beside}, "
                       f"the devices hold {_gib(room)} ({listing}); raise model.max_memory, add CPU memory or disk "
                       f"to it (model.max_memory.cpu=..., model.max_memory.disk=...), or use a smaller dtype or model")
    out: dict[str, str] = {}
    i, used = 0, 0

    def size(n, b, d):
        return b + (work[n] if d in extra_on else 0)

    for n, b in units:
        if n in follow:
            out[n] = out[follow[n]]
            continue
        while i < len(devices) and used + size(n, b, devices[i]) > int(capacities[devices[i]]):
            i, used = i + 1, 0
        if i == len(devices):
            biggest = max(b for _, b in sized)
            beside = f" with {_gib(work[n])} of working set beside it" if work[n] else ""
            raise GacError(f"the model does not fit its devices at layer boundaries: {n} ({_gib(b)}{beside}) finds no "
                           f"room left after the units before it ({listing}; the largest unit takes {_gib(biggest)}, "
                           f"and a layer is never split); raise model.max_memory by a layer's size or add a device")
        out[n] = devices[i]
        used += size(n, b, devices[i])
    return out


def device_needs(units: Sequence[tuple[str, int]], plan: Mapping[str, str], extra: Mapping[str, int] | None = None,
                 follow: Mapping[str, str] | None = None) -> dict[str, int]:
    """Bytes each device of ``plan`` holds: its units' weights and their ``extra`` (as :func:`plan_placement`
    counts them on a device that keeps a working set)."""
    follow = dict(follow or {})
    out: dict[str, int] = {}
    for n, b in units:
        d = plan[n]
        out[d] = out.get(d, 0) + (0 if n in follow else int(b)) + int((extra or {}).get(n, 0))
    return out


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def placement_units(model) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """``(units, follow)`` of ``model`` for :func:`plan_placement`: the top-level blocks, each decoder layer its own
    unit, with the bytes of the tensors they hold. Blocks without parameters (the rotary embedding) come first, the
    rest in module order (embedding, layers, final norm, LM head). A unit sharing a tensor with an earlier one (a
    tied LM head shares the embedding) follows that unit; its other bytes are counted with it."""
    from gac.compression.discovery import discover

    layers_path = discover(model).layers_path
    parents = {".".join(layers_path.split(".")[:i]) for i in range(1, layers_path.count(".") + 1)}
    names: list[str] = []

    def walk(mod, prefix: str) -> None:
        for child_name, child in mod.named_children():
            full = f"{prefix}{child_name}"
            if full == layers_path:
                names.extend(f"{full}.{i}" for i in range(len(child)))
            elif full in parents:
                walk(child, f"{full}.")
            else:
                names.append(full)

    walk(model, "")
    own = [n for n in names if next(model.get_submodule(n).parameters(), None) is None]
    order = own + [n for n in names if n not in own]
    owner: dict[int, str] = {}
    sizes: dict[str, int] = {}
    follow: dict[str, str] = {}
    for n in order:
        mod = model.get_submodule(n)
        size = 0
        for t in list(mod.parameters()) + list(mod.buffers()):
            if id(t) in owner:
                if owner[id(t)] != n:
                    follow.setdefault(n, owner[id(t)])
                continue
            owner[id(t)] = n
            size += _tensor_bytes(t)
        sizes[n] = size
    for n, leader in follow.items():  # a follower's own tensors go where its leader goes
        sizes[leader] += sizes[n]
        sizes[n] = 0
    return [(n, sizes[n]) for n in order], follow


@dataclass(frozen=True)
class WorkingSet:
    """What a job keeps free beside the weights on the devices of a model spread over them (:func:`working_set`):
    ``per_device`` on every device that runs a layer (one layer's calibration, statistics and factorisation, one
    weight's gradient: whichever device runs the layer holds them while it runs), ``per_layer`` more with each
    decoder layer a device holds (what that layer keeps for the whole gradient pass: its activations for the
    backward, its element-wise gradient sums), ``at_head`` more with the LM head (the logits and their loss, or a
    compressor's scores of the head: ``stable_rank_svd``'s SVD of it)."""

    per_device: int = 0
    per_layer: int = 0
    at_head: int = 0


def unit_working_set(model, units: Sequence[tuple[str, int]], ws: WorkingSet) -> dict[str, int]:
    """``{unit: bytes}`` of ``ws`` that go with each unit of ``model``: ``per_layer`` with each decoder layer,
    ``at_head`` with the unit that holds the LM head (:func:`plan_placement` counts a tied head's with the
    embedding it follows)."""
    from gac.compression.discovery import discover

    layers = discover(model).layers_path + "."
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out: dict[str, int] = {}
    for n, _ in units:
        mod = model.get_submodule(n)
        b = ws.per_layer if n.startswith(layers) else 0
        if head is not None and any(m is head for m in mod.modules()):
            b += ws.at_head
        if b:
            out[n] = int(b)
    return out


def _move(obj, device):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, tuple):
        return type(obj)(*(_move(o, device) for o in obj)) if hasattr(obj, "_fields") else tuple(
            _move(o, device) for o in obj)
    if isinstance(obj, list):
        return [_move(o, device) for o in obj]
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _move(obj[k], device)  # in place: a transformers ModelOutput keeps its attributes in step
        return obj
    return obj


def dispatch(model, device_map: Mapping[str, str], offload_dir=None):
    """Put every unit of ``device_map`` (:func:`plan_placement`) on its device (``disk``: memory-mapped from a file
    gac writes in a folder of its own under ``offload_dir``, a path or an
    :class:`gac.models.offload.OffloadFolder` made before loading; run on the CPU) and make each unit move its inputs to its device; the model's outputs
    return to the device of its inputs. Returns ``model`` (changed in place); :func:`placement_of` reads the map."""
    import torch

    from gac.models.offload import OffloadFolder, offload

    folder = offload_dir if isinstance(offload_dir, OffloadFolder) else None
    if any(d == "disk" for d in device_map.values()):
        if offload_dir is None:
            raise GacError("placement: units go to disk but no offload directory was given (model.offload_dir)")
        folder = folder or OffloadFolder(offload_dir)
        weakref.finalize(model, folder.remove)  # when the model is freed, or at exit
    elif folder is not None:
        folder.remove()  # made before loading, in case the plan put units on disk; it did not
        folder = None
    holders: dict[int, int] = {}
    for n in device_map:
        for t in model.get_submodule(n).parameters():
            holders[id(t)] = holders.get(id(t), 0) + 1
    shared = {k for k, c in holders.items() if c > 1}
    for name, dev in device_map.items():
        mod = model.get_submodule(name)
        run_on = torch.device("cpu" if dev == "disk" else dev)
        if dev == "disk":
            if any(id(t) in shared for t in mod.parameters()):
                raise GacError(f"placement: {name} shares weights with another unit and cannot go to disk; give the "
                               f"first device room for it")
            mod.to("cpu")
            offload(mod, folder, name)
        else:
            mod.to(run_on)
        mod.register_forward_pre_hook(
            lambda m, args, kwargs, _d=run_on: (_move(args, _d), _move(kwargs, _d)), with_kwargs=True)
    model._gac_device_map = dict(device_map)

    def remember(m, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        m._gac_io_device = ids.device if isinstance(ids, torch.Tensor) else None

    def give_back(m, args, kwargs, out):
        dev = getattr(m, "_gac_io_device", None)
        return out if dev is None else _move(out, dev)

    model.register_forward_pre_hook(remember, with_kwargs=True)
    model.register_forward_hook(give_back, with_kwargs=True)
    counts: dict[str, int] = {}
    for d in device_map.values():
        counts[d] = counts.get(d, 0) + 1
    log.info("model placed over %s", ", ".join(f"{d} ({k} units)" for d, k in counts.items()))
    if folder is not None:
        log.info("%d unit(s) on disk: %s of weights written to %s and memory-mapped from there; each file is unlinked "
                 "once mapped (its space returns when the model is freed) and the folder removed with the model",
                 counts.get("disk", 0), _gib(folder.written), folder.path)
    return model


def placement_of(model) -> dict[str, str] | None:
    """The ``{unit: device}`` map :func:`dispatch` applied to ``model`` (None: the model is on one device as loaded)."""
    return getattr(model, "_gac_device_map", None)


def spans_devices(model) -> bool:
    """Whether ``model`` is spread over more than one device (or keeps units on disk): then it has no single-GPU
    latency."""
    m = placement_of(model)
    return bool(m) and (len(set(m.values())) > 1 or "disk" in m.values())


def placement_summary(model) -> dict | None:
    """``{device: [units...]}`` counts and the first and last unit per device, for records; None when not placed."""
    m = placement_of(model)
    if not m:
        return None
    out: dict[str, dict] = {}
    for n, d in m.items():
        e = out.setdefault(d, {"units": 0, "first": n, "last": n})
        e["units"] += 1
        e["last"] = n
    return out


LATENCY_NOTE = ("latency not measured: the model is spread over {devices} (model.device_map=auto) and latency is a "
                "single-GPU measurement; its quality metrics are recorded")


def latency_note(model) -> str:
    return LATENCY_NOTE.format(devices=", ".join(dict.fromkeys((placement_of(model) or {}).values())))


def _plan(model, device: str, max_memory: Mapping | None, reserve, available=None) -> dict[str, str]:
    """Plan ``model`` (a loaded model or a meta-device skeleton) over the devices: each device that gac sizes from
    its free memory keeps its share of ``reserve`` (a :class:`WorkingSet`, or bytes kept free on every device) free
    of weights; a device named in ``max_memory`` holds the weights it names."""
    ws = reserve if isinstance(reserve, WorkingSet) else WorkingSet(per_device=int(reserve))
    units, follow = placement_units(model)
    caps = device_capacities(device, max_memory, reserve=ws.per_device, available=available)
    named = set(parse_max_memory(max_memory))
    return plan_placement(units, caps, follow, extra=unit_working_set(model, units, ws),
                          extra_on=[d for d in caps if d not in named])


def place_model(model, device: str, max_memory: Mapping | None = None, offload_dir=None,
                reserve: WorkingSet | int = 0):
    """Plan (:func:`device_capacities`, :func:`placement_units`, :func:`plan_placement`; each device keeping its
    share of ``reserve``, the job's :func:`working_set`) and :func:`dispatch` ``model``, which may be anywhere (it is
    loaded on the host first). Returns ``model``."""
    return dispatch(model, _plan(model, device, max_memory, reserve), offload_dir)


def plan_for_config(config, dtype, device: str, max_memory: Mapping | None = None, reserve: WorkingSet | int = 0,
                    available=None) -> dict[str, str]:
    """The placement a model of ``config`` in ``dtype`` would get, planned on a meta-device copy (no memory, no
    weights): what the memory check runs before loading, so a model that fits no set of devices is refused then."""
    import torch
    from transformers import AutoModelForCausalLM

    from gac.dtypes import resolve_dtype

    with transformers_lock(), torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype, device))
    return _plan(skeleton, device, max_memory, reserve, available)


def working_set(fp) -> WorkingSet:
    """The bytes a job needs beside the weights on the devices of a spread model (a
    :class:`gac.compression.footprint.Footprint`), by where they live (:class:`WorkingSet`): each device keeps free
    what its own layers need, not the whole job's working set."""
    return WorkingSet(per_device=int(fp.per_device), per_layer=int(fp.per_layer), at_head=int(fp.at_head))


def check_placed_fits(fp, config, device: str, max_memory: Mapping | None, what: str = "this job",
                      available=None, host_available: int | None = -1) -> dict[str, str]:
    """Before loading a model spread over its devices (``model.device_map=auto``): its units planned over every
    device (:func:`plan_for_config`, each GPU keeping its share of the job's :func:`working_set` free), and the host able to
    hold the weights while they load (the model is read on the host, then spread). Raises one :class:`GacError`
    line naming ``what``, the sizes and the fix; returns the planned ``{unit: device}``. ``host_available``: bytes
    (-1: the host's own; None: not checked)."""
    try:
        plan = plan_for_config(config, fp.dtype, device, max_memory, reserve=working_set(fp), available=available)
    except GacError as e:
        raise GacError(f"{what}: {e}") from None
    if host_available == -1:
        from gac.compression.resources import device_memory

        mb = device_memory("cpu").get("available_mb")
        host_available = None if mb is None else int(mb * 2**20)
    if host_available is not None and fp.weights + fp.base > host_available:
        raise GacError(f"{what} will not fit: the model is read on the host before it is spread over its devices and "
                       f"needs about {_gib(fp.weights + fp.base)} there, {_gib(host_available)} available; use a node "
                       f"with more host memory or a smaller dtype")
    counts: dict[str, int] = {}
    for d in plan.values():
        counts[d] = counts.get(d, 0) + 1
    log.info("%s: placement over %s", what, ", ".join(f"{d} ({k} units)" for d, k in counts.items()))
    return plan


__all__ = ["DEVICE_MAPS", "WorkingSet", "check_device_map", "check_placed_fits", "device_capacities",
           "device_needs", "dispatch", "latency_note", "parse_max_memory", "parse_size", "place_model", "placement_of",
           "placement_summary", "placement_units", "plan_for_config", "plan_placement", "spans_devices",
           "unit_working_set", "working_set"]
