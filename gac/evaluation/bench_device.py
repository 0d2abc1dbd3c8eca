"""The bench's device: checked before anything is built, and described in the bench record (name, torch / CUDA /
driver, clocks where nvidia-smi answers, CPU frequency, governor and load)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

CPU_NOTE = ("this is a CPU: CPU latency says nothing about GPUs (no Tensor Cores, FlashAttention head-dim templates "
            "or cuBLAS tile choices here); any alignment effect, or its absence, is a CPU measurement only")


def check_device(device):
    """The bench's device (:func:`gac.devices.check_device`: cpu or an existing cuda:N)."""
    from gac.devices import check_device as checked

    return checked(str(device), "the bench")


def _smi_id(props, index) -> str:
    """How nvidia-smi names this torch device: its UUID (torch's index counts CUDA_VISIBLE_DEVICES, nvidia-smi's
    counts the machine's GPUs, so ``-i <torch index>`` can read another GPU's clocks), else the index."""
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return str(index)


def _nvidia_smi(index) -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    fields = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.limit",
              "temperature.gpu", "persistence_mode", "compute_mode")
    try:
        r = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader", "-i", str(index)],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    if r.returncode != 0 or not r.stdout.strip():
        return {}
    values = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
    return {f"nvidia_smi.{k}": v for k, v in zip(fields, values)}


def _cpu_facts() -> dict:
    out: dict = {}
    mhz = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    mhz.append(float(line.split(":", 1)[1]))
    except (OSError, ValueError):
        pass
    if mhz:
        out["cpu_mhz"] = [round(x) for x in mhz]
    gov = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    try:
        with open(gov) as f:
            out["scaling_governor"] = f.read().strip()
    except OSError:
        out["scaling_governor"] = None
    with contextlib.suppress(OSError, ValueError), open("/proc/loadavg") as f:
        out["loadavg"] = [float(x) for x in f.read().split()[:3]]
    return out


def device_info(dev) -> dict:
    """The device as a bench records it: name, type, torch / CUDA / driver, clocks where readable, CPU facts."""
    import torch

    from gac.evaluation.latency import device_name

    info = {"type": dev.type, "name": device_name(dev), "torch": torch.__version__, "cpu_count": os.cpu_count()}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(index=dev.index, cuda=torch.version.cuda, capability=f"{props.major}.{props.minor}",
                    memory_gb=round(props.total_memory / 2**30, 2), **_nvidia_smi(_smi_id(props, dev.index)))
    else:
        info.update(threads=torch.get_num_threads(), note=CPU_NOTE, **_cpu_facts())
    return info

