"""Compressed checkpoints: save to a directory, reload to identical logits.

Layout of a checkpoint directory::

    gac_checkpoint.json      format, gac version, base HF config, every projection's spec (shape, rank, width),
                             recipe (compressor, options, proxy, ratio, strategy, calibration), plan, provenance
    gac_model.safetensors    all weights (shared / tied tensors stored once)
    gac_buffers.safetensors  non-persistent buffers (rotary inv_freq) exactly as they were, dtype included
    tokenizer files          when a tokenizer was given (tokenizer.json, tokenizer_config.json, ...)

Why not ``save_pretrained``: transformers rebuilds the *original* architecture and silently random-initialises
any weight whose name or shape it does not recognise (a low-rank ``q_proj.down.weight`` or a pruned ``gate_proj``).
A gac checkpoint therefore has no ``config.json`` and no ``model.safetensors``: ``AutoModelForCausalLM.from_pretrained``
on it fails with an error instead of loading a silently broken model. :func:`load_checkpoint` rebuilds the
compressed structure from the recorded specs *before* reading weights and loads with ``strict`` key matching, so
every parameter comes from the file (a missing or unexpected tensor is an error). A model gac compressed (in
memory, or loaded from a checkpoint) has a guarded ``save_pretrained``: it writes a gac checkpoint instead of a
folder transformers would load with random weights (:func:`save_pretrained`).

Integrity: the sha256 of the weights (and buffers) file and of every tokenizer file is recorded and **verified on
load** (a tokenizer with two ids swapped scores another text: format 3); a flipped byte, a truncated or replaced file,
a tokenizer file the checkpoint did not save, is a :class:`GacError` naming the fix. So is ``gac_checkpoint.json`` itself (``meta_sha256``,
checkpoints saved since it was added): an edited rope_theta changes no shape but every logit. Before anything is
built, :func:`check_checkpoint` checks the config's fields and types, that the files it names lie inside the
checkpoint, and that the architecture it describes has exactly the weights file's tensors, shapes and dtype. ``load_checkpoint(path, verify=False)`` (``gac
evaluate --no-verify``) skips the hash (about 1 s per 1.5 GB) for a file you trust; a truncated or unparsable file
is still an error. Files are created with mode 0666 minus the umask.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import sys
import types
from pathlib import Path

import torch
from torch import nn

from gac import __version__
from gac.compression.modules import build_module, get_module, module_spec, set_module
from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.hashing import digest, file_sha256
from gac.io import CHECKPOINT_FILE, missing_reason, read_json, write_json_atomic
from gac.machine import utc_stamp
from gac.untrusted import (
    NO_REMOTE_CODE,
    config_field_problem,
    differing_tied_copies,
    refuse_remote_code,
)

log = logging.getLogger(__name__)

FORMAT = "gac-checkpoint"
FORMAT_VERSION = 3  # 2: the config's own sha256 and the weights' sha256, required on load; 3: the tokenizer files' too
META_FILE = CHECKPOINT_FILE  # the checkpoint's config (gac.io names it for every reader of a model dir)
WEIGHTS_FILE = "gac_model.safetensors"
BUFFERS_FILE = "gac_buffers.safetensors"  # non-persistent buffers (rotary inv_freq): their dtype/values affect logits


def _nonpersistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    persistent = set(model.state_dict().keys())
    return {n: b.detach().contiguous() for n, b in model.named_buffers() if n not in persistent}


def cast_model(model: nn.Module, dtype) -> nn.Module:
    """``model.to(dtype)`` the way ``from_pretrained(dtype=...)`` builds a model: parameters and persistent buffers
    take ``dtype``; the non-persistent float32 buffers (the rotary ``inv_freq`` / ``original_inv_freq``, computed
    in float32 and never stored) stay float32. A plain ``.to(float16)`` rounds ``inv_freq`` to fp16, which moves
    every rotary angle and so the logits (measured on tiny: up to 0.008 in fp16, 0.07 in bf16)."""
    keep = {n: b for n, b in _nonpersistent_buffers(model).items() if b.dtype == torch.float32}
    model = model.to(dtype)
    for n, b in keep.items():
        parent, _, leaf = n.rpartition(".")
        mod = model.get_submodule(parent) if parent else model
        mod._buffers[leaf] = b.to(mod._buffers[leaf].device)
    return model


def is_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / META_FILE).is_file()


def projection_specs(model: nn.Module) -> dict[str, dict]:
    """The spec of every module of the decoder layers that holds a projection or an expert block (its layout's)."""
    from gac.compression.discovery import discover

    layout = discover(model)
    return {n: module_spec(get_module(model, n)) for n in layout.modules()}


def provenance() -> dict:
    """The checkpoint's ``provenance`` block (its own shape since format 1: ``git: {commit, dirty}``), from the one
    checkout lookup :func:`gac.provenance.checkout`."""
    import transformers

    from gac.provenance import checkout

    commit, dirty = checkout()
    return {
        "gac_version": __version__,
        "git": {"commit": commit, "dirty": dirty},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "created": utc_stamp(),
    }


_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", META_FILE, WEIGHTS_FILE, BUFFERS_FILE)
#: files a tokenizer loader reads from a directory (transformers' AutoTokenizer): a checkpoint hashes those it saved
_TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja",
                    "chat_template.json")


