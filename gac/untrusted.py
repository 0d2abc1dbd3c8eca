"""Model directories are data: gac reads their configs, tokenizers and weights, and never runs code from them.

transformers runs Python shipped with a model when its config names it (``auto_map``) and the caller trusts it;
every gac loader passes :data:`NO_REMOTE_CODE`, and :func:`refuse_remote_code` refuses such a directory in one line
before anything is loaded (no prompt, no import of the shipped file). :func:`hf_config` reads a directory's
``config.json`` that way, first refusing the fields no model runs with (:func:`config_field_problem`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gac.errors import GacError

#: the keyword every ``from_pretrained`` in gac passes
NO_REMOTE_CODE = {"trust_remote_code": False}
#: the files of a model directory that may name code to run
_CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                 "feature_extractor_config.json", "generation_config.json")


def _code_refs(auto_map) -> list[str]:
    refs = []
    for v in auto_map.values() if isinstance(auto_map, dict) else [auto_map]:
        for item in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(item, str) and item:
                refs.append(item)
    return sorted(set(refs))


def refuse_remote_code(path: str | os.PathLike) -> None:
    """A :class:`GacError` when a local model directory asks to run its own code (``auto_map`` in one of its
    configs); nothing for a directory that does not, or a path that is not a directory."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return
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
    that is not a finite number > 0 (every logit NaN or inf)."""
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
    return None


def raw_config(path: Path) -> dict | None:
    """``config.json`` as a dict, or None when it is not a JSON object (transformers then says what is wrong)."""
    import json

    try:
        doc = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


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
