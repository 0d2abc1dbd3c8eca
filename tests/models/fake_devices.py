"""Several devices on a CPU-only machine, told apart: ``with fake_devices():`` tensors may live on ``meta:0``,
``meta:1``, ... (``x.to("meta:1")``, ``module.to("meta:1")``, ``torch.zeros(2, device="meta:1")``), their data on
the CPU.

Every aten op run inside the context checks its tensor arguments as CUDA checks them: they share one device, except
that a 0-dim CPU tensor joins any device (a CPU scalar) and a copy (``.to``, ``copy_``) may cross devices; anything
else raises "Expected all tensors to be on the same device", as it would on a node of GPUs. The op then runs on the
CPU data and its results are put on that device. So code that runs here with a model spread over ``meta:0`` and
``meta:1`` has made each cross-device step explicit, and it computes the CPU's numbers bit for bit (the same CPU
kernels, in the same order).

The fake devices are meta-typed only because a CPU build of torch can guard devices, and run autograd, for the CPU
and meta types alone; no meta kernel ever runs (each op reaches :meth:`FakeDevices.__torch_dispatch__` first).
What this cannot show: anything about a real GPU (streams, peer copies, memory, speed).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
CROSSING = {aten._to_copy, aten.to, aten.copy_, aten._copy_from, aten._copy_from_and_resize}  # may cross devices


class OnDevice(torch.Tensor):
    """A CPU tensor (``_data``) that says it lives on a fake device."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, device: torch.device):
        t = torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            device=device, layout=data.layout, requires_grad=data.requires_grad)
        t._data = data
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"OnDevice({self.device}, {self._data!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a fake-device tensor outside fake_devices()")


class MixedDevices(RuntimeError):
    pass


class FakeDevices(TorchDispatchMode):
    """The dispatch mode of :func:`fake_devices`; ``ops`` counts the ops run, ``crossings`` the copies that crossed
    from one device to another (``(func, from, to)``)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.crossings: list[tuple[str, str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        self.ops += 1
        devices: list[torch.device] = []
        wrapped: dict[int, OnDevice] = {}

        def unwrap(t):
            if isinstance(t, OnDevice):
                devices.append(t.device)
                wrapped[id(t._data)] = t
                return t._data
            if isinstance(t, torch.Tensor):
                if t.dim() > 0 or t.device.type != "cpu":
                    devices.append(t.device)
                return t
            if isinstance(t, (list, tuple)):
                return type(t)(unwrap(x) for x in t)
            return t

        a = tuple(unwrap(x) for x in args)
        k = {key: unwrap(v) for key, v in kwargs.items()}
        target = None  # a device argument (a factory's, or .to's: keyword or, in inference mode, positional)
        if isinstance(k.get("device"), (str, torch.device)):
            target, k["device"] = torch.device(k["device"]), torch.device("cpu")
        for i, x in enumerate(a):
            if isinstance(x, torch.device):
                target, a = x, a[:i] + (torch.device("cpu"),) + a[i + 1:]
        seen = list(dict.fromkeys(devices))
        if func.overloadpacket in CROSSING:
            if func.overloadpacket is aten.copy_:
                target = args[0].device
            if target is not None and seen and seen[-1] != target:
                self.crossings.append((str(func), str(seen[-1]), str(target)))
        elif len(seen) > 1:
            raise MixedDevices(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{seen[0]} and {seen[1]}! ({func})")
        if target is None:
            target = seen[0] if seen else torch.device("cpu")
        out = func(*a, **k)
        if func.overloadpacket is aten.copy_:
            return args[0]
        if func.overloadpacket in CROSSING and seen and target != seen[-1]:
            wrapped.clear()  # a move to another device is a new tensor there, never the argument itself
            if isinstance(out, torch.Tensor) and any(out is x for x in a):
                out = out.clone()

        def wrap(t):
            if isinstance(t, torch.Tensor) and not isinstance(t, OnDevice):
                if id(t) in wrapped:  # an in-place op returns its own argument
                    return wrapped[id(t)]
                return OnDevice(t, target) if target.type == "meta" else t
            if isinstance(t, (list, tuple)):
                return type(t)(wrap(x) for x in t)
            return t

        return wrap(out)


@contextlib.contextmanager
def fake_devices():
    """Fake devices ``meta:N`` for the duration (module docstring); yields the :class:`FakeDevices` mode. Modules
    moved to them keep their Parameter objects (as ``module.to("cuda:1")`` does), so tied weights stay tied and
    hooks stay attached."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    mode = FakeDevices()
    try:
        with mode:
            yield mode
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)


def devices_of(module: torch.nn.Module) -> set[str]:
    return {str(p.device) for p in module.parameters()}
