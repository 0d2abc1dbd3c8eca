"""A compressed model from a plan's shapes: random weights, no calibration, no weights read.

Latency depends on shapes, not values. :class:`Structure` holds what decides them — the base architecture (a
transformers config), the dtype, the compressor with its options and the plan's dims — and builds the compressed
model with the module classes the compressor itself installs (:class:`~gac.compression.modules.LowRankLinear`,
:class:`~gac.compression.modules.GroupedLowRankLinear`, a narrower ``nn.Linear``, the model's own experts module at a
narrower width), each compressor describing its
own modules through :meth:`Compressor.module_specs <gac.compression.compressors.base.Compressor.module_specs>`;
the swap goes through :func:`~gac.compression.swap.replace_module` as everywhere else.

    config = architecture("tiny")                                   # the shipped config.json, no weights
    base = Structure(config, torch.float16).build("cuda")           # the uncompressed model, random weights
    s = Structure(config, torch.float16, "asvd", {}, plan["dims"])  # validated now (targets, ranges) on meta
    model = s.build("cuda", share_from=base)                        # shares embeddings, norms, lm_head, ...

Building: a structure is first laid out on the ``meta`` device (no memory); :meth:`Structure.build` then gives
every parameter real storage directly on the target device with random values (normal, ``std`` =
``config.initializer_range``; norms 1, biases 0), so an 8B model never exists on the CPU at full size. With
``share_from`` (a model built from the same architecture, usually the baseline) every parameter and buffer whose
name, shape and dtype match is the *same tensor* as there — embeddings, norms, lm_head, rotary tables and the
projections the plan leaves alone — so variants cost device memory only for what they change.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from gac.dtypes import resolve_dtype
from gac.errors import GacError
from gac.layout import CHECKPOINT_FILE
from gac.transformers_lock import transformers_lock
from gac.untrusted import NO_REMOTE_CODE

log = logging.getLogger(__name__)

__all__ = ["Structure", "architecture"]


@transformers_lock()
def architecture(model_spec: str | os.PathLike, random_weights: bool = False, arch: dict | None = None):
    """The transformers config of a model spec, without reading any weight.

    a named model (``tiny``, ``smollm2``, ``gemma3``: :func:`gac.fixtures.named_config`, no build needed); a gac
    checkpoint directory: its recorded base config
    (the uncompressed architecture); a local Hugging Face directory: its ``config.json``; a hub id:
    ``AutoConfig.from_pretrained`` (the hub or the local HF cache); ``random_weights`` with an ``arch`` block (the
    job configs of ``model.random_weights=true``): that block.
    """
    from transformers import AutoConfig

    if random_weights:
        if not arch:
            raise GacError("random_weights=true needs an `arch` block (model_type, hidden_size, ...) in the model config")
        a = dict(arch)
        model_type = a.pop("model_type", None)
        if not model_type:
            raise GacError("the model's `arch` block has no model_type; add one (model_type: llama for the Llama-style "
                           "configs in conf/model/)")
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        from gac.untrusted import config_field_problem

        why = config_field_problem(dict(arch))
        if why:
            raise GacError(f"the model's `arch` block: {why}; fix that field")

        if str(model_type) not in CONFIG_MAPPING:
            import difflib

            close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "e.g. llama, mistral, qwen2"
            raise GacError(f"the model's `arch` block has model_type {model_type!r}, which transformers does not "
                           f"know; {hint}")
        try:
            return AutoConfig.for_model(model_type, **a)
        except (ValueError, KeyError, TypeError) as e:
            raise GacError(f"the model's `arch` block does not make a transformers config ({e}); check model_type") from None
    s = str(model_spec)
    from gac.fixtures import is_named, named_config

    if is_named(s):
        return named_config(s)
    from gac.untrusted import check_model_path

    check_model_path(s)
    p = Path(s).expanduser()
    if p.is_dir():
        if (p / CHECKPOINT_FILE).is_file():
            from gac.compression.checkpoint_format import base_config, read_meta

            try:
                return base_config(read_meta(p))  # its fields checked as a config.json's are
            except GacError as e:
                raise GacError(f"checkpoint {s!r}: {e}; copy the checkpoint again from its source") from None
        if (p / "config.json").is_file():
            from gac.untrusted import hf_config

            return hf_config(p)  # one line for a config transformers refuses, and the fields no model runs with
        raise GacError(f"{s!r} is a directory without config.json or {CHECKPOINT_FILE}; point at a model directory")
    if p.exists():
        raise GacError(f"{s!r} is a file, not a model directory; pass a model directory, a hub id or 'tiny'")
    if s.startswith((".", "/", "~")):
        raise GacError(f"model directory {s!r} does not exist; check the path (or pass a hub id or 'tiny')")
    from gac.hub import check_hub_model

    check_hub_model(s)  # the hub behind a closed proxy: one line now, not half a minute of retries
    try:
        config = AutoConfig.from_pretrained(s, **NO_REMOTE_CODE)
    except Exception as e:  # the hub client raises many kinds when offline or when the id is wrong
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise GacError(f"could not read the config of {s!r} ({msg}); without network pass a local model directory, "
                       f"or a job config with model.random_weights=true and its `arch` block") from None
    from gac.untrusted import check_config_values

    check_config_values(config, repr(s))
    return config


def _skeleton(config, dtype: torch.dtype, device) -> nn.Module:
    """The base architecture with unallocated (``meta``) or uninitialised storage."""
    from gac.compression.discovery import skeleton

    return skeleton(config, dtype, device)


@dataclass(eq=False)
class Structure:
    """The shapes of one (possibly compressed) model: base architecture, dtype, compressor + options, plan dims.

    ``compressor=None`` (or ``"none"``) is the uncompressed model. Construction validates the plan against the
    architecture (unknown targets, dims outside ``1..d_cap``: :class:`GacError`) on the ``meta`` device.
    """

    config: object
    dtype: torch.dtype | str = torch.float32
    compressor: str | None = None
    options: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    specs: dict = field(init=False, default_factory=dict)  # module name -> module spec the compressor installs
    targets: int = field(init=False, default=0)  # the compressor's unit count on this architecture
    planned: tuple = field(init=False, default=())  # the (module, part) weights of the plan's targets (compressed or kept dense)

    def __post_init__(self):
        self.dtype = resolve_dtype(self.dtype)
        if self.compressor in ("none", ""):
            self.compressor = None
        if self.compressor is None:
            if self.dims:
                raise GacError("an uncompressed structure takes no plan dims; name the compressor the plan is for")
            return
        from gac.compression.compressors import get_compressor
        from gac.compression.discovery import discover

        comp = get_compressor(self.compressor, **dict(self.options or {}))
        self.compressor = comp.name
        meta = _skeleton(self.config, self.dtype, "meta")
        units = comp.units(meta, discover(meta))
        self.targets = len(units)
        dims = {str(k): v for k, v in dict(self.dims).items()}
        self.specs = comp.module_specs(meta, units, dims)
        self.planned = tuple(sorted({wp for u in units if u.name in dims for wp in u.weight_parts},
                                    key=lambda mp: (mp[0], mp[1] or "")))

    @property
    def is_baseline(self) -> bool:
        return self.compressor is None

    @property
    def max_length(self) -> int | None:
        n = getattr(self.config, "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def compressed_params(self) -> int:
        """Weight parameters of the modules of the plan's targets (biases excluded): the plan's ``params``."""
        from gac.compression.parts import part_params

        if not self.planned:
            return 0
        from gac.compression.discovery import discover

        sk = self.skeleton()
        layout = discover(sk, check_heads=False)
        return sum(part_params(sk, m, part, layout) for m, part in self.planned)

    def skeleton(self) -> nn.Module:
        """The structure on the ``meta`` device: shapes only, no memory (built once, shared: read it, don't change it)."""
        if getattr(self, "_meta", None) is None:
            self._meta = self._apply_specs(_skeleton(self.config, self.dtype, "meta"), "meta")
        return self._meta

    def _apply_specs(self, model: nn.Module, device) -> nn.Module:
        from gac.compression.modules import build_module, get_module
        from gac.compression.swap import replace_module

        for name, spec in self.specs.items():
            replace_module(model, name, build_module(spec, dtype=self.dtype, device=device, like=get_module(model, name)))
        return model

    def build(self, device="cpu", share_from: nn.Module | None = None, seed: int = 0) -> nn.Module:
        """The model with random weights on ``device``; see the module docstring for ``share_from``."""
        device = torch.device(device)
        std = float(getattr(self.config, "initializer_range", 0.02) or 0.02)
        gen = torch.Generator(device=device).manual_seed(int(seed))
        if share_from is None:
            model = self._apply_specs(_skeleton(self.config, self.dtype, device), device)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    _init_(name, p, std, gen)
        else:
            model = self._apply_specs(_skeleton(self.config, self.dtype, "meta"), "meta")
            _materialise(model, share_from, device, std, gen)
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()
        model._gac_structure = self
        return model


def _init_(name: str, p: torch.Tensor, std: float, gen: torch.Generator) -> None:
    if p.dim() >= 2:
        p.normal_(0.0, std, generator=gen)
    elif name.endswith("bias"):
        p.zero_()
    else:  # RMSNorm / LayerNorm weights
        p.fill_(1.0)


def _materialise(model: nn.Module, share_from: nn.Module, device: torch.device, std: float, gen) -> None:
    """Give every meta parameter and buffer of ``model`` storage: the same tensor as ``share_from``'s where the
    name, shape and dtype match, else fresh random storage on ``device`` (tied weights stay tied)."""
    base_p = dict(share_from.named_parameters(remove_duplicate=False))
    base_b = dict(share_from.named_buffers(remove_duplicate=False))
    made: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for mod_name, mod in model.named_modules(remove_duplicate=False):
            prefix = f"{mod_name}." if mod_name else ""
            for leaf, p in list(mod._parameters.items()):
                if p is None or not p.is_meta:
                    continue
                b = base_p.get(prefix + leaf)
                if b is not None and b.shape == p.shape and b.dtype == p.dtype:
                    mod._parameters[leaf] = b
                    continue
                if id(p) not in made:
                    new = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=False)
                    _init_(prefix + leaf, new, std, gen)
                    made[id(p)] = new
                mod._parameters[leaf] = made[id(p)]
            for leaf, buf in list(mod._buffers.items()):
                if buf is None or not buf.is_meta:
                    continue
                b = base_b.get(prefix + leaf)
                if b is None or b.shape != buf.shape:
                    raise GacError(f"buffer {prefix + leaf} has no counterpart in the model shared from; build both from "
                                   f"the same architecture")
                mod._buffers[leaf] = b
