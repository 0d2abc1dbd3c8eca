"""Which file backs an address of this process: how the tests see that a weight lives on disk, not in memory."""

from __future__ import annotations

import pytest


def mapped_from(address: int) -> str | None:
    """The file mapped at ``address`` in this process (Linux: /proc/self/maps), or None."""
    from pathlib import Path

    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps (Linux)")
    for line in maps.read_text().splitlines():
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5] if len(parts) > 5 else None
    return None
