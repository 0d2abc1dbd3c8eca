"""One transformers build at a time per process: :func:`transformers_lock`.

transformers builds a model under process-wide patches, not per-thread ones: ``no_init_weights`` swaps torch's init
functions and ``PreTrainedModel.init_weights`` for no-ops and on exit puts back what it found (two interleaved builds
put the no-ops back for good, and every later model of the process is built uninitialised); ``from_config`` and
``from_pretrained`` set torch's default dtype and patch torch's creation ops the same way. Its top-level module
imports a model's code on first use, and two threads doing that at once can see a half-imported module ("cannot
import name 'LlamaConfig' from 'transformers'"). gac's jobs may run in threads of one process (a notebook, a test,
points of a sweep run in one process), so every model build, config read and tokenizer load in gac holds this lock.

A holder never waits for another lock (a fixture's build lock, a results lock) inside it, so no two threads can wait
for each other. Reentrant: a load builds its skeleton inside it."""

from __future__ import annotations

import threading
from contextlib import contextmanager

_LOCK = threading.RLock()


@contextmanager
def transformers_lock():
    """Hold the process's one transformers lock (a context manager, or a decorator: ``@transformers_lock()``)."""
    with _LOCK:
        yield


__all__ = ["transformers_lock"]
