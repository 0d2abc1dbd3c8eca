"""Model directories are data: gac reads their configs, tokenizers and weights, and never runs code from them.

transformers runs Python shipped with a model when its config names it (``auto_map``) and the caller trusts it;
every gac loader passes :data:`NO_REMOTE_CODE`, and :func:`refuse_remote_code` refuses such a directory in one line
before anything is loaded (no prompt, no import of the shipped file). It first checks that every file a loader
reads there (configs, tokenizer files, weights) is a regular file of a size such a file has (:func:`check_model_dir_files`):
a named pipe or a link to ``/dev/zero`` would hang the loader, a gigabyte "config" fill the memory. Weights are read
from safetensors only: a pickle (``pytorch_model.bin``) can run code when it is unpickled, and gac never unpickles
one (:func:`refuse_pickled_weights`). :func:`hf_config` reads a directory's
``config.json`` that way, first refusing the fields no model runs with (:func:`config_field_problem`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gac.errors import GacError
from gac.transformers_lock import transformers_lock

#: the keyword every ``from_pretrained`` in gac passes
NO_REMOTE_CODE = {"trust_remote_code": False}
#: the files of a model directory that may name code to run
_CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                 "feature_extractor_config.json", "generation_config.json")


#: the files of a model directory a tokenizer loader reads
_TOKENIZER_FILES = ("tokenizer.json", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "chat_template.jinja", "chat_template.json")
#: a model's config is a few kB; a tokenizer file a few MB (the largest real ones are ~35 MB)
MAX_CONFIG_BYTES = 16 << 20
MAX_TOKENIZER_BYTES = 256 << 20
#: weight files in a format that is unpickled (and so may run code) when loaded
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.bin", "model.pt", "model.pth",
                   "model.ckpt", "consolidated.00.pth")
COPY_MODEL_AGAIN = "copy the model directory again from its source"


def check_model_dir_files(path: str | os.PathLike) -> None:
    """Every config and tokenizer file of the local model directory ``path`` that exists is a regular file (a link
    to one is fine: the Hugging Face cache links its files into blobs/) no larger than such a file is; else a
    one-line :class:`GacError`. Nothing for a path that is not a directory."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return
    for names, limit in ((_CONFIG_FILES, MAX_CONFIG_BYTES), (_TOKENIZER_FILES, MAX_TOKENIZER_BYTES),
                         (("model.safetensors.index.json",), MAX_CONFIG_BYTES)):
        for name in names:
            f = p / name
            if not (f.exists() or f.is_symlink()):
                continue
            require_regular(f, COPY_MODEL_AGAIN)
            size = f.stat().st_size
            if size > limit:
                raise GacError(f"{str(f)!r} is {size / 2**20:,.0f} MiB, larger than any {name} of a real model "
                               f"({limit >> 20} MiB at most); {COPY_MODEL_AGAIN}")
    tok = p / "tokenizer.json"
    if tok.is_file():  # the tokenizers library would stop on a cut file with a message that names no file
        from gac.io import read_json

        try:
            read_json(tok, "tokenizer file")
        except GacError as e:
            raise GacError(f"{e}; {COPY_MODEL_AGAIN}") from None


def check_model_path(spec: str | os.PathLike) -> None:
    """A model given by a path that is a looping or dangling link, a named pipe, a device or a socket: one line that
    says what it is (not "does not exist", and never read). Nothing for anything else (a hub id, a directory)."""
    from gac.io import path_kind
    from gac.layout import CHECKPOINT_FILE

    kind = path_kind(spec)
    if kind:
        raise GacError(f"model path {str(spec)!r} is {kind}; pass a model directory (config.json or "
                       f"{CHECKPOINT_FILE}), a hub id or 'tiny'")


