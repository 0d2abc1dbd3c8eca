"""The names a job, the CLI and the docs choose from: compressors, alignment strategies, importance proxies,
allocation rules and knapsack scores, each with its aliases and one lookup that suggests close matches.

Only names live here (this module imports nothing of gac but its errors); the implementations register under them
in their own packages (:data:`gac.compression.compressors.COMPRESSORS`, :data:`gac.align.strategies.STRATEGIES`,
:data:`gac.compression.proxies.PROXIES`), and :meth:`Names.bind` fails at import if one of them names a
different set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from gac.errors import unknown_name


class Names:
    """One kind of registered name: the canonical names in their order and the aliases that map to them."""

    def __init__(self, kind: str, names: Iterable[str], aliases: Mapping[str, str] | None = None,
                 fold_case: bool = False):
        self.kind = kind
        self.names = tuple(names)
        self.aliases = dict(aliases or {})
        self.fold_case = fold_case  # compressor names are matched without case ("ASVD" is asvd)
        assert set(self.aliases.values()) <= set(self.names), f"{kind}: an alias names no registered {kind}"

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return self.canonical(name) is not None

    def listing(self, last: str = "or") -> str:
        """The names as prose, e.g. ``asvd, svd_llm, llm_pruner or palu`` (help texts, docs)."""
        return f"{', '.join(self.names[:-1])} {last} {self.names[-1]}" if len(self.names) > 1 else "".join(self.names)

    def canonical(self, name) -> str | None:
        """The canonical name of ``name`` or an alias of it; None when it is neither."""
        key = str(name).lower() if self.fold_case else str(name)
        key = self.aliases.get(key, key)
        return key if key in self.names else None

    def resolve(self, name, where: str = "", extra: Iterable[str] = ()) -> str:
        """The canonical name of ``name``, else a :class:`~gac.errors.GacError` naming the kind (with ``where``
        the option or config key, e.g. ``"(--strategy)"``), the close matches and the known names (``extra``: other
        accepted values the caller handles itself, listed too)."""
        got = self.canonical(name)
        if got is None:
            raise unknown_name(f"{self.kind} {where}".strip(), str(name), [*self.names, *extra])
        return got

    def bind(self, implementations: dict) -> dict:
        """``implementations`` (name -> implementation) checked to cover exactly these names; returned as given."""
        if set(implementations) != set(self.names):
            raise AssertionError(f"the {self.kind} implementations {sorted(implementations)} are not the registered "
                                 f"names {sorted(self.names)} (gac.registry)")
        return implementations


COMPRESSORS = Names("compressor", ("asvd", "svd_llm", "llm_pruner", "palu", "stable_rank_svd"), fold_case=True, aliases={
    "svd-llm": "svd_llm", "svdllm": "svd_llm", "llm-pruner": "llm_pruner", "llmpruner": "llm_pruner",
    "stable-rank-svd": "stable_rank_svd"})
#: the last three are the GAC authors' own procedures (gac.align.authors_dp), labelled options, never a default
STRATEGIES = Names("strategy", ("unaligned", "round_nearest", "round_up", "round_down", "rebalance", "gac",
                                "authors_dp", "authors_round", "round_to"))
#: strategies that budget latency instead of parameters (gac.align.latency_budget; `gac align` only, for now)
LATENCY_STRATEGIES = Names("latency-budget strategy", ("gac_latency",))
PROXIES = Names("importance proxy", ("magnitude", "activation", "gradient", "fisher", "taylor", "fisher_rms", "random"))
#: "default" is the compressor's own rule (its reference's); the others are gac.compression.allocation's, and
#: "stable_rank" the GAC authors' (gac.compression.stable_rank, the stable_rank_svd compressor's own)
ALLOCATIONS = Names("allocation", ("default", "proportional", "uniform", "sensitivity", "fisher_uniform",
                                   "stable_rank"))
KNAPSACK_SCORES = Names("knapsack score", ("proxy", "marginal"))
#: Eq. 4's score by default: the compressor's own error per parameter (gac.compression.prepared)
DEFAULT_KNAPSACK_SCORE = "marginal"

#: the model specs that name a fixture model (not a path, not a hub id): gac.fixtures builds and loads them
NAMED_MODELS = ("tiny", "tiny-untrained", "smollm2", "gemma3")

#: the uncompressed model's job: its compressor name (a config's ``compressor=none``, a record's ``job.compressor``),
#: the strategy its record carries, and its label in tables, figures and benches
BASELINE = "none"
BASELINE_STRATEGY = "baseline"
BASELINE_LABEL = "Baseline"


def is_baseline(compressor, strategy=None) -> bool:
    """Whether a job of ``compressor`` (and ``strategy``, as a record holds them) is the uncompressed baseline."""
    return str(compressor) == BASELINE or str(strategy) == BASELINE_STRATEGY


REGISTRIES = {"compressor": COMPRESSORS, "strategy": STRATEGIES, "proxy": PROXIES, "allocation": ALLOCATIONS,
              "knapsack_score": KNAPSACK_SCORES}
