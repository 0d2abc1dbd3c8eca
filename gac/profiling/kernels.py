"""What ran: SDPA backend selection, kernel names from ``torch.profiler``, and kernel tiers (paper Table 3).

- :func:`selected_sdpa_backend` asks PyTorch's own dispatcher (``torch._fused_sdp_choice``) which backend
  ``scaled_dot_product_attention`` picks for the given inputs: ``flash``, ``efficient``, ``cudnn`` or ``math``.
- :func:`sdpa_with_backend` returns a callable that forces one backend (``torch.nn.attention.sdpa_kernel``);
  it raises ``RuntimeError`` when that backend does not accept the shape.
- :func:`capture_kernels` runs a callable once under ``torch.profiler`` and returns the device kernels it
  launched (CUDA) or the ATen ops with the most self time (CPU), longest first.
- :func:`kernel_tier` classifies a GEMM/GEMV kernel name into the tiers of Table 3 (Ampere and Hopper names);
  :func:`kernel_fields` reads the library, CTA tile and split-K a kernel name states;
  :func:`attention_backend` names the SDPA backend an attention kernel belongs to.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")

_BACKEND_ENUM_NAMES = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def _backend_enum(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, _BACKEND_ENUM_NAMES[name], None)


def available_sdpa_backends(device: torch.device) -> tuple[str, ...]:
    """Backends worth trying on this device and torch build (the CPU has only flash and math)."""
    names = [n for n in SDPA_BACKENDS if _backend_enum(n) is not None]
    if device.type != "cuda":
        names = [n for n in names if n in ("flash", "math")]
    return tuple(names)


def selected_sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> str:
    """The backend PyTorch's dispatcher picks for these inputs, or ``"unknown"`` if it cannot be asked."""
    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None:
        return "unknown"
    try:
        idx = int(choice(q, k, v, None, 0.0, is_causal))
    except Exception as e:  # a private API: any failure means "cannot tell", never a failed sweep
        log.debug("torch._fused_sdp_choice failed: %s", e)
        return "unknown"
    for name in SDPA_BACKENDS:
        enum = _backend_enum(name)
        if enum is not None and int(enum.value) == idx:
            return name
    return "unknown"


