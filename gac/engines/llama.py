"""``llama.cpp``: the model written as a GGUF file by :func:`gac.export.gguf.write_quantized` (f32 or f16; a quantized
type through llama.cpp's own quantizer, its fallback tensors read from the file as ``gac export`` reads them) and run
by llama-cpp-python on the CPU.

llama.cpp evaluates one sequence at a time: a batch is its rows one after another, each from an empty KV cache
(kept in f32, so that the logits show the file's weights and not the cache's rounding). The context is sized to the
longest input seen so far (made again, outside any timed call, when a longer one comes); every position's logits
are computed (``logits_all``), as the other engines' prefill does.
"""

from __future__ import annotations

from pathlib import Path

from gac.engines.base import Engine
from gac.errors import GacError


class LlamaCppEngine(Engine):
    """A GGUF export of ``model`` (``layout``: :func:`gac.export.expressible.gguf_layout`) in ``workdir``."""

    name = "llama.cpp"

    def __init__(self, model, tokenizer, layout, workdir: Path, threads: int | None = None, quant: str = "f32"):
        import llama_cpp

        from gac.export.gguf import default_threads, write_quantized

        super().__init__(threads or default_threads(), quant, quant)
        self.version = str(getattr(llama_cpp, "__version__", "?"))
        workdir = Path(workdir)
        self.path = workdir / f"model-{quant}.gguf"
        # tensors stored in another type (rows not whole blocks of the type)
        self.fallback = write_quantized(model, tokenizer, layout, self.path, quant, workdir=workdir)
        self._llm = None
        self._n_ctx = 0

    def describe(self) -> dict:
        return {**super().describe(), "fallback_tensors": len(self.fallback)}

    def _ready(self, n_tokens: int):
        """A llama.cpp context that holds ``n_tokens`` in one batch."""
        import llama_cpp

        if self._llm is None or n_tokens > self._n_ctx:
            self.close()
            n = max(64, int(n_tokens))
            f32 = llama_cpp.GGML_TYPE_F32
            self._llm = llama_cpp.Llama(model_path=str(self.path), n_ctx=n, n_batch=n, n_ubatch=n, logits_all=True,
                                        n_threads=self.threads, n_threads_batch=self.threads, verbose=False, seed=0,
                                        type_k=f32, type_v=f32)
            self._n_ctx = n
        return self._llm

    def _rows(self, input_ids) -> list[list[int]]:
        if input_ids.dim() != 2:
            raise GacError(f"llama.cpp engine: input_ids must be [batch, sequence], got shape {list(input_ids.shape)}")
        return [[int(t) for t in row] for row in input_ids.detach().cpu()]

    def logits(self, input_ids):
        import numpy as np
        import torch

        rows = self._rows(input_ids)
        llm = self._ready(len(rows[0]))
        out = []
        for row in rows:
            llm.reset()
            llm.eval(row)
            out.append(np.array(llm.scores[:len(row)], dtype=np.float32))
        return torch.from_numpy(np.stack(out))

    def prefill_call(self, input_ids):
        rows = self._rows(input_ids)
        llm = self._ready(len(rows[0]))

        def call():
            for row in rows:
                llm.reset()
                llm.eval(row)
            return llm.scores

        return call

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None
