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


def require(fmt: str, what: str | None = None) -> None:
    """A one-line :class:`GacError` naming the extra to install when ``fmt``'s engine is not installed; ``what``:
    who needs it (default ``--format FMT``, whose export is checked in its engine)."""
    gone = missing(fmt)
    if gone:
        why = "" if what else " (the export is checked in its engine before it is kept)"
        raise GacError(f"{what or f'--format {fmt}'} needs {', '.join(gone)}, which "
                       f"{'is' if len(gone) == 1 else 'are'} not installed here{why}; {EXTRA}")
