"""One export, start to end: the format written into a temp directory beside the output, run in its engine and
compared with the model, and only then moved into place. An existing output is replaced only then; whether it may
be is the caller's check, made before any work (``gac export``: ``-o`` and an ONNX graph's side file, only with
``--force``). A failure at any point leaves the output as it was and no temp file behind. The output's directory is
the user's: the only leftovers removed there are earlier exports' temp names of this output
(:func:`gac.io.clean_temp_files` with ``output``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import nn

from gac.errors import GacError
from gac.export.expressible import Source


def _note(src: Source, fmt: str, quant: str | None) -> dict:
    """Where an export came from: gac_export.json of an HF folder, and the printed summary."""
    from gac import __version__
    from gac.machine import utc_stamp

    meta = src.meta or {}
    return {"source": src.spec, "kind": src.kind, "format": fmt, "quant": quant, "model_type": src.model_type,
            "base_model": meta.get("base_model"), "recipe": meta.get("recipe"),
            "weights_sha256": (meta.get("weights") or {}).get("sha256"), "gac_version": __version__,
            "created": utc_stamp()}


def export(src: Source, model: nn.Module, tokenizer, fmt: str, holds, output: str | os.PathLike,
           quant: str | None = None) -> dict:
    """Write ``model`` (float32, eval) as ``fmt`` to ``output`` once its engine agrees with it (module docstring);
    ``holds``: what :func:`gac.export.expressible.check_format` returned. Returns the summary."""
    from gac.io import clean_temp_files, os_error, temp_path

    out = Path(output).expanduser()
    if out.parent.is_dir():
        clean_temp_files(out.parent, output=out.name)  # temp directories of exports of ``out`` that were killed
    tmp = temp_path(out)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise os_error(e, "create a temp directory for the export beside", out) from None
    note = _note(src, fmt, quant)
    try:
        staged = tmp / out.name
        if fmt == "onnx":
            from gac.export.onnx import export_onnx, verify_onnx

            export_onnx(model, staged)
            check = verify_onnx(staged, model)
        elif fmt == "gguf":
            check = _gguf(model, tokenizer, holds, staged, quant)
            note["arch"] = holds.arch
        else:
            from gac.export.hf import verify_hf, write_hf

            write_hf(model, tokenizer, holds, staged, note)
            check = verify_hf(staged, model)
        size = (sum(f.stat().st_size for f in staged.rglob("*") if f.is_file()) if staged.is_dir()
                else sum(f.stat().st_size for f in tmp.iterdir() if f.is_file()))
        _place(tmp, staged, out, fmt)
    except OSError as e:
        raise os_error(e, "write the export", out) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keep = ("source", "format", "quant", "arch", "model_type", "base_model")
    return {"output": str(out), **{k: note[k] for k in keep if note.get(k) is not None}, "bytes": size, "check": check}


def _gguf(model, tokenizer, layout, staged: Path, quant: str) -> dict:
    import logging

    from gac.export import gguf

    # the quantizer's f32 input goes to a scratch directory in the temp one: never a file _place would move
    fallback = gguf.write_quantized(model, tokenizer, layout, staged, quant, workdir=staged.parent)
    check = gguf.verify_gguf(staged, model, quant)
    check["tensor_types"] = gguf.tensor_types(staged)
    check["fallback"] = fallback  # tensors whose rows are not whole blocks of the type, stored in another
    if fallback:
        logging.getLogger(__name__).warning("%s", gguf.fallback_line(quant, fallback))
    return check


def _place(tmp: Path, staged: Path, out: Path, fmt: str) -> None:
    """Move the checked export into place: its side files first (an ONNX graph's ``.data``), the output last, each by
    one rename (:func:`gac.io.replace_file`); a folder replaces an earlier one only once the new one is complete
    (:func:`gac.fixtures._build.publish`). An inline ONNX graph that replaces one with a side file removes that file
    last (the caller allowed replacing it), so no earlier export's weights stay beside the new graph."""
    from gac.export.onnx import data_file
    from gac.fixtures._build import publish
    from gac.io import replace_file

    stale = data_file(out) if fmt == "onnx" and not data_file(staged).exists() else None
    for f in sorted(tmp.iterdir()):
        if f != staged and f.is_file() and f.name.startswith(out.name):
            replace_file(out.with_name(f.name), lambda t, f=f: shutil.move(f, t))
    if staged.is_dir():
        publish(staged, out)
    else:
        replace_file(out, lambda t: shutil.move(staged, t))
    if not out.exists():
        raise GacError(f"the export could not be moved to {str(out)!r}")
    if stale is not None:
        stale.unlink(missing_ok=True)
