"""The files the "PaLU's latent cache" rows of docs/bad-input.md name: a random-weight Phi model (partial rotary
split inside its attention, so no latent cache) with tiny's tokenizer, and a copy of the catalogue's tiny checkpoint
whose ``kv_cache`` is not one gac saves (the config's hash recomputed: a deliberate edit). Names start with
``palu_``."""

from __future__ import annotations

from pathlib import Path


def palu_files(T: Path) -> None:
    from transformers import PhiConfig

    from gac.compression.checkpoint_format import META_FILE, meta_sha256
    from tests.bad_input_fixtures_modelchecks import SMALL, random_model
    from tests.bad_store_fixtures import _edit_json, _link_copy

    (T / "palu_phi").mkdir()
    random_model(T / "palu_phi", PhiConfig(**SMALL, partial_rotary_factor=0.5))

    def compact(m):
        m["kv_cache"] = "compact"
        m["meta_sha256"] = meta_sha256(m)

    _edit_json(_link_copy(T / "ck", T / "palu_ck_kvcache") / META_FILE, compact)
