"""A device a command or job names, checked once before anything is built: ``cpu``, ``cuda`` or ``cuda:N`` (that GPU
is there), and ``auto`` where the caller takes it (the current GPU if there is one, else the CPU). Model loading,
the bench and the profiler all check a device here; ``gac doctor`` reports the same facts as checks instead.
Also the GPU a config's ``gpu`` names: whether it is the device found (:func:`gpu_name_matches`), and a device's
short name for tables (:func:`gpu_of_device`)."""

from __future__ import annotations

import re

from gac.errors import GacError


def check_device(device, what: str = "this command", types: tuple[str, ...] | None = ("cpu", "cuda"),
                 auto: bool = False):
    """``device`` as a ``torch.device`` (``cuda`` resolved to the current GPU's index), or a one-line
    :class:`~gac.errors.GacError`: an unknown name, CUDA asked for where there is none, a GPU index this machine does
    not have, or a device type outside ``types`` (None: any type torch knows). ``auto``: accept ``"auto"``."""
    import torch

    if not isinstance(device, torch.device) and auto and str(device).strip().lower() == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dev = parse_device(device, auto=auto)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise GacError(f"device {str(device)!r} is not there: CUDA is not available on this machine (torch "
                           f"{torch.__version__}, CUDA {torch.version.cuda or 'none'}); run on a GPU node or use cpu")
        n = torch.cuda.device_count()
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if idx >= n:
            raise GacError(f"device {str(device)!r} is not there: this machine has {n} GPU(s) (cuda:0..cuda:{n - 1}); "
                           f"check CUDA_VISIBLE_DEVICES or the index")
        return torch.device("cuda", idx)
    if types is not None and dev.type not in types:
        raise GacError(f"{what} runs on {' or '.join(types)}, not {dev.type!r}")
    return dev


def parse_device(device, auto: bool = False):
    """``device`` as a ``torch.device`` by its name alone (``cpu``, ``cuda``, ``cuda:N``; ``cuda:abc`` is refused),
    without asking whether it is there: what a config names, checked on a login node that has no GPU."""
    import torch

    if isinstance(device, torch.device):
        return device
    try:
        return torch.device(str(device).strip().lower())
    except (RuntimeError, ValueError):
        raise GacError(f"unknown device {device!r}; use cpu, cuda or cuda:N{' or auto' if auto else ''}") from None


def model_device(model):
    """The device of ``model``'s first parameter (where its inputs go; a model spread over devices takes its inputs
    on the first), the CPU for a model without parameters."""
    import torch

    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


#: conf/gpu's configs named after a GPU model (``gpu=auto`` takes any device; its records name the device found)
KNOWN_GPUS = ("a100", "h100", "h200")


def gpu_name_matches(gpu: str, device_name: str) -> bool:
    """Whether the config's ``gpu`` (``a100``, ``h100``, ``rtx4090``) names the device ``device_name``: one of the
    name's words, or two adjacent words run together (``RTX 4090``), equals it, ignoring case."""
    words = re.findall(r"[a-z0-9]+", str(device_name).lower())
    names = set(words) | {a + b for a, b in zip(words, words[1:])}
    return str(gpu).lower() in names


def gpu_of_device(device_name: str) -> str:
    """The short name of a device for tables (``h100`` for ``NVIDIA H100 80GB HBM3``), else the name as reported."""
    return next((g for g in KNOWN_GPUS if gpu_name_matches(g, device_name)), str(device_name))
