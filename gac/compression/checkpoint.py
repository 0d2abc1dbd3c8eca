"""Saving a compressed model as a gac checkpoint (:func:`save_checkpoint`, into a directory
:func:`check_output_dir` allows), and keeping ``save_pretrained`` safe on a model gac changed: the layer swap every
compressor uses (:func:`gac.compression.swap.replace_module`) installs the guard. The format is
:mod:`.checkpoint_format`; loading is :mod:`.checkpoint_load` (reloads to identical logits).

Why not ``save_pretrained``: transformers rebuilds the *original* architecture and silently random-initialises
any weight whose name or shape it does not recognise (a low-rank ``q_proj.down.weight`` or a pruned ``gate_proj``).
A gac checkpoint therefore has no ``config.json`` and no ``model.safetensors``:
``AutoModelForCausalLM.from_pretrained`` on it fails with an error instead of loading a silently broken model.
:func:`~gac.compression.checkpoint_load.load_checkpoint` rebuilds the
compressed structure from the recorded specs *before* reading weights and loads with ``strict`` key matching, so
every parameter comes from the file (a missing or unexpected tensor is an error). A model gac compressed (in
memory, or loaded from a checkpoint) has a guarded ``save_pretrained``: it writes a gac checkpoint instead of a
folder transformers would load with random weights (:func:`save_pretrained`).
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import types
from pathlib import Path

import torch
from torch import nn

from gac import __version__
from gac.compression.checkpoint_format import (
    BUFFERS_FILE,
    FORMAT,
    FORMAT_VERSION,
    META_FILE,
    WEIGHTS_FILE,
    is_tokenizer_file,
    meta_sha256,
)
from gac.compression.latent_cache import has_latent_cache
from gac.compression.modules import get_module, module_spec
from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.hashing import file_sha256
from gac.io import missing_reason, read_json, write_json_atomic
from gac.transformers_lock import transformers_lock

log = logging.getLogger(__name__)


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
    """The checkpoint's ``provenance`` block: the one provenance of gac's results (:func:`gac.provenance.provenance`,
    the shape records and bench files have), with the platform beside it."""
    from gac.provenance import provenance as result_provenance

    return {**result_provenance(), "platform": platform.platform()}


_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", META_FILE, WEIGHTS_FILE, BUFFERS_FILE)


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
                     flag: str = "-o", replace_hint: str = "pass --force to replace the checkpoint there",
                     kind: str = "gac checkpoint", replaced: str = "a checkpoint gac saved", stray=None) -> Path:
    """Before writing a model directory (a checkpoint; ``gac export --format hf`` the same with its own ``kind``):
    ``path`` can become one and its file system takes a file (and has ``need_bytes`` free). It is absent, an empty
    directory, or (``overwrite``) a ``kind`` holding only its own files; never a link, never one of ``inputs`` (the
    model being compressed or exported) or a directory that holds one, never inside a model directory or a results
    store's own directories. ``stray(dir)``: the files of ``dir`` that are not the ``kind``'s own, or None when it
    is no ``kind`` at all (default: a gac checkpoint's); ``replaced``: what ``--force`` replaces, for the message;
    ``replace_hint``: how this command replaces one (run.py cannot). A one-line :class:`GacError` otherwise."""
    from gac.io import check_not_dash, check_writable
    from gac.layout import directory_kind, owned_directory

    noun = kind.removeprefix("gac ")
    check_not_dash(path, flag, f"{'an' if noun[0] in 'aeiou' else 'a'} {noun} directory")
    stray = _not_checkpoint_files if stray is None else stray
    out = Path(path).expanduser()
    where = f"{flag} {str(path)!r}"
    if out.is_symlink() and not out.exists():
        raise GacError(f"{where} {missing_reason(out)}; remove it or choose another path")
    if out.is_symlink():  # the write replaces or renames the directory: the link, not where it points
        raise GacError(f"{where} is a link; give the directory itself or another path")
    if out.exists() and not out.is_dir():
        raise GacError(f"{where} exists and is not a directory; choose another path")
    for i in inputs:
        src = Path(str(i)).expanduser()
        if not src.exists():
            continue
        if os.path.realpath(src) == os.path.realpath(out):
            raise GacError(f"{where} is the input model; write the {noun} to another directory (the model it is "
                           f"made from is never replaced)")
        if out.is_dir() and Path(os.path.realpath(src)).is_relative_to(os.path.realpath(out)):
            raise GacError(f"{where} holds the input model {str(i)!r}; write the {noun} to another directory")
    if out.is_dir() and any(out.iterdir()):
        other = stray(out)
        if other is None:
            names = sorted(f.name for f in out.iterdir())
            what = directory_kind(out) or f"a directory holding {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            if overwrite:
                raise GacError(f"{where} is {what}, not a {kind}; refusing to overwrite it: only {replaced} is ever "
                               f"replaced (--force), never another directory; choose another path")
            raise GacError(f"{where} exists and is {what}; refusing to overwrite it: choose another path")
        if other:
            raise GacError(f"{where} is a {kind} that also holds {', '.join(other[:3])}"
                           f"{' ...' if len(other) > 3 else ''}, which replacing it would delete; move them out of it "
                           f"or choose another path")
        if not overwrite:
            raise GacError(f"{where} already holds a {kind}; refusing to overwrite it ({replace_hint}, or "
                           f"choose another path)")
    owner = owned_directory(out, itself=False)
    if owner:
        raise GacError(f"{where} {owner}; write the {noun} outside it")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    check_writable(parent, f"{noun}'s parent directory")
    if need_bytes:
        free = shutil.disk_usage(parent).free
        if free < need_bytes:
            raise GacError(f"not enough space for the {noun} in {str(parent)!r}: about "
                           f"{need_bytes / 2**20:,.0f} MiB needed, {free / 2**20:,.0f} MiB free; free space or choose "
                           f"another output directory")
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
        clean_temp_files(out.parent, output=out.name)  # temp dirs of earlier saves of this checkpoint that were killed
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
            "kv_cache": "latent" if has_latent_cache(model) else "full",
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


# ----------------------------------------------------------------------------------------- the save_pretrained trap


@transformers_lock()
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
    fix = ("save it with gac.compression.save_checkpoint(model, tokenizer, path) and load it with "
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
        "gac.compression.load_checkpoint); transformers' from_pretrained refuses it.", str(out), str(out))
    return None


def guard_save_pretrained(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` safe once gac has changed the model's layers (see :func:`save_pretrained`)."""
    if hasattr(type(model), "save_pretrained") and hasattr(model, "config") and \
            getattr(model.__dict__.get("save_pretrained"), "__func__", None) is not save_pretrained:
        model.save_pretrained = types.MethodType(save_pretrained, model)
