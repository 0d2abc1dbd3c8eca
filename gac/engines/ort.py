"""``onnxruntime``: the model exported to an ONNX graph by :func:`gac.export.onnx.export_onnx` (dynamic batch and
sequence axes, full logits, no cache) and run by onnxruntime's CPU execution provider."""

from __future__ import annotations

from pathlib import Path

from gac.engines.base import Engine

PROVIDER = "CPUExecutionProvider"


class OrtEngine(Engine):
    """One onnxruntime session over ``workdir/model.onnx``; ``threads``: its intra-op threads (one inter-op thread,
    sequential execution), default onnxruntime's own choice."""

    name = "onnxruntime"
    provider = PROVIDER

    def __init__(self, model, workdir: Path, threads: int | None = None):
        import onnxruntime as ort

        from gac.export.onnx import export_onnx

        super().__init__(threads, None, "float32")
        self.version = ort.__version__
        self.path = export_onnx(model.eval(), Path(workdir) / "model.onnx")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.inter_op_num_threads = 1
        if threads:
            opts.intra_op_num_threads = int(threads)
        self.session = ort.InferenceSession(str(self.path), opts, providers=[PROVIDER])

    @staticmethod
    def _feed(input_ids) -> dict:
        import torch

        return {"input_ids": input_ids.detach().to("cpu", dtype=torch.int64).numpy()}

    def logits(self, input_ids):
        import torch

        return torch.from_numpy(self.session.run(["logits"], self._feed(input_ids))[0])

    def prefill_call(self, input_ids):
        feed, run = self._feed(input_ids), self.session.run

        def call():
            return run(["logits"], feed)

        return call

    def close(self) -> None:
        self.session = None
