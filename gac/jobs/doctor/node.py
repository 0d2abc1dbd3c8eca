"""``gac doctor``: what a node's software and hardware do for gac, checked in about a minute, one line per check.

Run it first on a new cluster (``srun --gres=gpu:1 gac doctor``), in the spirit of ``python -m
torch.utils.collect_env`` and ``accelerate env`` but for what gac depends on:

* ``versions``: torch (+ CUDA, cuDNN), transformers (and whether it accepts this torch: transformers >= 5.20
  disables torch < 2.6), lm-eval, hydra, submitit, wandb, gac and its git commit;
* ``slurm``: the job's Slurm environment, if any; ``cuda`` and ``device``: name, memory, SM count, clocks;
* ``cache hub/datasets/gac/lm-eval``: where each cache is, the variable that moves it and the free space there;
  ``hub``: whether the Hugging Face hub answers (through the environment's proxy), whether a token is set and may
  read the paper's gated model;
* ``sdpa d=D DTYPE`` for head_dim 64, 96, 107, 112, 128 in fp16 and bf16 (float32 on a CPU): which backend
  PyTorch's dispatcher picks (``torch._fused_sdp_choice``), which kernel then actually runs (``torch.profiler``,
  captured after all timing), which backends accept the shape (each forced once with ``sdpa_kernel``), the
  latency of each, and what PyTorch's source says about the shape (:data:`SOURCE_RULES`);
* ``gemm K=4096/4097``: one GEMM at an aligned and a misaligned K, with the kernel that ran and its tier
  (:func:`gac.profiling.kernels.kernel_tier`; a kernel it cannot place is a FAIL: Table 3 would lose its tiers);
* ``smoke``: the embedded ``tiny`` on the device: compress (ASVD + gac) -> save and reload the checkpoint ->
  perplexity and prefill latency -> the side-by-side bench of the baseline and the compressed plan.
* ``default <compressor>`` (with the smoke): every compressor's own default allocation and proxy on ``tiny`` in the
  device's dtype (ASVD's sensitivity search, SVD-LLM's whitening, PaLU's Fisher rank search, LLM-Pruner's Taylor
  scores), each reporting the path its stages took: the search's layer cache or its full-forward fallback (a FAIL:
  every probe of the real search would cost a whole forward), the gradient pass's dtype and its fraction of
  exactly-zero gradients (a FAIL above :data:`gac.jobs.doctor.runs.MAX_ZERO_GRADIENTS`: underflow), any whitening fallback, and the
  compressed perplexity (a FAIL when not finite or above :data:`gac.jobs.doctor.runs.MAX_PPL_GROWTH` x the dense one).

Each check is ``PASS`` / ``FAIL`` (with the reason) or ``INFO`` (a fact, not judged: CUDA absent on a CPU node).
The command exits 1 when any check failed, else 0. Profiler sessions come last (after every timed call), since a
CUDA profiler session leaves CUPTI attached and slows what is timed after it (pytorch issue 144455).
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.jobs.doctor.check import Check
from gac.jobs.doctor.check import guard as _guard
from gac.jobs.doctor.runs import default_checks, smoke_check

log = logging.getLogger(__name__)

HEAD_DIMS = (64, 96, 107, 112, 128)
GPU_DTYPES = ("float16", "bfloat16")
# What PyTorch's source says about head_dim (torch 2.5-2.9): aten/src/ATen/native/transformers/attention.cpp,
# scaled_dot_product_attention: the flash case pads q/k/v with pad_last_dim<8, false> and slices the output back
# (post_process_flash_output); cuda/sdp_utils.cpp: check_head_dim_size_flash (q, k, v the same head_dim <= 256),
# check_head_dim_size_mem_efficient (head_dim divisible by minimum_gemm_alignment: 8 for fp16/bf16 on sm80+),
# check_cudnn_tensor_shapes (head_dim a multiple of 8 and <= 128; <= 256 on sm90 with cuDNN >= 9.10 in newer torch).
SOURCE_RULES = {
    "flash": "head_dim <= 256 (padded up to a multiple of 8, output sliced back)",
    "efficient": "head_dim a multiple of 8 (fp16/bf16)",
    "cudnn": "head_dim a multiple of 8 and <= 128 (<= 256 on Hopper with cuDNN >= 9.10)",
    "math": "any head_dim",
}


def source_accepts(backend: str, d: int) -> bool:
    """Whether PyTorch's shape checks admit head_dim ``d`` for ``backend`` on an sm80+ GPU in fp16/bf16."""
    return {"flash": d <= 256, "efficient": d % 8 == 0, "cudnn": d % 8 == 0 and d <= 128, "math": True}[backend]