def is_tokenizer_file(name: str) -> bool:
    return name in _TOKENIZER_NAMES or name.startswith("vocab.") or name.endswith((".model", ".tiktoken"))


def _model_files(d: Path) -> list[str]:
    """Files in ``d`` that a model folder (gac or transformers) would own."""
    return sorted(p.name for p in d.iterdir() if p.name in _MODEL_FILES or p.name.startswith(("model-", "pytorch_model-")))


def _not_checkpoint_files(d: Path) -> list[str] | None:
    """What in ``d`` a checkpoint gac saved does not hold (sorted names, a directory with a trailing ``/``); None
    when ``d`` is no gac checkpoint at all (no readable gac_checkpoint.json of this format)."""
    try:
        meta = read_json(d / META_FILE, "gac checkpoint config", max_bytes=256 << 20)
    except GacError:
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    w = meta.get("weights") if isinstance(meta.get("weights"), dict) else {}
    own = {META_FILE, w.get("file"), w.get("buffers"), WEIGHTS_FILE, BUFFERS_FILE}
    toks = meta.get("tokenizer_files")
    listed = set(toks) if isinstance(toks, dict) else None
    other = []
    for f in sorted(d.iterdir(), key=lambda f: f.name):
        saved = f.name in own or (f.name in listed if listed is not None else is_tokenizer_file(f.name))
        if not (saved and f.is_file() and not f.is_symlink()):
            other.append(f.name + ("/" if f.is_dir() else ""))
    return other


def check_output_dir(path: str | os.PathLike, overwrite: bool = False, need_bytes: int = 0, inputs=(),
                     flag: str = "-o", replace_hint: str = "pass --force to replace the checkpoint there") -> Path:
    """Before compressing: ``path`` can become a checkpoint and its file system takes a file (and has ``need_bytes``
    free). It is absent, an empty directory, or (``overwrite``) a gac checkpoint holding only its own files; never
    one of ``inputs`` (the model being compressed) or a directory that holds one, never inside a model directory or
    a results store's own directories. ``replace_hint``: how this command replaces a checkpoint (run.py cannot).
    A one-line :class:`GacError` otherwise."""
    from gac.io import check_writable, directory_kind, missing_reason, owned_directory

    out = Path(path).expanduser()
    where = f"{flag} {str(path)!r}"
    if out.is_symlink() and not out.exists():
        raise GacError(f"{where} {missing_reason(out)}; remove it or choose another checkpoint path")
    if out.exists() and not out.is_dir():
        raise GacError(f"{where} exists and is not a directory; choose another checkpoint path")
    for i in inputs:
        src = Path(str(i)).expanduser()
        if not src.exists():
            continue
        if os.path.realpath(src) == os.path.realpath(out):
            raise GacError(f"{where} is the input model; write the checkpoint to another directory (the model being "
                           f"compressed is never replaced)")
        if out.is_dir() and Path(os.path.realpath(src)).is_relative_to(os.path.realpath(out)):
            raise GacError(f"{where} holds the input model {str(i)!r}; write the checkpoint to another directory")
    if out.is_dir() and any(out.iterdir()):
        other = _not_checkpoint_files(out)
        if other is None:
            names = sorted(f.name for f in out.iterdir())
            what = directory_kind(out) or f"a directory holding {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            if overwrite:
                raise GacError(f"{where} is {what}, not a gac checkpoint; refusing to overwrite it: only a checkpoint "
                               f"gac saved is ever replaced (--force), never another directory; choose another path")
            raise GacError(f"{where} exists and is {what}; refusing to overwrite it: choose another path")
        if other:
            raise GacError(f"{where} is a gac checkpoint that also holds {', '.join(other[:3])}"
                           f"{' ...' if len(other) > 3 else ''}, which replacing it would delete; move them out of it "
                           f"or choose another path")
        if not overwrite:
            raise GacError(f"{where} already holds a gac checkpoint; refusing to overwrite it ({replace_hint}, or "
                           f"choose another path)")
    owner = owned_directory(out, itself=False)
    if owner:
        raise GacError(f"{where} {owner}; write the checkpoint outside it")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    check_writable(parent, "checkpoint's parent directory")
    if need_bytes:
        free = shutil.disk_usage(parent).free
        if free < need_bytes:
            raise GacError(f"not enough space for the checkpoint in {str(parent)!r}: about {need_bytes / 2**20:,.0f} MiB "
                           f"needed, {free / 2**20:,.0f} MiB free; free space or choose another output directory")
    return out


