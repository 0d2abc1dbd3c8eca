"""The interface every engine offers (:class:`Engine`)."""

from __future__ import annotations

from collections.abc import Callable


class Engine:
    """A model as one engine runs it. Subclasses set :attr:`name` and :attr:`version` and implement
    :meth:`logits` and :meth:`prefill_call`; :meth:`close` frees what the engine holds (a context manager closes it).

    ``input_ids`` are ``[batch, sequence]`` int64 token ids; :meth:`logits` returns float32 ``[batch, sequence,
    vocab]`` on the CPU (the torch engine: on the model's device, in its dtype); :meth:`prefill_call` returns the
    callable a latency timing calls: one full forward over ``input_ids`` with every position's logits and no cache,
    its setup (copies, buffers) done before it is returned."""

    name: str = "?"
    version: str = "?"
    provider: str = "cpu"

    def __init__(self, threads: int | None = None, quant: str | None = None, dtype: str = "float32"):
        self.threads, self.quant, self.dtype = threads, quant, dtype

    def describe(self) -> dict:
        """What a record or a bench document keeps of the engine."""
        return {"name": self.name, "version": self.version, "threads": self.threads, "quant": self.quant,
                "dtype": self.dtype, "provider": self.provider}

    def logits(self, input_ids):
        raise NotImplementedError

    def prefill_call(self, input_ids) -> Callable[[], object]:
        raise NotImplementedError

    def close(self) -> None:
        """Free what the engine holds; closing twice is harmless."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
