"""Errors that reach users.

Every problem caused by input (a config, a file, a model, a budget) is raised as a :class:`GacError`
whose message names the problem and the fix. The CLI prints the message alone and exits with code 2;
library callers can catch the class.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GacError(Exception):
    """A problem with the user's input, reported with a message that says how to fix it."""


class ConfigRefused(GacError):
    """The job's config asks for what cannot be done, found only once the work it needs has run (a budget no plan
    reaches, known from the calibration or the latency table): not a failure of the job, so no failure record is
    left; the config has to change."""


class InfeasibleBudgetError(ConfigRefused):
    """No plan in the candidate sets fits the parameter budget."""

    def __init__(self, budget: int, min_budget: int, detail: str = ""):
        self.budget = int(budget)
        self.min_budget = int(min_budget)
        msg = (
            f"infeasible budget: {budget:,} parameters is below the cheapest plan the candidate sets allow "
            f"({min_budget:,} parameters); raise the budget to at least {min_budget:,} (a smaller compression "
            f"ratio) or allow smaller candidate dimensions"
        )
        super().__init__(msg + (f" ({detail})" if detail else ""))


def unknown_name(kind: str, name: str, known: Iterable[str]) -> GacError:
    """An error for an unknown registry name, with close-match suggestions."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return GacError(f"unknown {kind} {name!r}{hint} known: {', '.join(known)}")


def short_reason(e: BaseException) -> str:
    """An exception as a short reason inside a message: its type and the start of its first line."""
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(e).__name__}: {first[:200]}"