def save_checkpoint(model: nn.Module, tokenizer, path: str | os.PathLike, recipe: dict | None = None, plan=None,
                    overwrite: bool = False, merge: bool = False,
                    replace_hint: str = "pass overwrite=True to replace it") -> Path:
    """Save a (compressed) model to ``path``. An existing non-empty directory is refused unless ``overwrite`` and it
    is a gac checkpoint holding only its own files (:func:`check_output_dir`), which is then replaced once the new
    one is complete; ``merge`` writes into a directory that holds other files but no model (a tokenizer saved
    first). ``replace_hint``: what the refusal says replaces a checkpoint (the caller's option)."""
    from safetensors.torch import save_model

    from gac.io import clean_temp_files, honour_umask, os_error, temp_path

    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise GacError(f"{str(out)!r} exists and is not a directory; choose another checkpoint path")
    replacing = False
    if out.is_dir() and any(out.iterdir()) and not (merge and not _model_files(out)):
        check_output_dir(out, overwrite=overwrite, flag="checkpoint directory", replace_hint=replace_hint)
        replacing = True
    recipe = recipe if recipe is not None else getattr(model, "_gac_recipe", None)
    plan = plan if plan is not None else getattr(model, "_gac_plan", None)
    specs = projection_specs(model)
    if out.parent.is_dir():
        clean_temp_files(out.parent)  # temp dirs of earlier saves that were killed
    tmp = temp_path(out)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise os_error(e, "create the checkpoint directory", tmp) from None
    try:
        try:
            save_model(model, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "gac_version": __version__})
        except Exception as e:  # safetensors reports a full disk as its own error type
            raise GacError(f"cannot write the checkpoint weights to {str(out)!r}: {str(e).splitlines()[0][:200]}; free "
                           f"space there or choose another output directory") from None
        honour_umask(tmp / WEIGHTS_FILE)
        weights_digest = file_sha256(tmp / WEIGHTS_FILE)
        buffers = _nonpersistent_buffers(model)
        buffers_digest = None
        if buffers:
            from safetensors.torch import save_file

            try:
                save_file({k: v.cpu() for k, v in buffers.items()}, str(tmp / BUFFERS_FILE))
            except Exception as e:  # noqa: BLE001
                raise GacError(f"cannot write the checkpoint buffers to {str(out)!r}: {str(e).splitlines()[0][:200]}; "
                               f"free space there or choose another output directory") from None
            honour_umask(tmp / BUFFERS_FILE)
            buffers_digest = file_sha256(tmp / BUFFERS_FILE)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
            for stray in ("config.json", "model.safetensors"):  # never leave a file transformers would load
                (tmp / stray).unlink(missing_ok=True)
        tokenizer_files = {f.name: file_sha256(f) for f in sorted(tmp.iterdir())
                           if f.name not in (WEIGHTS_FILE, BUFFERS_FILE, META_FILE)}
        if merge and not replacing and out.is_dir():  # a tokenizer saved there first is the checkpoint's too
            tokenizer_files.update({f.name: file_sha256(f) for f in sorted(out.iterdir())
                                    if is_tokenizer_file(f.name) and f.is_file() and f.name not in tokenizer_files})
        dtype = dtype_str(next(model.parameters()).dtype)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "gac_version": __version__,
            "model_class": type(model).__name__,
            "dtype": dtype,
            "base_config": model.config.to_dict(),
            "modules": specs,
            "base_model": getattr(model, "_gac_base_model", None),  # tiny, a hub id or a directory (None: unknown)
            "recipe": recipe,
            "plan": plan.to_json() if hasattr(plan, "to_json") else plan,
            "weights": {"file": WEIGHTS_FILE, "sha256": weights_digest, "buffers": BUFFERS_FILE if buffers else None,
                        "buffers_sha256": buffers_digest},
            "tokenizer_files": tokenizer_files,  # name -> sha256: a swapped tokenizer scores another text
            "provenance": provenance(),
        }
        meta["meta_sha256"] = meta_sha256(meta)  # an edited gac_checkpoint.json is refused on load (verify)
        write_json_atomic(tmp / META_FILE, meta)
        if replacing:  # the old checkpoint goes only once the new one is complete
            trash = temp_path(out.with_name(out.name + "-replaced"))
            os.rename(out, trash)
            tmp.rename(out)
            shutil.rmtree(trash, ignore_errors=True)
        elif out.is_dir() and any(out.iterdir()):  # merge: move the files in, the config (what marks it) last
            for f in sorted(tmp.iterdir(), key=lambda f: f.name == META_FILE):
                os.replace(f, out / f.name)
            tmp.rmdir()
        else:
            if out.exists():
                out.rmdir()
            tmp.rename(out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise os_error(e, "write the checkpoint", out) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("saved gac checkpoint to %s", out)
    return out


def read_meta(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_dir():
        raise GacError(f"checkpoint {str(p)!r} is not a directory")
    meta = read_json(p / META_FILE, "gac checkpoint config", max_bytes=256 << 20)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise GacError(f"{str(p / META_FILE)!r} is not a gac checkpoint config (format != {FORMAT!r})")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise GacError(f"{str(p / META_FILE)!r} has format_version {version!r}, not an integer; {_COPY}")
    if version > FORMAT_VERSION:
        raise GacError(f"checkpoint format {version} is newer than this gac understands ({FORMAT_VERSION}); upgrade gac")
    return meta


_COPY = "copy the checkpoint again from its source"
DTYPES = ("float32", "float16", "bfloat16")


def meta_sha256(meta: dict) -> str:
    """The sha256 of a checkpoint config without its own ``meta_sha256`` (canonical JSON)."""
    import json

    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return digest(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False), None)


def _inside(p: Path, name, what: str) -> Path:
    """``p / name`` for a file the checkpoint config names: a plain name inside the checkpoint directory (no path,
    no link out of it), or a :class:`GacError`."""
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise GacError(f"checkpoint {str(p)!r}: its {what} is {name!r}, not a file name inside the checkpoint "
                       f"directory; {_COPY}")
    f = p / name
    if f.is_symlink():
        try:
            real = f.resolve(strict=True)
        except (OSError, RuntimeError):
            raise GacError(f"checkpoint {str(p)!r}: its {what} {name!r} {missing_reason(f)}; {_COPY}") from None
        if real.parent != p.resolve():
            raise GacError(f"checkpoint {str(p)!r}: its {what} {name!r} is a link to {str(real)!r}, outside the "
                           f"checkpoint; gac reads weights only from inside a checkpoint: {_COPY}")
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
    return None


def check_checkpoint(path: str | os.PathLike, verify: bool = True, meta: dict | None = None) -> dict:
    """Everything about a checkpoint that can be checked without loading its weights, before any work: its config
    has the fields and types gac writes, names files inside the checkpoint, describes an architecture whose every
    tensor the weights file holds with the same shape and dtype, its tokenizer files parse, and (``verify``) its
    config and files match the sha256 recorded when it was saved. Returns the config; a one-line :class:`GacError`
    naming the difference and the fix otherwise."""
    from safetensors import safe_open

    p = Path(path).expanduser()
    meta = meta or read_meta(p)
    where = f"checkpoint {str(p)!r}"
    problem = meta_problem(meta)
    if problem:
        raise GacError(f"{where}: {META_FILE}: {problem}; {_COPY}")
    w = meta["weights"]
    wfile = _inside(p, w["file"], "weights file")
    if not wfile.is_file():
        why = "is a directory" if wfile.is_dir() else missing_reason(wfile)
        raise GacError(f"{where}: its weights file {w['file']!r} {why}; copy the whole checkpoint directory")
    if w.get("buffers") is not None:
        _inside(p, w["buffers"], "buffers file")
    for tok in ("tokenizer.json", "tokenizer_config.json"):
        if (p / tok).exists():
            try:
                read_json(p / tok, "tokenizer file", max_bytes=1 << 30)
            except GacError as e:
                raise GacError(f"{where}: {e}; {_COPY}") from None
    try:
        skeleton = build_skeleton(meta, meta_device=True)
    except GacError as e:
        raise GacError(f"{where}: {META_FILE} describes no model gac can rebuild ({e}); {_COPY}") from None
    expected = {k: (tuple(t.shape), dtype_str(t.dtype)) for k, t in skeleton.state_dict().items()}
    stored: dict = {}
    try:
        with safe_open(str(wfile), framework="pt") as h:
            names = h.keys()  # a safe_open handle is not iterable
            for k in names:
                sl = h.get_slice(k)
                stored[k] = (tuple(sl.get_shape()), _SAFETENSORS_DTYPES.get(str(sl.get_dtype()), str(sl.get_dtype())))
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: a truncated or foreign file
        raise _safetensors_error(p, wfile, e) from None
    shared: dict[int, list[str]] = {}
    for n, t in skeleton.named_parameters(remove_duplicate=False):
        shared.setdefault(id(t), []).append(n)
    alias = {n: names for names in shared.values() if len(names) > 1 for n in names}
    groups = [names for names in shared.values() if len(names) > 1 and sum(n in stored for n in names) > 1]
    pair = differing_tied_copies([wfile], groups) if groups else None
    if pair:
        kept, other = sorted(pair, key=lambda n: "lm_head" in n)
        raise GacError(f"{where}: {w['file']} holds {other!r}, a tensor the config has no place for: the config ties "
                       f"it to {kept!r} (tie_word_embeddings), and the stored values differ; {_COPY}")
    missing = [k for k in expected if k not in stored and not any(o in stored for o in alias.get(k, ()))]
    extra = [k for k in stored if k not in expected]
    differ = [k for k in expected if k in stored and stored[k] != expected[k]]
    if missing or extra or differ:
        parts = []
        if differ:
            k = differ[0]
            parts.append(f"{len(differ)} tensor(s) differ, e.g. {k!r}: {list(stored[k][0])} {stored[k][1]} in "
                         f"{w['file']}, {list(expected[k][0])} {expected[k][1]} from {META_FILE}")
        if missing:
            parts.append(f"{len(missing)} missing from {w['file']}, e.g. {missing[0]!r}")
        if extra:
            parts.append(f"{len(extra)} in {w['file']} the config has no place for, e.g. {extra[0]!r}")
        raise GacError(f"{where}: {META_FILE} does not match its weights ({'; '.join(parts)}): the config was edited "
                       f"or the weights come from another checkpoint; {_COPY}")
    if verify:
        check_hashes_present(p, meta)
        if meta["meta_sha256"] != meta_sha256(meta):
            raise GacError(f"{where}: {META_FILE} was changed after the checkpoint was saved (its sha256 differs); "
                           f"{_COPY}, or load with verify=False (gac evaluate --no-verify) if you edited it on purpose")
        verify_checkpoint(p, meta)
    return meta


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
                       "I32": "int32", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def build_skeleton(meta: dict, dtype=None, device="cpu", meta_device: bool = False) -> nn.Module:
    """The compressed architecture described by ``meta`` (weights not loaded). ``meta_device``: shapes only."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    problem = meta_problem(meta)
    if problem:
        raise GacError(problem)
    base = dict(meta["base_config"])
    model_type = base.pop("model_type", None)
    try:
        config = AutoConfig.for_model(model_type, **base)
    except (ValueError, KeyError, TypeError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GacError(f"cannot rebuild the base config (model_type {model_type!r}): "
                       f"{why if len(why) < 200 else why[:197] + '...'}") from None
    dt = _dtype(dtype or meta.get("dtype", "float32"))
    dev = torch.device("meta") if meta_device else torch.device(device)
    try:
        with dev, no_init_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=dt)
    except Exception as e:  # noqa: BLE001 - an architecture transformers cannot build from this config
        raise GacError(f"transformers cannot build a {model_type} causal LM from its base_config "
                       f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})") from None
    model.tie_weights()  # no_init_weights skips tying; tied tensors are stored once in the weights file
    swapped = False
    for name, spec in meta["modules"].items():
        try:
            cur = get_module(model, name)
        except (GacError, AttributeError):
            raise GacError(f"it names the module {name!r}, which a {model_type} model with this base_config does not "
                           f"have") from None
        if module_spec(cur) != spec:
            try:
                set_module(model, name, build_module(spec, dtype=dt, device=dev))
                swapped = True
            except GacError as e:
                raise GacError(f"module {name!r}: {e}") from None
            except (KeyError, TypeError, ValueError) as e:
                raise GacError(f"module {name!r} has an unusable spec {spec} ({type(e).__name__}: {e})") from None
    if swapped:
        guard_save_pretrained(model)
    return model


def _dtype(d):
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
                       f"format {FORMAT_VERSION} has (it was edited or damaged); {_COPY}, or load with verify=False "
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
        f = _inside(p, file, "weights file")
        if not f.is_file():
            raise GacError(f"checkpoint {str(p)!r}: its file {file!r} {missing_reason(f)}; copy the whole checkpoint "
                           f"directory")
        _check_sha256(p, f, file, recorded)
    toks = meta.get("tokenizer_files") if isinstance(meta.get("tokenizer_files"), dict) else {}
    for file, recorded in toks.items():
        f = _inside(p, file, "tokenizer file")
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


def _safetensors_error(p: Path, file: Path, e: Exception) -> GacError:
    return GacError(f"checkpoint {str(p)!r}: {file.name} is truncated or not a safetensors file "
                    f"({str(e).splitlines()[0][:200]}); copy the checkpoint again from its source")


def load_checkpoint(path: str | os.PathLike, dtype=None, device="cpu", verify: bool = True):
    """Reload a gac checkpoint: ``(model, tokenizer)`` (tokenizer None when none was saved). Logits are identical to
    the saved model's (same dtype). ``dtype`` casts after loading (:func:`cast_model`: the rotary
    ``inv_freq`` keeps its float32). ``verify`` checks the recorded sha256 of the
    weights first (``verify=False`` skips it for a file you trust)."""
    from safetensors.torch import load_model

    p = Path(path)
    meta = check_checkpoint(p, verify=verify)  # config, files, shapes and checksums, before anything is built
    wfile = p / meta["weights"]["file"]
    model = build_skeleton(meta, dtype=None, device=device)
    try:
        missing, unexpected = load_model(model, str(wfile), strict=True, device=str(device))
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise GacError(f"checkpoint {str(p)!r}: weights do not match the recorded structure ({first}); {_COPY}") from None
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: a truncated or foreign file
        raise _safetensors_error(p, wfile, e) from None
    if missing or unexpected:  # strict=True raises first; kept as a belt-and-braces guard
        raise GacError(f"checkpoint {str(p)!r}: missing {missing[:5]} unexpected {unexpected[:5]}")
    bfile = meta["weights"].get("buffers")
    if bfile:
        from safetensors.torch import load_file

        own = dict(model.named_buffers())
        try:
            saved_buffers = load_file(str(p / bfile), device=str(device))
        except Exception as e:  # noqa: BLE001
            raise _safetensors_error(p, p / bfile, e) from None
        for n, t in saved_buffers.items():
            if n not in own:
                raise GacError(f"checkpoint {str(p)!r}: saved buffer {n!r} has no place in the rebuilt model")
            parent, _, leaf = n.rpartition(".")
            mod = model.get_submodule(parent) if parent else model
            mod._buffers[leaf] = t  # same values and dtype as when saved
    if dtype is not None:
        model = cast_model(model, _dtype(dtype))  # rotary inv_freq stays as saved (float32), as from_pretrained keeps it
    model.eval()
    model._gac_recipe = meta.get("recipe")
    model._gac_base_model = meta.get("base_model")
    model._gac_plan = meta.get("plan")
    guard_save_pretrained(model)
    tokenizer = None
    if (p / "tokenizer_config.json").is_file() or (p / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        try:
            refuse_remote_code(p)
            tokenizer = AutoTokenizer.from_pretrained(str(p), **NO_REMOTE_CODE)
        except Exception as e:  # noqa: BLE001 - tokenizers raise many kinds for a damaged file
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise GacError(f"checkpoint {str(p)!r}: its tokenizer cannot be loaded ({why}); {_COPY}") from None
    return model, tokenizer


# ----------------------------------------------------------------------------------------- the save_pretrained trap


def hf_loadable(model: nn.Module) -> bool:
    """Would ``from_pretrained`` on a folder written by ``save_pretrained`` rebuild this model's every weight?

    True when the model's parameters (names and shapes) are exactly those of its architecture built from its own
    config; false for a model with low-rank or pruned layers, whose weights transformers would random-initialise."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            ref = AutoModelForCausalLM.from_config(model.config)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot rebuild is not loadable either
        return False
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return shapes == {k: tuple(v.shape) for k, v in ref.state_dict().items()}


