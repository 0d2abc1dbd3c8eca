"""The gac checkpoint format and its integrity: the files of a checkpoint directory, its config
(``gac_checkpoint.json``), the checks that a config is usable and that the files are the ones saved.

Layout of a checkpoint directory::

    gac_checkpoint.json      format, gac version, base HF config, every projection's spec (shape, rank, width),
                             recipe (compressor, options, proxy, ratio, strategy, calibration), plan, provenance,
                             kv_cache (full | latent: PaLU's latent KV cache installed on load)
    gac_model.safetensors    all weights (shared / tied tensors stored once)
    gac_buffers.safetensors  non-persistent buffers (rotary inv_freq) exactly as they were, dtype included
    tokenizer files          when a tokenizer was given (tokenizer.json, tokenizer_config.json, ...)

Integrity: the sha256 of the weights (and buffers) file and of every tokenizer file is recorded and **verified on
load** (a tokenizer with two ids swapped scores another text: format 3); a flipped byte, a truncated or replaced
file, a tokenizer file the checkpoint did not save, is a :class:`GacError` naming the fix. So is
``gac_checkpoint.json`` itself (``meta_sha256``, checkpoints saved since it was added): an edited rope_theta changes
no shape but every logit. Before anything is built, :func:`gac.compression.checkpoint_load.check_checkpoint` checks
the config's fields and types (:func:`meta_problem`), that the files it names lie inside the checkpoint, and that
the architecture it describes has exactly the weights file's tensors, shapes and dtype.
``load_checkpoint(path, verify=False)`` (``gac evaluate --no-verify``) skips the hash (about 1 s per 1.5 GB) for a
file you trust; a truncated or unparsable file is still an error. Files are created with mode 0666 minus the umask.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.hashing import digest, file_sha256
from gac.io import missing_reason, read_json
from gac.layout import CHECKPOINT_FILE
from gac.untrusted import config_field_problem

FORMAT = "gac-checkpoint"
#: what a model's KV cache holds: the K/V themselves, or PaLU's latent codes (gac.compression.latent_cache); older
#: checkpoints have no ``kv_cache`` field and load as ``full``, as they ran
KV_CACHES = ("full", "latent")
FORMAT_VERSION = 3  # 2: the config's own sha256 and the weights' sha256, required on load; 3: the tokenizer files' too
META_FILE = CHECKPOINT_FILE  # the checkpoint's config (gac.layout names it for every reader of a model dir)
WEIGHTS_FILE = "gac_model.safetensors"
BUFFERS_FILE = "gac_buffers.safetensors"  # non-persistent buffers (rotary inv_freq): their dtype/values affect logits

#: files a tokenizer loader reads from a directory (transformers' AutoTokenizer): a checkpoint hashes those it saved
_TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja",
                    "chat_template.json")


def is_tokenizer_file(name: str) -> bool:
    return name in _TOKENIZER_NAMES or name.startswith("vocab.") or name.endswith((".model", ".tiktoken"))


def read_meta(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_dir():
        raise GacError(f"checkpoint {str(p)!r} is not a directory")
    meta = read_json(p / META_FILE, "gac checkpoint config", max_bytes=256 << 20)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise GacError(f"{str(p / META_FILE)!r} is not a gac checkpoint config (format != {FORMAT!r})")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise GacError(f"{str(p / META_FILE)!r} has format_version {version!r}, not an integer; {COPY_CHECKPOINT_AGAIN}")
    if version > FORMAT_VERSION:
        raise GacError(f"checkpoint format {version} is newer than this gac understands ({FORMAT_VERSION}); upgrade gac")
    return meta


COPY_CHECKPOINT_AGAIN = "copy the checkpoint again from its source"
DTYPES = ("float32", "float16", "bfloat16")


def meta_sha256(meta: dict) -> str:
    """The sha256 of a checkpoint config without its own ``meta_sha256`` (canonical JSON)."""
    import json

    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return digest(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False), None)


def file_inside(p: Path, name, what: str) -> Path:
    """``p / name`` for a file the checkpoint config names: a plain name inside the checkpoint directory (no path,
    no link out of it), or a :class:`GacError`."""
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise GacError(f"checkpoint {str(p)!r}: its {what} is {name!r}, not a file name inside the checkpoint "
                       f"directory; {COPY_CHECKPOINT_AGAIN}")
    f = p / name
    if f.is_symlink():
        try:
            real = f.resolve(strict=True)
        except (OSError, RuntimeError):
            raise GacError(f"checkpoint {str(p)!r}: its {what} {name!r} {missing_reason(f)}; {COPY_CHECKPOINT_AGAIN}") from None
        if real.parent != p.resolve():
            raise GacError(f"checkpoint {str(p)!r}: its {what} {name!r} is a link to {str(real)!r}, outside the "
                           f"checkpoint; gac reads weights only from inside a checkpoint: {COPY_CHECKPOINT_AGAIN}")
    return f


def meta_problem(meta: dict) -> str | None:
    """What makes a checkpoint config unusable (None when nothing does): the fields gac writes, with their types."""
    if meta.get("dtype") not in DTYPES:
        return f"its dtype {meta.get('dtype')!r} is not one gac saves ({', '.join(DTYPES)})"
    base = meta.get("base_config")
    if not isinstance(base, dict) or not isinstance(base.get("model_type"), str):
        return "its base_config is not a Hugging Face config with a model_type"
    why = config_field_problem(base)  # the numbers no model runs with (RoPE, epsilon, length), as in config.json
    if why:
        return f"its base_config's {why}"
    mods = meta.get("modules")
    if not isinstance(mods, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in mods.items()):
        return "its modules are not an object of {name: spec}"
    w = meta.get("weights")
    if not isinstance(w, dict) or not isinstance(w.get("file"), str):
        return "it names no weights file"
    if meta.get("kv_cache", "full") not in KV_CACHES:  # absent in checkpoints saved before PaLU's latent cache
        return f"its kv_cache {meta.get('kv_cache')!r} is not one gac saves ({', '.join(KV_CACHES)})"
    return None


def base_config(meta: dict):
    """The transformers config of a checkpoint's recorded base model (the uncompressed architecture), once
    :func:`meta_problem` finds nothing (the fields and the values no model runs with); a one-line :class:`GacError`
    naming the field otherwise."""
    from transformers import AutoConfig

    problem = meta_problem(meta)
    if problem:
        raise GacError(problem)
    base = dict(meta["base_config"])
    model_type = base.pop("model_type", None)
    try:
        return AutoConfig.for_model(model_type, **base)
    except (ValueError, KeyError, TypeError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GacError(f"cannot rebuild the base config (model_type {model_type!r}): "
                       f"{why if len(why) < 200 else why[:197] + '...'}") from None


SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
                       "I32": "int32", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def torch_dtype(d):
    if isinstance(d, torch.dtype):
        return d
    try:
        dt = getattr(torch, dtype_str(d))
    except AttributeError:
        dt = None
    if not isinstance(dt, torch.dtype):
        raise GacError(f"unknown dtype {d!r}; use float32, float16 or bfloat16")
    return dt


def check_hashes_present(p: Path, meta: dict) -> None:
    """Every hash this format writes is there: a deleted hash never turns verification off."""
    version = meta.get("format_version", 0)
    if version < 2:
        raise GacError(f"checkpoint {str(p)!r} has format {version}, which carries no hash of its config; re-save it "
                       f"with this gac (gac compress ... -o DIR), or load it with verify=False (gac evaluate "
                       f"--no-verify) if you trust it")
    w = meta.get("weights") if isinstance(meta.get("weights"), dict) else {}
    needed = {"meta_sha256": meta.get("meta_sha256"), "weights.sha256": w.get("sha256")}
    if w.get("buffers"):
        needed["weights.buffers_sha256"] = w.get("buffers_sha256")
    missing = [k for k, v in needed.items() if not isinstance(v, str) or not v]
    toks = meta.get("tokenizer_files")
    if version >= 3 and not (isinstance(toks, dict) and all(isinstance(k, str) and isinstance(v, str) and v
                                                            for k, v in toks.items())):
        missing.append("tokenizer_files")
    if version == 2 and not missing:
        held = sorted(f.name for f in p.iterdir() if is_tokenizer_file(f.name)) if p.is_dir() else []
        if held:
            raise GacError(f"checkpoint {str(p)!r} has format 2, which carries no hash of its tokenizer files "
                           f"({', '.join(held)}); re-save it with this gac (gac compress ... -o DIR), or load it with "
                           f"verify=False (gac evaluate --no-verify) if you trust them")
    if missing:
        raise GacError(f"checkpoint {str(p)!r}: {META_FILE} lacks {', '.join(missing)}, which every checkpoint of "
                       f"format {FORMAT_VERSION} has (it was edited or damaged); {COPY_CHECKPOINT_AGAIN}, or load with verify=False "
                       f"(gac evaluate --no-verify) if you edited it on purpose")


def verify_checkpoint(path: str | os.PathLike, meta: dict | None = None) -> None:
    """Check the weights (and buffers) files against the sha256 recorded at save time."""
    p = Path(path)
    meta = meta or read_meta(p)
    check_hashes_present(p, meta)
    w = meta.get("weights") or {}
    for file, recorded in ((w.get("file"), w.get("sha256")), (w.get("buffers"), w.get("buffers_sha256"))):
        if not file or not recorded:
            continue
        f = file_inside(p, file, "weights file")
        if not f.is_file():
            raise GacError(f"checkpoint {str(p)!r}: its file {file!r} {missing_reason(f)}; copy the whole checkpoint "
                           f"directory")
        _check_sha256(p, f, file, recorded)
    toks = meta.get("tokenizer_files") if isinstance(meta.get("tokenizer_files"), dict) else {}
    for file, recorded in toks.items():
        f = file_inside(p, file, "tokenizer file")
        if not f.is_file():
            raise GacError(f"checkpoint {str(p)!r} lacks its tokenizer file {file!r} ({missing_reason(f)}); copy the "
                           f"whole checkpoint directory")
        _check_sha256(p, f, file, recorded)
    if meta.get("format_version", 0) >= 3:
        foreign = sorted(f.name for f in p.iterdir() if is_tokenizer_file(f.name) and f.name not in toks)
        if foreign:
            raise GacError(f"checkpoint {str(p)!r} holds {foreign[0]!r}, a tokenizer file it did not save (the "
                           f"tokenizer would read it); remove it, or copy the checkpoint again from its source")


def _check_sha256(p: Path, f: Path, file: str, recorded: str) -> None:
    got = _verified_sha256(f)
    if got != recorded:
        raise GacError(f"checkpoint {str(p)!r}: {file} does not match the sha256 recorded when it was saved (the "
                       f"file was damaged or changed: {got[:12]}... != {recorded[:12]}...); copy the checkpoint again "
                       f"from its source, or load with verify=False (gac evaluate --no-verify) if you trust it")


_HASHED: dict[tuple, str] = {}  # (file, device, inode, size, mtime_ns) -> sha256: a file checked twice is read once


def _verified_sha256(f: Path) -> str:
    st = f.stat()
    ident = (str(f.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if ident not in _HASHED:
        _HASHED[ident] = file_sha256(f)
    return _HASHED[ident]


def safetensors_error(p: Path, file: Path, e: Exception) -> GacError:
    return GacError(f"checkpoint {str(p)!r}: {file.name} is truncated or not a safetensors file "
                    f"({str(e).splitlines()[0][:200]}); copy the checkpoint again from its source")
