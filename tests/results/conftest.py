"""Fixtures of the store tests: real small file systems, to fill up."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(d, size: str):
    """A real tmpfs of ``size`` mounted at ``d`` (needs root and mount: the test is skipped elsewhere)."""
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.fixture
def small_fs(tmp_path):
    """A real 256 KiB file system."""
    with tmpfs(tmp_path / "fs", "256k") as d:
        yield d


@pytest.fixture
def fs_1m(tmp_path):
    """A real 1 MiB file system."""
    with tmpfs(tmp_path / "fs", "1m") as d:
        yield d