def save_pretrained(self, save_directory, *args, **kwargs):
    """``save_pretrained`` of a model gac has compressed (installed by :func:`guard_save_pretrained`).

    A model whose parameters still match its architecture is saved by transformers as usual. Otherwise a standard
    folder would load with random weights, so this writes a **gac checkpoint** instead (load it with
    ``gac.models.load_model(path)``; ``from_pretrained`` on it fails loudly), or refuses what cannot be redirected
    (``push_to_hub=True``, a custom ``state_dict``)."""
    if hf_loadable(self):
        return type(self).save_pretrained(self, save_directory, *args, **kwargs)
    fix = ("save it with gac.compression.checkpoint.save_checkpoint(model, tokenizer, path) and load it with "
           "gac.models.load_model(path)")
    if kwargs.get("push_to_hub"):
        raise GacError(f"this model has gac-compressed layers: save_pretrained(push_to_hub=True) would upload a "
                       f"folder that from_pretrained loads with random weights; {fix} (then upload that folder)")
    if kwargs.get("state_dict") is not None or args:
        raise GacError(f"this model has gac-compressed layers: save_pretrained with a custom state_dict or "
                       f"positional options cannot be redirected to a gac checkpoint; {fix}")
    out = save_checkpoint(self, None, save_directory, merge=True,
                          replace_hint="save_pretrained never replaces one: move it aside")
    log.warning(
        "model.save_pretrained(%r) wrote a gac checkpoint: this model has gac-compressed layers, which a standard "
        "transformers folder would reload with random weights. Load it with gac.models.load_model(%r) (or "
        "gac.compression.checkpoint.load_checkpoint); transformers' from_pretrained refuses it.", str(out), str(out))
    return None


def guard_save_pretrained(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` safe once gac has changed the model's layers (see :func:`save_pretrained`)."""
    if hasattr(type(model), "save_pretrained") and hasattr(model, "config") and \
            getattr(model.__dict__.get("save_pretrained"), "__func__", None) is not save_pretrained:
        model.save_pretrained = types.MethodType(save_pretrained, model)


def replace_module(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Swap the module at dotted path ``name`` for ``new``; return the old one. Every compressor swaps through here,
    so a model gac changed saves a gac checkpoint, never a folder transformers reloads with random weights."""
    old = set_module(model, name, new)
    guard_save_pretrained(model)
    return old
