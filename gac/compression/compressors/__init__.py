"""Compressors: ASVD, SVD-LLM, LLM-Pruner and PaLU, each a gac citizen (score -> d* -> aligned plan -> apply), and
``stable_rank_svd``, the procedure the GAC authors' Table 5 script ran as "ASVD" (a labelled option, never a default).

``COMPRESSORS`` maps a name (:data:`gac.registry.COMPRESSORS`, with its aliases) to its class; :func:`get_compressor` builds one with keyword options and suggests close
matches for a typo. Each compressor is a small class (lifecycle) plus a sibling module of pure tensor math.
"""

from __future__ import annotations

import inspect

from gac import registry
from gac.compression.compressors.asvd import ASVD
from gac.compression.compressors.base import Compressor, Unit
from gac.compression.compressors.llm_pruner import LLMPruner
from gac.compression.compressors.palu import PaLU
from gac.compression.compressors.stable_rank_svd import StableRankSVD
from gac.compression.compressors.svd_llm import SVDLLM
from gac.errors import GacError, unknown_name

COMPRESSORS: dict[str, type[Compressor]] = registry.COMPRESSORS.bind({
    "asvd": ASVD,
    "svd_llm": SVDLLM,
    "llm_pruner": LLMPruner,
    "palu": PaLU,
    "stable_rank_svd": StableRankSVD,
})


def canonical_name(name: str) -> str:
    """The registered name of a compressor name or alias (``svdllm``, ``SVD-LLM`` -> ``svd_llm``), with suggestions
    for a typo (:data:`gac.registry.COMPRESSORS`)."""
    return registry.COMPRESSORS.resolve(name)


def get_compressor(name: str | Compressor, **options) -> Compressor:
    """Build a compressor by name; unknown options fail with the list of accepted ones."""
    if isinstance(name, Compressor):
        if options:
            raise GacError("options were given together with an already built compressor; pass one or the other")
        return name
    cls = COMPRESSORS[canonical_name(name)]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    bad = [k for k in options if k not in accepted]
    if bad:
        raise unknown_name(f"option for compressor {cls.name!r}", bad[0], accepted)
    return cls(**options)


__all__ = ["ASVD", "COMPRESSORS", "LLMPruner", "PaLU", "SVDLLM", "StableRankSVD", "Compressor", "Unit", "canonical_name", "get_compressor"]
