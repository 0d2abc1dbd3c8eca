"""One model over several devices: the node's GPUs, then CPU memory, then disk (``model.device_map=auto``).

The model is cut at layer boundaries into *units*: the embedding, each decoder layer, the final norm, the LM head
and any other top-level block (:func:`placement_units`); a unit is never split. :func:`plan_placement` (a pure
function over unit sizes and device capacities) fills the devices in order, the job's own device first, and
refuses with one line when the units do not fit all devices together. :func:`dispatch` then puts each unit on its
device and registers a forward pre-hook that moves the unit's inputs (hidden states, masks, rotary embeddings) to
that device, so layer-by-layer calibration, gradient passes, compression (a compressed module is built on its
weight's device, so it replaces the original on the same device) and evaluation run unchanged; the model's
outputs come back to the device of its inputs.

A unit placed on ``disk`` keeps its weights in a file under the offload directory, memory-mapped copy-on-write:
they are ordinary CPU tensors that the operating system pages in while the unit runs (and may page out again), so
every weight read, gradient and module swap of compression works on them as on any CPU tensor, and nothing is ever
written back to the file. Disk units run on the CPU.

Latency stays a single-GPU measurement: :func:`spans_devices` tells the job that the model is spread, and the job
records its quality metrics with a note instead of a latency.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from gac.errors import GacError

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
    ``reserve`` (the job's working set: activations, statistics, logits); the CPU, when it is the job's device and
    not named, its available memory less ``reserve``. ``available(device) -> bytes or None`` (for tests; default:
    :func:`gac.compression.resources.device_memory`)."""
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
                   follow: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{unit: device}``: the units, in model order, on the devices, in ``capacities`` order, each device filled
    before the next is used; a unit is never split and no device holds more than its capacity. A unit in ``follow``
    goes where the unit it names went (it shares that unit's tensors, e.g. a tied LM head: its size is not counted
    again). Raises one :class:`GacError` line when the units do not fit all devices together."""
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
    sized = [(n, int(b)) for n, b in units if n not in follow]
    need = sum(b for _, b in sized)
    room = sum(int(c) for c in capacities.values())
    listing = ", ".join(f"{d} {_gib(int(c))}" for d, c in capacities.items())
    if need > room:
        raise GacError(f"the model does not fit all its devices together: its weights take {_gib(need)}, the devices "
                       f"hold {_gib(room)} ({listing}); raise model.max_memory, add CPU memory or disk to it "
                       f"(model.max_memory.cpu=..., model.max_memory.disk=...), or use a smaller dtype or model")
    out: dict[str, str] = {}
    i, used = 0, 0
    for n, b in units:
        if n in follow:
            out[n] = out[follow[n]]
            continue
        while i < len(devices) and used + b > int(capacities[devices[i]]):
            i, used = i + 1, 0
        if i == len(devices):
            biggest = max(b for _, b in sized)
            raise GacError(f"the model does not fit its devices at layer boundaries: {n} ({_gib(b)}) finds no room left "
                           f"after the units before it ({listing}; the largest unit takes {_gib(biggest)}, and a layer "
                           f"is never split); raise model.max_memory by a layer's size or add a device")
        out[n] = devices[i]
        used += b
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


def _offload(module, path: Path) -> None:
    """``module``'s parameters and buffers written to ``path`` and read back memory-mapped, copy-on-write: the
    module keeps its tensors (same names, dtypes, ``requires_grad``), now backed by the file instead of memory."""
    import torch

    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    torch.save(state, path)
    del state
    mapped = torch.load(path, mmap=True, weights_only=True)
    module.load_state_dict(mapped, assign=True)


def dispatch(model, device_map: Mapping[str, str], offload_dir: str | Path | None = None):
    """Put every unit of ``device_map`` (:func:`plan_placement`) on its device (``disk``: memory-mapped from a file
    under ``offload_dir``, run on the CPU) and make each unit move its inputs to its device; the model's outputs
    return to the device of its inputs. Returns ``model`` (changed in place); :func:`placement_of` reads the map."""
    import torch

    if any(d == "disk" for d in device_map.values()):
        if offload_dir is None:
            raise GacError("placement: units go to disk but no offload directory was given (model.offload_dir)")
        offload_dir = Path(offload_dir).expanduser()
        offload_dir.mkdir(parents=True, exist_ok=True)
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
            _offload(mod, offload_dir / f"{name}.pt")
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


def place_model(model, device: str, max_memory: Mapping | None = None, offload_dir: str | Path | None = None,
                reserve: int = 0):
    """Plan (:func:`device_capacities`, :func:`placement_units`, :func:`plan_placement`) and :func:`dispatch`
    ``model``, which may be anywhere (it is loaded on the host first). Returns ``model``."""
    units, follow = placement_units(model)
    caps = device_capacities(device, max_memory, reserve=reserve)
    plan = plan_placement(units, caps, follow)
    return dispatch(model, plan, offload_dir)


def plan_for_config(config, dtype, device: str, max_memory: Mapping | None = None, reserve: int = 0,
                    available=None) -> dict[str, str]:
    """The placement a model of ``config`` in ``dtype`` would get, planned on a meta-device copy (no memory, no
    weights): what the memory check runs before loading, so a model that fits no set of devices is refused then."""
    import torch
    from transformers import AutoModelForCausalLM

    from gac.dtypes import resolve_dtype

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype, device))
    units, follow = placement_units(skeleton)
    return plan_placement(units, device_capacities(device, max_memory, reserve=reserve, available=available), follow)


def working_set(fp) -> int:
    """The bytes a job needs on a device beside the weights (a :class:`gac.compression.footprint.Footprint`):
    activations, statistics, factorisation, gradients, logits; what each GPU keeps free of weights."""
    extra = int(fp.device_bytes) - int(fp.weights)
    if not str(fp.device).startswith("cuda"):
        extra -= int(fp.base) + int(fp.factors)  # the process itself and the host-side factors are not per device
    return max(extra, 0)


def check_placed_fits(fp, config, device: str, max_memory: Mapping | None, what: str = "this job",
                      available=None, host_available: int | None = -1) -> dict[str, str]:
    """Before loading a model spread over its devices (``model.device_map=auto``): its units planned over every
    device (:func:`plan_for_config`, each GPU keeping the job's :func:`working_set` free), and the host able to
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


__all__ = ["DEVICE_MAPS", "check_device_map", "check_placed_fits", "device_capacities", "dispatch", "latency_note", "parse_max_memory",
           "parse_size", "place_model", "placement_of", "placement_summary", "placement_units", "plan_for_config",
           "plan_placement", "spans_devices", "working_set"]
