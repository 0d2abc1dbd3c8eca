"""``torch``: the model itself in PyTorch eager mode, on its own device and dtype."""

from __future__ import annotations

from gac.engines.base import Engine


class TorchEngine(Engine):
    """``model(input_ids, use_cache=False)`` under ``torch.inference_mode``. ``threads`` (a CPU model): torch's
    thread count while the engine is open, the earlier count restored by :meth:`close`."""

    name = "torch"

    def __init__(self, model, threads: int | None = None):
        import torch

        from gac.devices import model_device
        from gac.dtypes import dtype_str

        self.model = model.eval()
        self.device = model_device(model)
        super().__init__(threads, None, dtype_str(next(model.parameters()).dtype))
        self.version = torch.__version__
        self.provider = str(self.device)
        self._prev_threads = None
        if self.device.type == "cpu":
            if threads is not None and threads != torch.get_num_threads():
                self._prev_threads = torch.get_num_threads()
                torch.set_num_threads(int(threads))
            self.threads = torch.get_num_threads()

    def logits(self, input_ids):
        import torch

        with torch.inference_mode():
            return self.model(input_ids=input_ids.to(self.device), use_cache=False).logits

    def prefill_call(self, input_ids):
        import torch

        x = input_ids.to(self.device)
        model = self.model

        def call():
            with torch.inference_mode():
                return model(input_ids=x, use_cache=False)

        return call

    def close(self) -> None:
        import torch

        if self._prev_threads is not None:
            torch.set_num_threads(self._prev_threads)
            self._prev_threads = None
