"""The checks of a local Hugging Face model directory before any work, without loading its weights
(:func:`check_hf_dir`: its config loads, its safetensors weights are exactly the tensors the config's architecture
has, with the config's shapes and dtype, tied weights stored once or alike, a tokenizer whose ids the embedding
holds, a usable generation config), and of a loaded model's weights (:func:`check_finite_weights`: no NaN or inf).
:func:`gac.models.check_model_files` picks the check of a model spec's kind.
"""

from __future__ import annotations

from pathlib import Path

from gac.dtypes import dtype_str
from gac.errors import GacError
from gac.transformers_lock import transformers_lock
from gac.untrusted import (
    COPY_MODEL_AGAIN,
    NO_REMOTE_CODE,
    differing_tied_copies,
    hf_config,
    raw_config,
    refuse_pickled_weights,
    require_regular,
    short_error,
)

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
                                       f"would take either copy. {COPY_MODEL_AGAIN[0].upper()}{COPY_MODEL_AGAIN[1:]}")
                    out[k], where[k] = (tuple(sl.get_shape()), str(sl.get_dtype())), f.name
        except GacError:
            raise
        except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: a truncated or foreign file
            raise GacError(f"{str(f)!r} is truncated or not a safetensors file ({short_error(e)}); {COPY_MODEL_AGAIN}") from None
    for k, shard in (weight_map or {}).items():
        if where.get(k) != shard:
            held = f"is in {where[k]!r}" if k in where else "is in no shard"
            raise GacError(f"model.safetensors.index.json maps tensor {k!r} to {shard!r}, but it {held}; "
                           f"{COPY_MODEL_AGAIN}")
    return out


def _weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a local model directory, and the index's ``{tensor: shard}`` when it is sharded
    (a directory without safetensors weights is refused: :func:`gac.untrusted.refuse_pickled_weights`)."""
    refuse_pickled_weights(path)
    single = path / "model.safetensors"
    if single.exists() or single.is_symlink():
        require_regular(single, COPY_MODEL_AGAIN)
        return [single], None
    index = path / "model.safetensors.index.json"
    from gac.io import read_json

    doc = read_json(index, "safetensors index", max_bytes=16 << 20)
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise GacError(f"{str(index)!r} has no weight_map of file names; {COPY_MODEL_AGAIN}")
    for name in sorted(set(wm.values())):
        if not name or Path(name).name != name or name in (".", ".."):
            raise GacError(f"{str(index)!r} names the shard {name!r}, which is not a file name inside the model "
                           f"directory (gac reads no weights from elsewhere); {COPY_MODEL_AGAIN}")
        f = path / name
        if not (f.exists() or f.is_symlink()):
            raise GacError(f"{str(index)!r} names {name!r}, which is not a file in the model directory; {COPY_MODEL_AGAIN}")
        require_regular(f, COPY_MODEL_AGAIN)
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
                       f"{COPY_MODEL_AGAIN}") from None


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


def _mergeable(conversion) -> bool:
    """A conversion :func:`_converted` can follow on shapes alone: a rename, or per-expert tensors stacked into one
    (``MergeModulelist(dim=0)``), the stacks then concatenated (``Concatenate``): the experts of Mixtral, Qwen-MoE,
    OLMoE and DeepSeek."""
    kind = type(conversion).__name__
    if kind == "WeightRenaming":
        return True
    ops = [type(o).__name__ for o in getattr(conversion, "operations", ())]
    return (kind == "WeightConverter" and ops in (["MergeModulelist"], ["MergeModulelist", "Concatenate"])
            and getattr(conversion.operations[0], "dim", None) == 0)


def _converted(path: Path, header: dict, conversions) -> dict:
    """``header`` (``{name: (shape, dtype)}``) as transformers converts it on load: names renamed, each group of
    per-expert tensors stacked (and concatenated) into the one tensor the architecture has, its shape computed from
    the parts. An expert missing from the stack, or parts of unequal shapes, is refused here: transformers would
    fail after reading every weight, with a report it prints elsewhere."""
    import re

    renames = [c for c in conversions if type(c).__name__ == "WeightRenaming"]
    converters = [c for c in conversions if type(c).__name__ == "WeightConverter"]
    out: dict = {}
    parts: dict[str, dict[str, list]] = {}  # target -> source pattern -> [(expert, name, shape, dtype)]
    for k, v in header.items():
        name = _renamed(k, renames)
        for conv in converters:
            target, pattern = conv.rename_source_key(name)
            if pattern is None:
                continue
            m = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), name)
            parts.setdefault(target, {}).setdefault(pattern, []).append(
                (int(m.group(1)) if m and m.groups() else 0, k, v[0], v[1]))
            break
        else:
            out[name] = v
    for target, by_pattern in parts.items():
        conv = next(c for c in converters if set(by_pattern) <= set(c.source_patterns))
        stacks = []
        for pattern in conv.source_patterns:
            items = sorted(by_pattern.get(pattern, ()))
            if not items:
                raise GacError(f"{str(path)!r}: its weights have no tensor {pattern.replace('*', 'N')!r} for "
                               f"{target!r} (transformers stacks those of every expert into it); {COPY_MODEL_AGAIN}")
            held = [e for e, *_ in items]
            gap = next((e for e in range(max(held) + 1) if e not in held), None)
            if gap is not None or len(set(held)) != len(held):
                what = f"expert {gap} is missing" if gap is not None else "an expert is stored twice"
                raise GacError(f"{str(path)!r}: its weights hold {len(set(held))} experts' {pattern.replace('*', 'N')!r} "
                               f"for {target!r}, but {what}; {COPY_MODEL_AGAIN}")
            shapes = {tuple(sh) for _, _, sh, _ in items}
            if len(shapes) > 1:
                raise GacError(f"{str(path)!r}: the experts' {pattern.replace('*', 'N')!r} for {target!r} have "
                               f"different shapes ({', '.join(str(list(x)) for x in sorted(shapes))}); "
                               f"{COPY_MODEL_AGAIN}")
            stacks.append(((len(items), *shapes.pop()), items[0][3]))
        shape = list(stacks[0][0])
        if len(stacks) > 1:
            dim = conv.operations[1].dim
            if any(len(st) != len(shape) or any(a != b for i, (a, b) in enumerate(zip(st, shape)) if i != dim)
                   for st, _ in stacks[1:]):
                raise GacError(f"{str(path)!r}: the tensors transformers joins into {target!r} have shapes that do "
                               f"not join ({', '.join(str(list(st)) for st, _ in stacks)}); {COPY_MODEL_AGAIN}")
            shape[dim] = sum(st[dim] for st, _ in stacks)
        out[target] = (tuple(shape), stacks[0][1])
    return out


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
                       f"config.json; else remove {other!r} ({COPY_MODEL_AGAIN})")


@transformers_lock()
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
    # embed_out. -> lm_head. is keyed by GPTNeoXForCausalLM): renames and expert stacks are applied to the file's
    # names and shapes here; another conversion (one that splits tensors) is checked after loading instead
    conversions = (get_checkpoint_conversion_mapping(type(skeleton).__name__)
                   or get_checkpoint_conversion_mapping(getattr(config, "model_type", None)) or [])
    if not all(_mergeable(c) for c in conversions):
        return config  # a conversion that is no rename or expert stack is checked after loading instead
    header = _converted(path, header, conversions)
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

