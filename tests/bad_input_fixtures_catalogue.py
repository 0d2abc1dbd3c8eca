"""The files the "Catalogue five, the rest" rows of docs/bad-input.md name: a Hugging Face home whose token file
holds two lines, and a link to an empty directory given as an output directory. Every name starts with ``c5_``."""

from __future__ import annotations

from pathlib import Path


def catalogue_files(T: Path) -> None:
    """Every input of the "Catalogue five, the rest" rows, under ``T``."""
    home = T / "c5_hfhome"
    home.mkdir()
    (home / "token").write_text("hf_abc\nhf_def\n")  # two tokens pasted where `hf auth login` keeps one
    (T / "c5_empty").mkdir()
    (T / "c5_link").symlink_to(T / "c5_empty", target_is_directory=True)