def require_regular(f: Path, fix: str) -> None:
    """``f`` (after links) is a regular file: a named pipe would block its reader, a device never end."""
    try:
        f.stat()
    except FileNotFoundError:
        raise GacError(f"{str(f)!r} is a dangling symbolic link; {fix}") from None
    except (OSError, RuntimeError) as e:
        raise GacError(f"{str(f)!r} cannot be read ({e}); {fix}") from None
    if not f.is_file():
        what = "a directory" if f.is_dir() else "not a regular file (a named pipe, a device or a link to one)"
        raise GacError(f"{str(f)!r} is {what}; {fix}")


def refuse_pickled_weights(path: str | os.PathLike) -> None:
    """A :class:`GacError` for a local model directory without safetensors weights (``model.safetensors`` or its
    index): its weights are a pickle (unpickling may run code: gac never does), another format, or absent."""
    p = Path(path).expanduser()
    if (p / "model.safetensors").exists() or (p / "model.safetensors.index.json").exists():
        return
    pickles = [n for n in PICKLED_WEIGHTS if (p / n).exists()] or sorted(
        f.name for f in p.glob("*") if f.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    if pickles:
        raise GacError(f"{str(p)!r} holds its weights as a pickle ({pickles[0]}), and unpickling a file can run code "
                       f"in it: gac reads safetensors only. Convert the weights to model.safetensors where you trust "
                       f"the file (e.g. the model's safetensors revision on the hub), then pass the directory again")
    others = sorted(f.name for f in p.glob("*") if f.suffix in (".gguf", ".h5", ".msgpack", ".onnx"))
    found = f" (it has {', '.join(others[:3])}, a format gac does not load)" if others else ""
    raise GacError(f"{str(p)!r} has no model.safetensors or model.safetensors.index.json{found}; gac loads "
                   f"safetensors weights: {COPY_MODEL_AGAIN} with its safetensors files")


def _code_refs(auto_map) -> list[str]:
    refs = []
    for v in auto_map.values() if isinstance(auto_map, dict) else [auto_map]:
        for item in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(item, str) and item:
                refs.append(item)
    return sorted(set(refs))


def refuse_remote_code(path: str | os.PathLike) -> None:
    """A :class:`GacError` when a local model directory asks to run its own code (``auto_map`` in one of its
    configs) or holds a config or tokenizer file that is not a regular file of a sane size
    (:func:`check_model_dir_files`); nothing for a directory that does not, or a path that is not a directory."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return
    check_model_dir_files(p)  # what is read below is a regular file of a config's size
    for name in _CONFIG_FILES:
        f = p / name
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue  # the loader that reads this file reports it
        if isinstance(data, dict) and data.get("auto_map"):
            refs = ", ".join(_code_refs(data["auto_map"])) or "?"
            raise GacError(f"{str(f)!r} asks to run Python code shipped with the model (auto_map: {refs}); gac never "
                           f"runs code from a model directory: use a model whose architecture transformers ships "
                           f"(after reading that code, delete 'auto_map' from {name} if the architecture is one)")


def short_error(e: Exception, n: int = 200) -> str:
    """The first line of ``e``, or of its cause when that line only announces it (a validator's "...:")."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    cause = e.__cause__ or e.__context__
    if text.endswith(":") and cause is not None and cause is not e:
        text = f"{text} {short_error(cause, n)}"
    return text if len(text) <= n else text[: n - 3] + "..."


def _positive(v, integer: bool = False) -> bool:
    import math

    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        return False
    return math.isfinite(v) and v > 0


def config_field_problem(cfg: dict) -> str | None:
    """What in a raw ``config.json`` no model can run with (None when nothing): a maximum sequence length that is
    not a whole number >= 1 (perplexity windows would silently take another length), a RoPE base or a norm epsilon
    that is not a finite number > 0 (every logit NaN or inf), a size or attention window that is not a whole number
    >= 1, a logit scale or soft-cap that wrecks every logit, a rotary fraction outside (0, 1] or an odd rotary
    dimension, a number of experts per token outside 1..experts. The one place gac checks a config's values: a
    local directory's config.json, a cached hub model's, a gac checkpoint's base config and a job's ``arch`` block
    all come here before any weight loads."""
    if isinstance(cfg.get("text_config"), dict):  # a multimodal config's language model (Gemma 3 4B and up)
        why = config_field_problem(cfg["text_config"])
        if why:
            return f"text_config.{why}"
    if "max_position_embeddings" in cfg and not _positive(cfg["max_position_embeddings"], integer=True):
        return (f"max_position_embeddings is {cfg['max_position_embeddings']!r}, not a whole number >= 1 (the longest "
                f"sequence the model was trained for)")
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    for name, v in (("rope_theta", cfg.get("rope_theta")), ("rope_parameters.rope_theta", rope.get("rope_theta"))):
        if v is not None and not _positive(v):
            return f"{name} is {v!r}, not a number > 0 (the RoPE base, 10000 or 500000 in Llama models)"
    for name in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"):
        if cfg.get(name) is not None and not _positive(cfg[name]):
            return f"{name} is {cfg[name]!r}, not a number > 0 (the normalisation's epsilon, about 1e-5)"
    for key in ("rope_scaling", "rope_parameters"):
        block = cfg.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            return f"{key} is {block!r}, not an object of RoPE settings (or null)"
        nested = block and all(isinstance(v, dict) or v is None for v in block.values())  # one block per layer type
        for name, b in ({f"{key}.{k}": v for k, v in block.items() if v is not None} if nested else {key: block}).items():
            why = _rope_problem(b)
            if why:
                return f"{name}: {why}"
    return _shape_field_problem(cfg) or _logit_field_problem(cfg) or _rotary_problem(cfg) or _experts_problem(cfg)


#: whole-number sizes of a decoder's config (GPT-2's and Bloom's names beside Llama's): 0 or a negative or a fraction
#: of one fails inside transformers with a message that names no field ("integer modulo by zero")
_SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "vocab_size", "head_dim", "n_embd", "n_layer", "n_head", "n_inner")


def _shape_field_problem(cfg: dict) -> str | None:
    """A size that is not a whole number >= 1, or an attention window that is not a whole number >= 1 where the
    model uses one (0 or less masks every token: NaN logits). Sizes the weights disagree with are the weights
    check's (:func:`gac.models.checks.check_hf_dir`)."""
    for name in _SIZE_FIELDS:
        v = cfg.get(name)
        per_layer = isinstance(v, list) and v and all(_positive(x, integer=True) for x in v)  # Gemma 3n's widths
        if v is not None and not per_layer and not _positive(v, integer=True):
            shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
            return f"{name} is {shown}, not a whole number >= 1"
    w = cfg.get("sliding_window")
    if w is not None and cfg.get("use_sliding_window") is not False and not _positive(w, integer=True):
        return (f"sliding_window is {w!r}, not a whole number >= 1 (the tokens each attention window sees, e.g. 4096; "
                f"null for none)")
    return None


def _logit_field_problem(cfg: dict) -> str | None:
    """A logit or attention transform that wrecks every output: Granite's ``logits_scaling`` (logits are divided by
    it) or Cohere's ``logit_scale`` (multiplied) not > 0, a soft-cap below 1 (tanh squeezes every logit into
    (-cap, cap): 0 gives NaN), Gemma's ``query_pre_attn_scalar`` not > 0 (its inverse square root scales the
    scores)."""
    for name, what in (("logits_scaling", "Granite divides the logits by it, e.g. 8.0"),
                       ("logit_scale", "Cohere multiplies the logits by it, e.g. 0.0625"),
                       ("query_pre_attn_scalar", "the attention scores are scaled by its inverse square root, e.g. 256"),
                       ("attention_multiplier", "Granite scales the attention scores by it, e.g. 0.0078125"),
                       ("embedding_multiplier", "Granite scales the embeddings by it, e.g. 12.0")):
        v = cfg.get(name)
        if v is not None and not _positive(v):
            return f"{name} is {v!r}, not a number > 0 ({what})"
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        v = cfg.get(name)
        if v is not None and not (_positive(v) and v >= 1):
            return (f"{name} is {v!r}, not a number >= 1 or null (the soft-cap bounds every value to (-cap, cap): "
                    f"Gemma 2 uses 30.0 for the logits and 50.0 for the attention)")
    return None


def _rotary_factors(cfg: dict) -> list[tuple[str, object]]:
    """``(field, value)`` of every rotary fraction a config gives: top level (Phi's ``partial_rotary_factor``,
    GPT-NeoX's ``rotary_pct``) or in its RoPE settings (transformers 5 moves them there)."""
    out = [(n, cfg[n]) for n in ("partial_rotary_factor", "rotary_pct") if cfg.get(n) is not None]
    for key in ("rope_parameters", "rope_scaling"):
        block = cfg.get(key)
        if not isinstance(block, dict):
            continue
        nested = block and all(isinstance(v, dict) or v is None for v in block.values())
        for name, b in ({f"{key}.{k}": v for k, v in block.items() if v} if nested else {key: block}).items():
            if b.get("partial_rotary_factor") is not None:
                out.append((f"{name}.partial_rotary_factor", b["partial_rotary_factor"]))
    return out


def _rotary_problem(cfg: dict) -> str | None:
    """A rotary fraction outside (0, 1], or a rotary dimension (head dim times that fraction) that is odd: RoPE
    rotates pairs of dimensions."""
    factors = _rotary_factors(cfg)
    for name, v in factors:
        if not (_positive(v) and v <= 1):
            return (f"{name} is {v!r}, not a number in (0, 1] (the fraction of each head's dimensions RoPE rotates, "
                    f"e.g. 0.5 or 0.25)")
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    hidden = cfg.get("hidden_size", cfg.get("n_embd"))
    hd = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads
                                 and not hidden % heads else None)
    rope = factors or any(cfg.get(k) is not None for k in ("rope_theta", "rope_parameters", "rotary_emb_base"))
    if rope and isinstance(hd, int) and not isinstance(hd, bool):
        name, v = factors[0] if factors else ("", 1.0)
        dim = int(hd * v)
        if dim % 2:
            via = f" x {name} {v}" if factors else ""
            return (f"the rotary dimension (head dimension {hd}{via}) is {dim}, an odd number: RoPE rotates pairs of "
                    f"dimensions; give a head dimension{' and fraction' if factors else ''} whose rotary part is even")
    return None


