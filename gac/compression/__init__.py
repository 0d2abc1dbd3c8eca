"""Compression: target discovery, importance proxies, allocation (d*), the compressors, the layer swap, checkpoints.

>>> from gac.compression import Calibration, compress_model, prepare, load_checkpoint, save_checkpoint
>>> prepared = prepare(model, tok, "asvd", calibration=Calibration("tiny", 32, 256))   # score + factorise once
>>> model_c, plan, report = prepared.compress(0.15, "gac")                            # any ratio / strategy

A compressor is a thin class plus pure tensor math (``compressors/``); :mod:`.modules` holds the compressed module
types, :mod:`.swap` the layer swap every compressor uses (``replace_module``, which also keeps ``save_pretrained``
safe) and :mod:`.checkpoint` saving checkpoints (:mod:`.checkpoint_format`: the format and its hashes;
:mod:`.checkpoint_load`: loading). :mod:`.preparation` makes the :class:`Prepared` state (:mod:`.prepared`) that
:mod:`.prepared_io` saves and loads (safetensors + JSON, never pickles).
"""

from gac.compression.calibration import Calibration
from gac.compression.checkpoint import save_checkpoint
from gac.compression.checkpoint_load import load_checkpoint
from gac.compression.compress import compress_model
from gac.compression.compressors import COMPRESSORS, Compressor, Unit, get_compressor
from gac.compression.discovery import ModelLayout, discover
from gac.compression.preparation import prepare
from gac.compression.prepared import Prepared

__all__ = [
    "COMPRESSORS",
    "Calibration",
    "Compressor",
    "ModelLayout",
    "Prepared",
    "Unit",
    "compress_model",
    "discover",
    "get_compressor",
    "load_checkpoint",
    "prepare",
    "save_checkpoint",
]
