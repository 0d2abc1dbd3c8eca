"""A ``gac doctor`` check: its name, PASS / FAIL / INFO and the detail; a check that raises becomes a FAIL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gac.errors import GacError


@dataclass
class Check:
    name: str
    status: str  # PASS, FAIL or INFO
    detail: str
    data: dict = field(default_factory=dict)

    def line(self, width: int = 20) -> str:
        return f"{self.status:<4}  {self.name:<{width}}  {self.detail}"


def guard(name: str, fn: Callable[[], Check]) -> Check:
    """``fn()``, or a FAIL naming the exception (a check never takes the others down)."""
    try:
        return fn()
    except GacError as e:
        return Check(name, "FAIL", str(e))
    except Exception as e:  # noqa: BLE001 - a broken node raises anything; say what and go on
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return Check(name, "FAIL", f"{type(e).__name__}: {first}")
