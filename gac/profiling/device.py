"""Which device a profile is for: device resolution and the platform metadata a profile records (dtype names are
:mod:`gac.dtypes`')."""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess

import torch

from gac import __version__
from gac.machine import host, utc_stamp

log = logging.getLogger(__name__)

def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> the current CUDA device if there is one, else CPU; otherwise :func:`gac.devices.check_device`
    (``"cuda"`` without CUDA, or a GPU index that is not there, is an error)."""
    from gac.devices import check_device

    return check_device(device, "profiling", auto=True)


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
        "host": host(),
        "num_threads": torch.get_num_threads(),
        "date": utc_stamp(),
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
