"""Which device a profile is for: device resolution and the platform metadata a profile records (dtype names are
:mod:`gac.dtypes`')."""

from __future__ import annotations

import datetime as _dt
import logging
import platform
import shutil
import subprocess

import torch

from gac import __version__
from gac.errors import GacError

log = logging.getLogger(__name__)

def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> the current CUDA device if there is one, else CPU; ``"cuda"`` without CUDA is an error."""
    if isinstance(device, torch.device):
        dev = device
    else:
        name = str(device).strip().lower()
        if name == "auto":
            return (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
        try:
            dev = torch.device(name)
        except RuntimeError as e:
            raise GacError(f"unknown device {device!r} ({e}); use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise GacError(
                f"device {str(dev)!r} requested but CUDA is not available in this torch build/machine; "
                f"run on a GPU node or use device=cpu"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise GacError(f"device type {dev.type!r} is not supported for profiling; use cpu or cuda")
    return dev


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def device_name(device: torch.device) -> str:
    """The name a profile is keyed by: the GPU's marketing name, or the CPU model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_name()


def device_info(device: torch.device) -> dict:
    """Device, driver and software stack of this process (recorded in every profile)."""
    info = {
        "device_type": device.type,
        "device_name": device_name(device),
        "compute_capability": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "torch": torch.__version__,
        "gac": __version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "num_threads": torch.get_num_threads(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["compute_capability"] = f"{props.major}.{props.minor}"
        info["total_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["multiprocessors"] = props.multi_processor_count
        info["l2_cache_bytes"] = int(getattr(props, "L2_cache_size", 0) or 0) or None
        info["driver"] = _nvidia_driver()
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # cudnn missing from the build
            info["cudnn"] = None
    return info


def stack_key(info: dict) -> tuple:
    """What must match for a cached profile to be reused: device, compute capability and the software stack."""
    return (info.get("device_name"), info.get("compute_capability"), info.get("torch"), info.get("cuda"))