def sdpa_with_backend(backend: str | None, is_causal: bool = False) -> Callable[..., torch.Tensor]:
    """``scaled_dot_product_attention`` restricted to ``backend`` (None: PyTorch's own choice)."""
    if backend is None:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    from torch.nn.attention import sdpa_kernel

    enum = _backend_enum(backend)
    if enum is None:
        raise ValueError(f"SDPA backend {backend!r} is not known to this torch build")

    def run(q, k, v):
        with sdpa_kernel([enum]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "flash attention not used because ..." for rejected shapes
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    return run


_CPU_NOISE_OPS = re.compile(
    r"^(aten::(empty|empty_like|empty_strided|zeros|zeros_like|fill_|zero_|transpose|as_strided|view|reshape|t|"
    r"expand|resolve_conj|resolve_neg|contiguous|clone|copy_|detach|alias|unsqueeze|squeeze|slice|select|"
    r"_unsafe_view|lift_fresh|result_type|permute|stride|size)|cudaLaunchKernel|cudaDeviceSynchronize|"
    r"cudaStreamSynchronize|cudaEventRecord|cudaFuncGetAttributes|cudaOccupancy.*|cudaGetDevice.*)$"
)


def capture_kernels(
    fn: Callable[..., object], args: Sequence, device: torch.device
) -> list[tuple[str, float]]:
    """Run ``fn(*args)`` once under ``torch.profiler``; return ``(kernel name, microseconds)``, longest first.

    On CUDA these are the device kernels (``ampere_fp16_s16816gemm...``, ``cutlass_80_tensorop..._align2``,
    ``flash_fwd_kernel``...). On CPU the library kernels are invisible to the profiler, so the ATen ops
    with the most self time are returned instead (``aten::mm``, ``aten::_scaled_dot_product_flash_attention_for_cpu``).
    Returns an empty list if the profiler is unavailable.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        with profile(activities=activities) as prof:
            fn(*args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        events = prof.events()
    except Exception as e:  # profiler not built in, or busy (another profiler running)
        log.debug("torch.profiler unavailable: %s", e)
        return []
    totals: dict[str, float] = {}
    if device.type == "cuda":
        for e in events:
            dev_type = getattr(e, "device_type", None)
            if dev_type is None or "CUDA" not in str(dev_type) or e.name.startswith(("Memcpy", "Memset")):
                continue
            t = float(getattr(e, "device_time_total", 0.0) or 0.0)
            if t <= 0 and getattr(e, "time_range", None) is not None:
                t = float(e.time_range.elapsed_us())
            totals[e.name] = totals.get(e.name, 0.0) + t
    else:
        for e in events:
            if _CPU_NOISE_OPS.match(e.name):
                continue
            totals[e.name] = totals.get(e.name, 0.0) + float(e.self_cpu_time_total)
    return sorted(totals.items(), key=lambda kv: -kv[1])


def main_kernel(fn: Callable[..., object], args: Sequence, device: torch.device) -> str | None:
    """The name of the longest kernel ``fn(*args)`` runs, or None."""
    ks = capture_kernels(fn, args, device)
    return ks[0][0] if ks else None


_MMA = re.compile(r"s(\d{2})(\d)(\d{2})gemm")


def mma_instruction(name: str | None) -> str | None:
    """The Tensor Core MMA shape encoded in a cuBLAS/CUTLASS kernel name (``s16816gemm`` -> ``m16n8k16``)."""
    if not name:
        return None
    m = _MMA.search(name)
    if m:
        return f"m{int(m.group(1))}n{int(m.group(2))}k{int(m.group(3))}"
    m = re.search(r"s(\d{2})(\d{2})(\d{2})gemm", name)  # wmma s161616gemm
    if m:
        return f"m{int(m.group(1))}n{int(m.group(2))}k{int(m.group(3))}"
    return None


# The GPU architecture a kernel name says it was built for, as compute capability x 10 (sm80 = Ampere A100)
_ARCH_NAMES = {"volta": 70, "turing": 75, "ampere": 80, "ada": 89, "hopper": 90, "blackwell": 100}
_ARCH = re.compile(r"(?:^|[^a-z0-9])(?:sm_?|cutlass_|cutlass3x_sm)(\d{2,3})(?=_|[^0-9]|$)")


def kernel_arch(name: str | None) -> int | None:
    """The architecture a GEMM kernel's name says it targets, as compute capability x 10: ``sm80_xmma_...``,
    ``ampere_fp16_...`` and ``cutlass_80_tensorop_...`` are 80, ``sm90_xmma_...``, ``nvjet_sm90_...`` and
    ``cutlass3x_sm90_...`` 90. None when the name does not say (cuBLASLt's ``nvjet_hsh_...`` is built for Hopper
    and newer, but for which of them its name does not tell)."""
    if not name:
        return None
    low = name.lower()
    m = _ARCH.search(low)
    if m:
        return int(m.group(1))
    for word, arch in _ARCH_NAMES.items():
        if low.startswith(word + "_") or f"_{word}_" in low or f" {word}_" in low:
            return arch
    return None


def _capability(cc) -> int | None:
    """A compute capability as an int x 10: ``(9, 0)`` -> 90, ``"9.0"`` -> 90, ``90`` -> 90; None stays None."""
    if cc is None:
        return None
    if isinstance(cc, (tuple, list)):
        return int(cc[0]) * 10 + int(cc[1])
    if isinstance(cc, str):
        major, _, minor = cc.partition(".")
        return int(major) * 10 + int(minor or 0)
    return int(cc)


def kernel_tier(name: str | None, capability=None, aligned: bool | None = None) -> str:
    """Classify a GEMM/GEMV kernel name (paper Table 3), as ``torch.profiler`` or Nsight report it.

    ``capability``: the compute capability of the device the kernel ran on (``(9, 0)``, ``"9.0"`` or ``90``; None:
    unknown). ``aligned``: whether the GEMM's K and N are multiples of 16 bytes (8 fp16 elements; None: unknown).
    A cuBLAS kernel of an older GPU generation than the device's (``sm80_xmma_...`` or ``ampere_...`` on an H100) is
    ``fallback`` only for a misaligned GEMM (``aligned=False``): cuBLAS took it because the generation's own kernels
    (``nvjet``, ``sm90_xmma``) refused the shape. On an aligned or unknown shape it stays ``native``: cuBLAS picks
    sm80 HMMA kernels on Hopper for skinny aligned GEMMs because they are the fastest there (Table 3's tier 1:
    cuBLAS-native, mma.m16n8k16), not because anything refused the shape. :func:`kernel_arch` says which generation
    a kernel was built for.

    * ``alignN``: a CUTLASS kernel whose name carries its vector width (``cutlass_80_tensorop_..._align2``,
      ``cutlass_75_tensorop_..._align1``, CUTLASS 3's ``cutlass3x_sm90_tensorop_gemm_..._align8``): align8 moves
      8 fp16 elements per load (as fast as the native kernels), align2/align1 are the fallbacks for K or N not a
      multiple of 8 (Table 3's tiers 2 and 3);
    * ``gemv``: a GEMV kernel (``gemv2T_kernel_val<...>``, ``gemvx::kernel<...>``, their ``cublasGemv...``
      reductions);
    * ``native``: cuBLAS's own kernels: ``ampere_fp16_s16816gemm_...``, ``sm80_xmma_gemm_...``,
      ``sm90_xmma_gemm_...`` and, on Hopper and newer, cuBLASLt's ``nvjet_*`` kernels (``nvjet_hsh_...`` for fp16,
      ``nvjet_tst_...`` for bf16, ``nvjet_sm90_...`` with CUDA 13). Their names carry no vector width: on Hopper
      the tier tells the kernel family and the latency tells the cost of a misaligned K or N;
    * ``fallback``: one of those cuBLAS kernels built for an older GPU generation than the device's, run for a
      misaligned GEMM (only when ``capability`` and ``aligned=False`` are given);
    * ``cutlass``: a CUTLASS 3 kernel named by its template (``cutlass::device_kernel<...GemmUniversal<...>>``)
      or a ``cutlass3x`` name without ``alignN``: a CUTLASS kernel whose alignment the name does not say;
    * ``gemm``: another GEMM; ``cpu``: an ATen op on CPU; ``unknown`` otherwise (None, empty, not a GEMM).
    """
    if not name:
        return "unknown"
    low = name.lower()
    if low.startswith("aten::"):
        return "cpu"
    if "gemv" in low:
        return "gemv"
    m = re.search(r"align(\d+)", low)
    if m:
        return f"align{m.group(1)}"
    if low.startswith("nvjet_") or "xmma" in low or "cublas" in low or re.search(
            r"(ampere|volta|turing|hopper|sm\d\d)_.*gemm", low):
        device, arch = _capability(capability), kernel_arch(name)
        if aligned is False and device is not None and arch is not None and arch // 10 < device // 10:
            return "fallback"
        return "native"
    if "cutlass3x" in low or ("device_kernel<" in low and "gemm" in low):
        return "cutlass"
    if "gemm" in low or "cutlass" in low:
        return "gemm"
    return "unknown"


def gemm_aligned(k: int, n: int, itemsize: int = 2) -> bool:
    """Whether a GEMM's K and N rows start on 16-byte boundaries (8 fp16/bf16 or 4 fp32 elements): the condition of
    Table 3's tier 1 and of cuBLAS's vectorised kernels."""
    return (int(k) * int(itemsize)) % 16 == 0 and (int(n) * int(itemsize)) % 16 == 0


_TILE = re.compile(r"(?:tilesize|_)(\d{2,3})x(\d{2,3})(?:x\d+)?(?=_)")
_SPLIT_ON = re.compile(r"split_?k|segment_k_on|streamk|stream_k")


def kernel_fields(name: str | None) -> dict:
    """What a GPU kernel's name says about it: ``library`` (``cublas``: nvjet / xmma / ampere_... / cuBLAS's own
    reductions; ``cutlass``; ``flash``, ``efficient``, ``cudnn`` for attention; ``aten`` for PyTorch's own kernels;
    None when the name does not say), ``tile`` (the CTA tile ``"MxN"`` the name carries: ``..._128x256_...``,
    ``tilesize128x128x64``; None when it carries none) and ``split_k`` (True for split-K / stream-K kernels and
    ``splitKreduce`` reductions, False for ``segment_k_off``, None when the name does not say)."""
    if not name:
        return {"library": None, "tile": None, "split_k": None}
    low = name.lower()
    attn = attention_backend(name)
    if attn is not None:
        lib = attn
    elif "cutlass" in low and not low.startswith(("nvjet", "sm80_xmma", "sm90_xmma")):
        lib = "cutlass"
    elif kernel_tier(name) in ("native", "gemv") or "splitkreduce" in low or "cublas" in low:
        lib = "cublas"
    elif "at::native::" in low or low.startswith("aten::"):
        lib = "aten"
    else:
        lib = None
    m = _TILE.search(low) if lib in ("cublas", "cutlass") else None
    split = True if _SPLIT_ON.search(low) else False if "segment_k_off" in low else None
    return {"library": lib, "tile": f"{m.group(1)}x{m.group(2)}" if m else None, "split_k": split}


# lower is better: a native kernel or a full-width CUTLASS one, then the narrower vector loads
TIER_RANK = {"native": 1, "align8": 1, "cutlass": 2, "fallback": 2, "align4": 2, "align2": 2, "align1": 3}


def attention_backend(name: str | None) -> str | None:
    """The SDPA backend a CUDA attention kernel belongs to, or None for any other kernel.

    ``flash``: PyTorch's FlashAttention-2 port (``pytorch_flash::flash_fwd_kernel<...>``,
    ``flash_fwd_splitkv_kernel``); ``efficient``: the memory-efficient (xFormers CUTLASS) kernels
    (``fmha_cutlassF_f16_aligned_64x128_rf_sm80``); ``cudnn``: cuDNN's SDPA kernels, generated
    (``cudnn_generated_fort_native_sdpa_sm90_flash_fprop_...``, ``cudnn_generated_fort_native_sdpa_sm90_knob_7_...``)
    or named otherwise by other cuDNN releases: any kernel whose name says cuDNN and attention, or uses cuDNN's
    words for an attention forward pass (``flash_fprop``, ``sdpa`` with ``fprop``). The math backend runs plain
    GEMMs and a softmax, so it has no kernel of its own (:func:`is_math_attention_kernel`).
    """
    if not name:
        return None
    low = name.lower()
    attention = any(w in low for w in ("sdpa", "fmha", "mha", "attention", "attn"))
    if ("cudnn" in low and attention) or "flash_fprop" in low or ("sdpa" in low and "fprop" in low):
        return "cudnn"
    if "fmha_cutlass" in low or "memeffattention" in low or "attentionkernel<" in low:
        return "efficient"
    if "flash_fwd" in low or "pytorch_flash::" in low:
        return "flash"
    return None


def is_math_attention_kernel(name: str | None) -> bool:
    """Whether ``name`` is a kernel the math SDPA backend runs: a GEMM (``bmm``'s cuBLAS/CUTLASS kernels), a
    softmax, or an elementwise/reduction kernel of ATen. An attention kernel of no known backend is not."""
    if not name:
        return False
    if kernel_tier(name) != "unknown":
        return True
    low = name.lower()
    return any(w in low for w in ("softmax", "at::native::", "elementwise", "reduce_kernel"))
