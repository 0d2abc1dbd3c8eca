"""The child process of :func:`gac.profiling.capture.capture_in_child`: a JSON request of op specs on stdin, the
longest kernel of each (run once under ``torch.profiler``) as ``{"kernels": [...]}`` on the last line of stdout."""

from __future__ import annotations

import json
import logging
import sys

from gac.dtypes import resolve_dtype
from gac.profiling.device import resolve_device
from gac.profiling.sweeps import capture_kernel_names


def main() -> int:
    """The child: a JSON request on stdin, ``{"kernels": [...]}`` on the last line of stdout."""
    logging.basicConfig(level=logging.WARNING)
    req = json.loads(sys.stdin.read())
    dev = resolve_device(req["device"])
    names = capture_kernel_names(req["specs"], dev, resolve_dtype(req["dtype"], dev))
    print(json.dumps({"kernels": names}))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child by capture_in_child
    sys.exit(main())
