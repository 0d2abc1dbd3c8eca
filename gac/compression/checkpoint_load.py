"""Loading a gac checkpoint: every check that needs no weights first (:func:`check_checkpoint`: the config, the
files, an architecture whose tensors are exactly the weights file's, the hashes), then the compressed structure
rebuilt from the recorded specs (:func:`build_skeleton`) and the weights loaded with strict key matching
(:func:`load_checkpoint`), so every parameter comes from the file."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from gac.compression.checkpoint import cast_model, guard_save_pretrained
from gac.compression.checkpoint_format import (
    COPY_CHECKPOINT_AGAIN,
    META_FILE,
    SAFETENSORS_DTYPES,
    base_config,
    check_hashes_present,
    file_inside,
    meta_problem,
    meta_sha256,
    read_meta,
    safetensors_error,
    torch_dtype,
    verify_checkpoint,
)
from gac.compression.modules import build_module, get_module, is_fused_experts, module_spec, set_module
from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.io import missing_reason, read_json
from gac.transformers_lock import transformers_lock
from gac.untrusted import NO_REMOTE_CODE, differing_tied_copies, refuse_remote_code


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
        raise GacError(f"{where}: {META_FILE}: {problem}; {COPY_CHECKPOINT_AGAIN}")
    w = meta["weights"]
    wfile = file_inside(p, w["file"], "weights file")
    if not wfile.is_file():
        why = "is a directory" if wfile.is_dir() else missing_reason(wfile)
        raise GacError(f"{where}: its weights file {w['file']!r} {why}; copy the whole checkpoint directory")
    if w.get("buffers") is not None:
        file_inside(p, w["buffers"], "buffers file")
    for tok in ("tokenizer.json", "tokenizer_config.json"):
        if (p / tok).exists():
            try:
                read_json(p / tok, "tokenizer file", max_bytes=1 << 30)
            except GacError as e:
                raise GacError(f"{where}: {e}; {COPY_CHECKPOINT_AGAIN}") from None
    try:
        skeleton = build_skeleton(meta, meta_device=True)
    except GacError as e:
        raise GacError(f"{where}: {META_FILE} describes no model gac can rebuild ({e}); {COPY_CHECKPOINT_AGAIN}") from None
    expected = {k: (tuple(t.shape), dtype_str(t.dtype)) for k, t in skeleton.state_dict().items()}
    stored: dict = {}
    try:
        with safe_open(str(wfile), framework="pt") as h:
            names = h.keys()  # a safe_open handle is not iterable
            for k in names:
                sl = h.get_slice(k)
                stored[k] = (tuple(sl.get_shape()), SAFETENSORS_DTYPES.get(str(sl.get_dtype()), str(sl.get_dtype())))
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: a truncated or foreign file
        raise safetensors_error(p, wfile, e) from None
    shared: dict[int, list[str]] = {}
    for n, t in skeleton.named_parameters(remove_duplicate=False):
        shared.setdefault(id(t), []).append(n)
    alias = {n: names for names in shared.values() if len(names) > 1 for n in names}
    groups = [names for names in shared.values() if len(names) > 1 and sum(n in stored for n in names) > 1]
    pair = differing_tied_copies([wfile], groups) if groups else None
    if pair:
        kept, other = sorted(pair, key=lambda n: "lm_head" in n)
        raise GacError(f"{where}: {w['file']} holds {other!r}, a tensor the config has no place for: the config ties "
                       f"it to {kept!r} (tie_word_embeddings), and the stored values differ; {COPY_CHECKPOINT_AGAIN}")
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
                       f"or the weights come from another checkpoint; {COPY_CHECKPOINT_AGAIN}")
    if verify:
        check_hashes_present(p, meta)
        if meta["meta_sha256"] != meta_sha256(meta):
            raise GacError(f"{where}: {META_FILE} was changed after the checkpoint was saved (its sha256 differs); "
                           f"{COPY_CHECKPOINT_AGAIN}, or load with verify=False (gac evaluate --no-verify) if you edited it on purpose")
        verify_checkpoint(p, meta)
    return meta


@transformers_lock()
def build_skeleton(meta: dict, dtype=None, device="cpu", meta_device: bool = False) -> nn.Module:
    """The compressed architecture described by ``meta`` (weights not loaded). ``meta_device``: shapes only."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = base_config(meta)  # the fields and values checked first (meta_problem)
    model_type = config.model_type
    dt = torch_dtype(dtype or meta.get("dtype", "float32"))
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
            routed = int(cur.gate_up_proj.shape[0]) if is_fused_experts(cur) else None
            if spec.get("type") == "experts" and routed is not None and len(spec.get("widths") or ()) != routed:
                raise GacError(f"module {name!r} holds {len(spec.get('widths') or ())} experts, but the model's router "
                               f"picks among {routed} (its base_config): the tokens routed to the others would get no "
                               f"MLP output")
            try:
                set_module(model, name, build_module(spec, dtype=dt, device=dev, like=cur))
                swapped = True
            except GacError as e:
                raise GacError(f"module {name!r}: {e}") from None
            except (KeyError, TypeError, ValueError) as e:
                raise GacError(f"module {name!r} has an unusable spec {spec} ({type(e).__name__}: {e})") from None
    if swapped:
        guard_save_pretrained(model)
    return model


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
        raise GacError(f"checkpoint {str(p)!r}: weights do not match the recorded structure ({first}); {COPY_CHECKPOINT_AGAIN}") from None
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: a truncated or foreign file
        raise safetensors_error(p, wfile, e) from None
    if missing or unexpected:  # strict=True raises first; kept as a belt-and-braces guard
        raise GacError(f"checkpoint {str(p)!r}: missing {missing[:5]} unexpected {unexpected[:5]}")
    bfile = meta["weights"].get("buffers")
    if bfile:
        from safetensors.torch import load_file

        own = dict(model.named_buffers())
        try:
            saved_buffers = load_file(str(p / bfile), device=str(device))
        except Exception as e:  # noqa: BLE001
            raise safetensors_error(p, p / bfile, e) from None
        for n, t in saved_buffers.items():
            if n not in own:
                raise GacError(f"checkpoint {str(p)!r}: saved buffer {n!r} has no place in the rebuilt model")
            parent, _, leaf = n.rpartition(".")
            mod = model.get_submodule(parent) if parent else model
            mod._buffers[leaf] = t  # same values and dtype as when saved
    if dtype is not None:
        model = cast_model(model, torch_dtype(dtype))  # rotary inv_freq stays as saved (float32), as from_pretrained keeps it
    if meta.get("kv_cache") == "latent":  # PaLU's latent KV cache, as the model was saved
        from gac.compression.latent_cache import install

        try:
            install(model)
        except GacError as e:
            raise GacError(f"checkpoint {str(p)!r}: {e}") from None
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
            with transformers_lock():
                tokenizer = AutoTokenizer.from_pretrained(str(p), **NO_REMOTE_CODE)
        except Exception as e:  # noqa: BLE001 - tokenizers raise many kinds for a damaged file
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise GacError(f"checkpoint {str(p)!r}: its tokenizer cannot be loaded ({why}); {COPY_CHECKPOINT_AGAIN}") from None
    return model, tokenizer
