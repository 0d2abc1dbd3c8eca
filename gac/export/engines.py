"""The packages an export format needs, and the one-line refusal when they are not installed (``gac[engines]``)."""

from __future__ import annotations

import importlib.util

from gac.errors import GacError

EXTRA = "pip install 'gac[engines]'"
#: format -> (import name, pip name) of what writing and checking it needs
NEEDS = {
    "onnx": (("onnx", "onnx"), ("onnxscript", "onnxscript"), ("onnxruntime", "onnxruntime")),
    "gguf": (("gguf", "gguf"), ("llama_cpp", "llama-cpp-python")),
    "hf": (),
}


def missing(fmt: str) -> list[str]:
    """The pip names of what ``fmt`` needs and this Python cannot import."""
    return [pip for mod, pip in NEEDS.get(fmt, ()) if importlib.util.find_spec(mod) is None]


def require(fmt: str) -> None:
    """A one-line :class:`GacError` naming the extra to install when ``fmt``'s engine is not installed."""
    gone = missing(fmt)
    if gone:
        raise GacError(f"--format {fmt} needs {', '.join(gone)}, which {'is' if len(gone) == 1 else 'are'} not "
                       f"installed here (the export is checked in its engine before it is kept); {EXTRA}")