#: the config fields that count a mixture-of-experts layer's experts (Mixtral, Qwen-MoE/OLMoE, DeepSeek)
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")


def _experts_problem(cfg: dict) -> str | None:
    """``num_experts_per_tok`` not a whole number from 1 to the expert count: 0 runs no expert at all (every MoE
    layer adds nothing), more than the experts fails in the router's top-k after loading."""
    k = cfg.get("num_experts_per_tok")
    if k is None:
        return None
    count = next(((n, cfg[n]) for n in _EXPERT_COUNTS if isinstance(cfg.get(n), int) and cfg[n] > 0), None)
    upto = f" to {count[0]} {count[1]}" if count else ""
    if not _positive(k, integer=True) or (count and k > count[1]):
        return (f"num_experts_per_tok is {k!r}, not a whole number from 1{upto} (the experts each token is routed "
                f"to, e.g. 2)")
    return None


#: RoPE types a config may name (transformers' own, with their rules: transformers only warns and then computes
#: rotary angles from the bad value)
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")


def _rope_problem(block: dict) -> str | None:
    """What in one RoPE settings block no model runs with: an unknown type, a scaling factor that is not a number
    >= 1, an attention factor, original length or frequency factor out of range."""
    kind = block.get("rope_type", block.get("type", "default"))
    if kind not in ROPE_TYPES:
        from gac.errors import unknown_name

        return str(unknown_name("rope_type", str(kind), ROPE_TYPES))
    if block.get("rope_theta") is not None and not _positive(block["rope_theta"]):
        return f"rope_theta is {block['rope_theta']!r}, not a number > 0 (the RoPE base, 10000 or 500000 in Llama models)"
    factor = block.get("factor")
    if (kind in ("linear", "dynamic", "yarn", "llama3") or factor is not None) and (not _positive(factor) or factor < 1):
        return (f"the {kind} RoPE scaling factor is {factor!r}, not a number >= 1 (how many times the trained "
                f"context is stretched, e.g. 2.0 or 8.0)")
    if block.get("attention_factor") is not None and not _positive(block["attention_factor"]):
        return f"attention_factor is {block['attention_factor']!r}, not a number > 0"
    omp = block.get("original_max_position_embeddings")
    if omp is not None and not _positive(omp, integer=True):
        return f"original_max_position_embeddings is {omp!r}, not a whole number >= 1 (the context it was trained for)"
    if kind == "llama3":
        lo, hi = block.get("low_freq_factor"), block.get("high_freq_factor")
        if not (_positive(lo) and _positive(hi) and hi > lo):
            return (f"low_freq_factor {lo!r} and high_freq_factor {hi!r} are not numbers > 0 with high > low "
                    f"(Llama 3 uses 1.0 and 4.0)")
    for name in ("beta_fast", "beta_slow"):
        if block.get(name) is not None and not _positive(block[name]):
            return f"{name} is {block[name]!r}, not a number > 0"
    for name in ("short_factor", "long_factor"):
        v = block.get(name)
        if (v is not None or kind == "longrope") and not (isinstance(v, list) and v and all(_positive(x) for x in v)):
            return f"{name} is not a list of numbers > 0"
    return None


