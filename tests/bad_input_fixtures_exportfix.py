"""The files the "Export's own files" rows of docs/bad-input.md name: the side file of an ONNX graph that does not
exist yet (an earlier export's weights, or anyone's file of that name), which ``gac export -o`` must not replace
without ``--force``. Every name starts with ``exf_``; the rows also use the export catalogue's ``ex_pruned``."""

from __future__ import annotations

from pathlib import Path


def exportfix_files(T: Path) -> None:
    """Every input of the "Export's own files" rows, under ``T``."""
    (T / "exf_model.onnx.data").write_bytes(b"an earlier export's weights")
    (T / "exf_dir.onnx.data").mkdir()