# ------------------------------------------------------------------------------------------------ versions
def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def check_versions() -> Check:
    import torch

    from gac.provenance import provenance

    prov = provenance()
    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001 - a build without cuDNN
        cudnn = None
    v = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn,
         "transformers": _version("transformers"), "lm_eval": _version("lm_eval") or _version("lm-eval"),
         "hydra": _version("hydra-core"), "submitit": _version("submitit"), "wandb": _version("wandb"),
         "gac": prov["gac_version"], "git_commit": prov["git_commit"], "git_dirty": prov["git_dirty"],
         "python": platform.python_version()}
    problems = [f"{k} is not installed" for k in ("transformers", "lm_eval", "hydra", "submitit", "wandb") if not v[k]]
    from packaging.version import Version

    if v["transformers"]:
        from transformers.utils import is_torch_available

        if Version(v["transformers"]) < Version("5.0"):
            problems.append(f"transformers {v['transformers']} is older than 5.0 (gac needs its dtype= and "
                            f"transformers.initialization): pip install 'transformers>=5.0'")
        elif not is_torch_available():
            problems.append(f"transformers {v['transformers']} disables torch {torch.__version__} (transformers 5.20+ "
                            f"needs torch >= 2.6): pip install 'transformers<5.20' or a newer torch")
    commit = (v["git_commit"] or "no git")[:10] + ("+dirty" if v["git_dirty"] else "")
    detail = (f"torch {v['torch']} (CUDA {v['cuda'] or 'none'}, cuDNN {cudnn or 'none'}), transformers "
              f"{v['transformers']}, lm-eval {v['lm_eval']}, hydra {v['hydra']}, submitit {v['submitit']}, wandb "
              f"{v['wandb']}, gac {v['gac']} ({commit}), python {v['python']}")
    if problems:
        return Check("versions", "FAIL", "; ".join(problems) + f" [{detail}]", v)
    return Check("versions", "PASS", detail, v)


SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS",
              "SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_NODE", "SLURM_ARRAY_TASK_ID", "CUDA_VISIBLE_DEVICES")


def check_slurm() -> Check:
    env = {k: os.environ[k] for k in SLURM_VARS if k in os.environ}
    if "SLURM_JOB_ID" not in env:
        extra = f" (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})" if "CUDA_VISIBLE_DEVICES" in env else ""
        return Check("slurm", "INFO", "not inside a Slurm job" + extra, env)
    return Check("slurm", "INFO", ", ".join(f"{k.removeprefix('SLURM_').lower()}={v}" for k, v in env.items()), env)


# ------------------------------------------------------------------------------------------------ caches, hub
LOW_FREE_GB = 20  # an 8B model's fp16 weights are ~16 GB; its compressed checkpoints and datasets come on top


def cache_locations() -> list[tuple[str, str, object, str]]:
    """``(name, what it holds, path, the variable that moves it)`` of every cache a job writes to."""
    from pathlib import Path

    from gac.fixtures.tiny import cache_root
    from gac.hub import datasets_cache_dir, hub_cache_dir

    lm_eval = os.environ.get("LM_HARNESS_CACHE_PATH")
    if not lm_eval:
        try:
            import lm_eval.caching.cache as lm_cache

            lm_eval = lm_cache.PATH
        except Exception:  # noqa: BLE001 - lm-eval missing or changed: its line says so
            lm_eval = None
    return [
        ("hub", "model weights", hub_cache_dir(), "HF_HOME or HF_HUB_CACHE"),
        ("datasets", "WikiText-2 and lm-eval's task data", datasets_cache_dir(), "HF_HOME or HF_DATASETS_CACHE"),
        ("gac", "the tiny, smollm2 and enwiki fixtures", cache_root(), "GAC_CACHE"),
        ("lm-eval", "lm-eval's request cache (only with its cache_requests)", Path(lm_eval) if lm_eval else None,
         "LM_HARNESS_CACHE_PATH"),
    ]


