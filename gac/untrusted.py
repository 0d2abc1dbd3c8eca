"""Model directories are data: gac reads their configs, tokenizers and weights, and never runs code from them.

transformers runs Python shipped with a model when its config names it (``auto_map``) and the caller trusts it;
every gac loader passes :data:`NO_REMOTE_CODE`, and :func:`refuse_remote_code` refuses such a directory in one line
before anything is loaded (no prompt, no import of the shipped file).
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