def raw_config(path: Path) -> dict | None:
    """``config.json`` as a dict, or None when it is not a JSON object (transformers then says what is wrong)."""
    import json

    try:
        doc = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


@transformers_lock()
def hf_config(path: Path):
    """``config.json`` of a local model directory as a transformers config, or a one-line :class:`GacError`."""
    from transformers import AutoConfig

    refuse_remote_code(path)
    raw = raw_config(path)
    why = config_field_problem(raw) if raw is not None else None
    if why:
        raise GacError(f"{str(path / 'config.json')!r}: {why}; copy the model directory again from its source (or "
                       f"restore that field)")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True, **NO_REMOTE_CODE)
    except Exception as e:  # noqa: BLE001 - transformers raises ValueError, KeyError, OSError, JSONDecodeError...
        raise GacError(f"{str(path / 'config.json')!r} is not a usable Hugging Face config ({short_error(e)}); copy the "
                       f"model directory again from its source") from None


def check_config_values(config, where: str) -> None:
    """A transformers config read elsewhere than from a local directory (a hub model's, from the hub or its cache)
    checked as a directory's config.json is (:func:`config_field_problem`); ``where`` names it in the one line."""
    to_dict = getattr(config, "to_dict", None)
    why = config_field_problem(to_dict()) if callable(to_dict) else None
    if why:
        raise GacError(f"the config of {where}: {why}; the model cannot run with it (fix that field in its "
                       f"config.json, or download the model again)")


def differing_tied_copies(files, groups) -> tuple[str, str] | None:
    """Two stored copies of one tied weight (``groups``: the names each tied parameter has, e.g. ``lm_head.weight``
    and ``model.embed_tokens.weight`` under ``tie_word_embeddings``) whose values differ, as ``(kept, other)``; None
    when every tied weight is stored once or its copies are equal. A loader keeps one copy and drops the other, so
    such a pair is a tensor the config has no place for. ``files``: the safetensors files (headers scanned, only the
    tensors of such pairs read)."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                where.setdefault(k, Path(f))
    for names in groups:
        held = [n for n in names if n in where]
        if len(held) < 2:
            continue
        tensors = []
        for n in held:
            with safe_open(str(where[n]), framework="pt") as h:
                tensors.append(h.get_tensor(n))
        for n, t in zip(held[1:], tensors[1:], strict=True):
            if t.shape != tensors[0].shape or t.dtype != tensors[0].dtype or not bool((t == tensors[0]).all()):
                return held[0], n
    return None