def free_gb(path) -> float | None:
    """Free space on the file system that holds ``path`` (its nearest existing parent), in GB; None: unknown."""
    import shutil
    from pathlib import Path

    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free / 1e9
    except OSError:
        return None


def check_caches() -> list[Check]:
    """One INFO line per cache: where it is, what moves it and the free space there (``low`` under
    :data:`LOW_FREE_GB`: on clusters $HOME is often small and shared; move the cache to scratch)."""
    checks = []
    for name, what, path, var in cache_locations():
        if path is None:
            checks.append(Check(f"cache {name}", "INFO", f"unknown ({what}; set {var})"))
            continue
        free = free_gb(path)
        room = "free space unknown" if free is None else f"{free:.0f} GB free"
        low = (name in ("hub", "datasets") and free is not None and free < LOW_FREE_GB)
        note = f"; low for an 8B model (~16 GB of weights): set {var} to a larger disk" if low else ""
        checks.append(Check(f"cache {name}", "INFO", f"{path} ({room}; {what}; moved by {var}){note}",
                            {"path": str(path), "free_gb": free, "variable": var}))
    return checks


GATED_MODEL = "meta-llama/Meta-Llama-3-8B"  # the paper's model (conf/model/llama3_8b.yaml), gated on the hub


def check_hub() -> Check:
    """Whether the Hugging Face hub answers here (through the proxy the environment names), whether a token is
    set, and whether it may read the paper's gated model. INFO: an offline node with local models needs none."""
    from gac.hub import hub_access_problem, hub_endpoint, hub_token, hub_unreachable

    token = hub_token()
    source = ("HF_TOKEN" if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
              else "`hf auth login`'s")
    token_part = (f"a token is set ({source})" if token
                  else "no token (gated models need HF_TOKEN or `hf auth login`)")
    why = hub_unreachable()
    if why is not None:
        return Check("hub", "INFO", f"{hub_endpoint()} not reachable ({why}): only cached or local models and data; "
                                    f"{token_part}", {"reachable": False, "token": bool(token)})
    problem = hub_access_problem(GATED_MODEL)
    access = f"{GATED_MODEL}: readable" if problem is None else problem
    return Check("hub", "INFO", f"{hub_endpoint()} reachable; {token_part}; {access}",
                 {"reachable": True, "token": bool(token), "gated_access": problem is None})


