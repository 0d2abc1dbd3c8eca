"""The files the "Fifth catalogue: the last catalogue's unclear cases" rows of docs/bad-input.md name: a config
directory whose model option is not UTF-8 text, a results store whose ``bench`` is a file. Every name starts with
``unc_``."""

from __future__ import annotations

from pathlib import Path


def unclear_files(T: Path) -> None:
    """Every input of the "Fifth catalogue: the last catalogue's unclear cases" rows, under ``T``."""
    model = T / "unc_conf_latin1" / "model"
    model.mkdir(parents=True)
    (model / "latin1.yaml").write_bytes(b"defaults:\n  - tiny\nname: caf\xe9\n")  # Latin-1, not UTF-8
    store = T / "unc_store_benchfile"
    (store / "records").mkdir(parents=True)
    (store / "bench").write_text("not the store's bench/ directory")
