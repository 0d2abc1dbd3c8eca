"""The engines tier's time, printed in pytest's summary (the load beside it)."""

from __future__ import annotations

#: test module -> (seconds, 1-minute load average at its end), filled by tests/export/test_engines.py
TIER_TIMES: dict[str, tuple[float, float]] = {}


def pytest_terminal_summary(terminalreporter):
    for module, (seconds, load) in TIER_TIMES.items():
        terminalreporter.write_line(f"engines tier ({module}): {seconds:.0f} s, load {load:.1f}")