def _caches_and_hub() -> list[Check]:
    """The caches' lines and the hub's (each failure a FAIL line, never the end of the doctor)."""
    try:
        caches = check_caches()
    except Exception as e:  # noqa: BLE001 - a check never takes the others down
        caches = [Check("caches", "FAIL", f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")]
    return caches + [_guard("hub", check_hub)]


# ------------------------------------------------------------------------------------------------ device
def pick_device(device: str | None):
    """The device to check: ``device`` as given (``cuda`` without CUDA is an error), else cuda if present, else
    the CPU. Returns ``(torch.device, Check)``."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device is None:
        if n:
            return torch.device("cuda", torch.cuda.current_device()), Check(
                "cuda", "PASS", f"{n} device(s) visible; checking cuda:{torch.cuda.current_device()}", {"count": n})
        why = ("this torch is a CPU build" if not torch.version.cuda
               else f"torch built for CUDA {torch.version.cuda} sees no GPU (driver, CUDA_VISIBLE_DEVICES, --gres?)")
        return torch.device("cpu"), Check("cuda", "INFO", f"CUDA not available: {why}; CPU checks only", {"count": 0})
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise GacError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return dev, Check("cuda", "INFO", f"{n} CUDA device(s) visible; checking the CPU as asked", {"count": n})
    if dev.type != "cuda":
        raise GacError(f"gac doctor checks cpu or cuda devices, not {dev.type!r}")
    if not n:
        return dev, Check("cuda", "FAIL", f"{device} asked for but CUDA is not available here (torch "
                                          f"{torch.__version__}, CUDA {torch.version.cuda or 'none'}); run on a GPU "
                                          f"node (srun --gres=gpu:1 gac doctor)", {"count": 0})
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx >= n:
        return dev, Check("cuda", "FAIL", f"{device} does not exist: {n} device(s) visible (cuda:0..cuda:{n - 1})",
                          {"count": n})
    return torch.device("cuda", idx), Check("cuda", "PASS", f"{n} device(s) visible; checking cuda:{idx}",
                                            {"count": n})


def check_device(dev) -> Check:
    import torch

    from gac.compression.resources import device_memory
    from gac.evaluation.bench_device import device_info

    info = device_info(dev)
    mem = device_memory(str(dev))
    info.update(total_gib=None if mem["total_mb"] is None else round(mem["total_mb"] / 1024, 1),
                available_gib=None if mem["available_mb"] is None else round(mem["available_mb"] / 1024, 1))
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info["sm_count"] = props.multi_processor_count
        clocks = ", ".join(f"{k.split('.', 1)[1]} {v}" for k, v in info.items() if k.startswith("nvidia_smi.clocks"))
        detail = (f"{info['name']} (sm {info['capability']}), {info['sm_count']} SMs, {info['total_gib']} GiB "
                  f"({info['available_gib']} GiB free)" + (f", clocks: {clocks}" if clocks else ""))
        cc = (props.major, props.minor)
        if cc < (8, 0):
            return Check("device", "FAIL", detail + "; FlashAttention-2 and the paper's kernel tiers need sm 8.0+ "
                                                    "(A100, H100)", info)
        return Check("device", "PASS", detail, info)
    detail = (f"{info['name']}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
              f"{info['total_gib']} GiB ({info['available_gib']} GiB available)")
    return Check("device", "PASS", detail, info)


# ------------------------------------------------------------------------------------------------ kernels
@dataclass
class _Pending:
    """A kernel to capture once every timing is done: its check, the callable and its inputs."""

    check: Check
    fn: Callable
    args: tuple
    key: str = "kernel"


def _quick_protocol(dev):
    from gac.profiling.timing import TimingProtocol

    return TimingProtocol(warmup=3, iters=10, trials=3, max_buffers=4) if dev.type == "cuda" else TimingProtocol(
        warmup=1, iters=3, trials=3, flush_bytes=2**20, max_buffers=2)


def sdpa_checks(dev, dims: Sequence[int] = HEAD_DIMS, dtypes: Sequence[str] | None = None,
                pending: list | None = None) -> list[Check]:
    """One check per (head_dim, dtype): the dispatcher's backend, the backends that accept the shape, latencies."""
    import torch

    from gac.dtypes import resolve_dtype
    from gac.profiling.kernels import available_sdpa_backends, sdpa_with_backend, selected_sdpa_backend
    from gac.profiling.timing import time_op

    cuda = dev.type == "cuda"
    dtypes = list(dtypes or (GPU_DTYPES if cuda else ("float32",)))
    B, S, H = (4, 2048, 32) if cuda else (1, 256, 4)
    protocol = _quick_protocol(dev)
    out = []
    for dt_name in dtypes:
        dt = resolve_dtype(dt_name, dev)
        for d in dims:
            name = f"sdpa d={d} {dt_name.replace('float', 'fp').replace('bfp16', 'bf16')}"

            def one(d=d, dt=dt, dt_name=dt_name, name=name):
                def make():
                    return tuple(torch.randn(B, S, H, d, device=dev, dtype=dt).transpose(1, 2) for _ in range(3))

                q, k, v = make()
                chosen = selected_sdpa_backend(q, k, v)
                if not cuda and chosen == "flash":
                    chosen = "flash (cpu)"  # ATen's CPU kernel, as latency records name it
                accepts, ms = [], {}
                with torch.inference_mode():
                    ms["auto"] = time_op(make, sdpa_with_backend(None), dev, protocol).median_ms
                    for b in available_sdpa_backends(dev):
                        try:
                            ms[b] = time_op(make, sdpa_with_backend(b), dev, protocol).median_ms
                            accepts.append(b)
                        except RuntimeError:
                            continue
                data = {"head_dim": d, "dtype": dt_name, "shape": [B, S, H, d], "selected": chosen,
                        "accepts": accepts, "latency_ms": ms}
                if cuda:
                    data["source_accepts"] = [b for b in ("flash", "efficient", "cudnn", "math")
                                              if source_accepts(b, d)]
                check = Check(name, "PASS", "", data)
                if pending is not None:
                    pending.append(_Pending(check, sdpa_with_backend(None), (q, k, v)))
                return check

            out.append(_guard(name, one))
    return out


def _finish_sdpa(check: Check, kernel: str | None, cuda: bool) -> None:
    from gac.profiling.kernels import attention_backend, is_math_attention_kernel

    d = check.data
    d["kernel"] = kernel
    ran = attention_backend(kernel) if cuda else d["selected"]
    if cuda and ran is None:
        # GEMMs and a softmax: the math backend has no kernel of its own. Another kernel is an attention kernel
        # whose name gac does not know (a new cuDNN or flash release): said, never judged a mismatch
        ran = "math" if kernel is None or is_math_attention_kernel(kernel) else "unknown"
    d["ran"] = ran
    others = ", ".join(f"{b} {ms:.3f}" for b, ms in d["latency_ms"].items() if b != "auto")
    detail = (f"runs {ran} ({d['latency_ms']['auto']:.3f} ms{'; kernel ' + kernel[:60] if kernel else ''}); accepts "
              f"{', '.join(d['accepts']) or 'none'}; forced ms: {others or '-'}")
    if cuda:
        differs = sorted(set(d["accepts"]) ^ set(d["source_accepts"]))
        if differs:
            detail += f"; differs from the torch 2.5-2.9 source for: {', '.join(differs)} (see SOURCE_RULES)"
    check.detail = detail
    if cuda and ran == "unknown":
        check.status = "INFO"
        check.detail = (f"the dispatcher picks {d['selected']}; the kernel that ran is not one gac names "
                        f"(gac.profiling.kernels.attention_backend), so which backend ran is not judged; " + detail)
    elif cuda and d["selected"] != "unknown" and ran != d["selected"]:
        check.status = "FAIL"
        check.detail = f"the dispatcher picks {d['selected']} but the kernel that ran is {ran}'s; " + detail


def gemm_check(dev, pending: list | None = None) -> Check:
    """An ``F.linear`` GEMM at an aligned and a misaligned K (4096 vs 4097 on a GPU in fp16)."""
    import torch
    import torch.nn.functional as F

    from gac.profiling.timing import time_op

    cuda = dev.type == "cuda"
    M = N = K = 4096 if cuda else 512
    dt = torch.float16 if cuda else torch.float32
    name = f"gemm K={K}/{K + 1}"

    def run():
        data = {"M": M, "N": N, "dtype": dtype_str(dt), "points": {},
                "capability": ".".join(map(str, torch.cuda.get_device_capability(dev))) if cuda else None}
        check = Check(name, "PASS", "", data)
        with torch.inference_mode():
            for k in (K, K + 1):
                def make(k=k):
                    return (torch.randn(M, k, device=dev, dtype=dt), torch.randn(N, k, device=dev, dtype=dt))

                t = time_op(make, F.linear, dev, _quick_protocol(dev))
                data["points"][str(k)] = {"K": k, "ms": t.median_ms, "tflops": 2 * M * N * k / t.median_ms / 1e9}
                if pending is not None:
                    pending.append(_Pending(check, F.linear, make(), key=str(k)))
        return check

    return _guard(name, run)


def _finish_gemm(check: Check, kernels: dict) -> None:
    from gac.profiling.kernels import gemm_aligned, kernel_tier

    pts = check.data["points"]
    itemsize = 4 if check.data.get("dtype") == "float32" else 2
    parts, unknown = [], []
    for k, p in pts.items():
        p["kernel"] = kernels.get(k)
        aligned = gemm_aligned(int(k), int(check.data.get("N") or 8), itemsize)
        # an older generation's kernel is a fallback on the misaligned K only: on the aligned K it is cuBLAS's pick
        p["tier"] = kernel_tier(p["kernel"], check.data.get("capability"), aligned)
        if p["tier"] in ("unknown", "gemm"):
            unknown.append(p["kernel"] or "(no kernel captured)")
        parts.append(f"K={k} {p['ms']:.3f} ms {p['tier']} ({(p['kernel'] or '-')[:48]})")
    ks = sorted(pts, key=int)
    ratio = pts[ks[1]]["ms"] / pts[ks[0]]["ms"] if pts[ks[0]]["ms"] > 0 else float("nan")
    check.data["misaligned_over_aligned"] = ratio
    check.detail = "; ".join(parts) + f"; K+1 / K = {ratio:.2f}x"
    if unknown:
        check.status = "FAIL"
        check.detail = (f"gac's kernel_tier does not know {unknown[0][:80]!r} (Table 3 would show no tier; add the "
                        f"name to gac/profiling/kernels.py); " + check.detail)


def _capture(pending: list, dev) -> dict:
    """Kernel names of every pending call, in one pass after all timing (module docstring)."""
    import torch

    from gac.profiling.kernels import main_kernel

    out = {}
    with torch.inference_mode():
        for p in pending:
            out[(id(p.check), p.key)] = main_kernel(p.fn, p.args, dev)
    return out


# ------------------------------------------------------------------------------------------------ the run
def run_doctor(device: str | None = None, smoke: bool = True, dims: Sequence[int] = HEAD_DIMS,
               dtypes: Sequence[str] | None = None, workdir: str | None = None) -> dict:
    """Every check (module docstring). Returns ``{"checks": [...], "failed": n, "device": str}``."""
    dev, cuda_check = pick_device(device)  # a bad --device is bad input (exit 2) before any work
    checks = [_guard("versions", check_versions), _guard("slurm", check_slurm), cuda_check]
    checks += _caches_and_hub()
    if cuda_check.status == "FAIL":
        return _result(checks, dev)
    checks.append(_guard("device", lambda: check_device(dev)))
    pending: list[_Pending] = []
    sdpa = sdpa_checks(dev, dims, dtypes, pending)  # timing first ...
    gemm = gemm_check(dev, pending)
    checks += sdpa + [gemm]
    if smoke:
        checks.append(smoke_check(dev, workdir=workdir))
        checks += default_checks(dev)
    kernels = {}
    try:
        kernels = _capture(pending, dev)  # ... profiler sessions last
    except Exception as e:  # noqa: BLE001 - the checks that need kernel names fail below with the reason
        log.warning("kernel names could not be captured: %s", e)
    for c in sdpa:
        if c.status == "PASS":
            _finish_sdpa(c, kernels.get((id(c), "kernel")), dev.type == "cuda")
    if gemm.status == "PASS":
        _finish_gemm(gemm, {k: kernels.get((id(gemm), k)) for k in gemm.data["points"]})
    if dev.type == "cuda":
        checks.append(Check("profiler", "INFO", "CUPTI stays attached after a profiler session unless "
                            f"TEARDOWN_CUPTI=1 (now {os.environ.get('TEARDOWN_CUPTI', 'unset')}); gac captures kernel "
                            "names after all timing or in a child process"))
    return _result(checks, dev)


def _result(checks: list[Check], dev) -> dict:
    return {"device": str(dev), "checks": [asdict(c) for c in checks],
            "failed": sum(c.status == "FAIL" for c in checks), "lines": format_lines(checks)}


def format_lines(checks: list[Check]) -> list[str]:
    width = max((len(c.name) for c in checks), default=10)
    return [c.line(width) for c in checks]
