"""A model run by a serving engine, behind one interface: what the latency stage and the bench time, and what a
check compares with PyTorch's own logits.

* :mod:`.base` — :class:`Engine`, the interface (logits, the prefill call latency timing makes, a record's
  description);
* :mod:`.eager` — ``torch``: the model itself, PyTorch eager (what every latency of gac measured before engines);
* :mod:`.ort` — ``onnxruntime``: the model exported to ONNX (:mod:`gac.export.onnx`) and run in onnxruntime;
* :mod:`.llama` — ``llama.cpp``: the model exported to GGUF (:mod:`gac.export.gguf`) and run by llama-cpp-python;
* :mod:`.opening` — :func:`open_engine`, the one way in, which refuses what an engine cannot run before any work.
"""

from gac.engines.base import Engine
from gac.engines.opening import ENGINES, check_engine, engines_for, open_engine

__all__ = ["ENGINES", "Engine", "check_engine", "engines_for", "open_engine"]
