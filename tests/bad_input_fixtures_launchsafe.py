"""The files the "Fifth catalogue: what gac did not make" rows of docs/bad-input.md name: cluster directories gac
marked whose ``pids.json`` it did not write (a PID as a string, 0, a negative PID, an older bare PID, a list, not
JSON), a directory of the user's holding a ``pids.json``, and a Hugging Face model directory. Every name starts with
``lc_``; no PID named here is signalled by any row (each is refused before signalling), and none is running."""

from __future__ import annotations

import json
from pathlib import Path

from gac.launch.local_cluster import MARKER

_REC = {"start": "1", "boot": "not-this-boot", "programs": ["/usr/sbin/munged"]}


def launchsafe_files(T: Path) -> None:
    """Every input of the "Fifth catalogue: what gac did not make" rows, under ``T``."""
    pids = {
        "lc_pid_string": {"munged": {"pid": "4242", **_REC}},
        "lc_pid_zero": {"munged": {"pid": 0, **_REC}},
        "lc_pid_negative": {"munged": {"pid": -2147483647, **_REC}},
        "lc_pid_bare": {"munged": 4242},
        "lc_pid_list": [4242],
    }
    for name, content in pids.items():
        (T / name).mkdir()
        (T / name / MARKER).write_text("")
        (T / name / "pids.json").write_text(json.dumps(content))
    (T / "lc_pid_notjson").mkdir()
    (T / "lc_pid_notjson" / MARKER).write_text("")
    (T / "lc_pid_notjson" / "pids.json").write_text("{4242")
    (T / "lc_unmarked").mkdir()  # the user's own directory, with a pids.json of the user's
    (T / "lc_unmarked" / "pids.json").write_text(json.dumps({"munged": {"pid": 4242, **_REC}}))
    (T / "lc_hf_model").mkdir()
    (T / "lc_hf_model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (T / "lc_hf_model" / "model.safetensors").write_bytes(b"")
