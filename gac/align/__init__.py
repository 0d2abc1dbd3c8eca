"""Aligned dimension selection: candidate sets, the exact knapsack solver, and the baseline strategies."""

from gac.align.candidates import CandidateFilter, candidate_set, candidate_sets, rule_candidates
from gac.align.plan import Plan, aligned_fraction, make_plan, objective
from gac.align.solver import MCKPResult, solve_mckp
from gac.align.strategies import BUDGET_FREE, STRATEGIES, align

__all__ = [
    "BUDGET_FREE",
    "STRATEGIES",
    "CandidateFilter",
    "MCKPResult",
    "Plan",
    "align",
    "aligned_fraction",
    "candidate_set",
    "candidate_sets",
    "make_plan",
    "objective",
    "rule_candidates",
    "solve_mckp",
]
