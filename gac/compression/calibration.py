"""Where a compression's calibration tokens come from (:class:`Calibration`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from gac.errors import GacError
from gac.text import CALIBRATION_SAMPLES, CALIBRATION_SEQ_LEN, CALIBRATION_SOURCE


@dataclass(frozen=True)
class Calibration:
    """Where calibration tokens come from: ``n_samples`` random windows of ``seq_len`` tokens (seeded).

    ``source``: ``"wikitext2"`` (train split, the ASVD / SVD-LLM protocol), ``"tiny"``, or a local text file.
    Defaults follow ASVD (32 x 2048 from WikiText-2 train).
    """

    source: str = CALIBRATION_SOURCE
    n_samples: int = CALIBRATION_SAMPLES
    seq_len: int = CALIBRATION_SEQ_LEN
    seed: int = 0
    split: str = "train"

    def to_json(self) -> dict:
        return asdict(self)

    def token_ids(self, tokenizer) -> torch.Tensor:
        from gac.text import calibration_batches

        if tokenizer is None:
            raise GacError("calibration from text needs a tokenizer; pass one, or pass calib_ids directly")
        return calibration_batches(tokenizer, self.source, self.n_samples, self.seq_len, self.seed, self.split)
