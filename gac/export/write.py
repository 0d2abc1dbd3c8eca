"""One export, start to end: the format written into a temp directory beside the output, run in its engine and
compared with the model, and only then moved into place (an existing output replaced only then, with ``--force``).
A failure at any point leaves the output as it was and no temp file behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import nn

from gac.errors import GacError
from gac.export.expressible import UNQUANTIZED, Source


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
           quant: str | None = None, force: bool = False) -> dict:
    """Write ``model`` (float32, eval) as ``fmt`` to ``output`` once its engine agrees with it (module docstring);
    ``holds``: what :func:`gac.export.expressible.check_format` returned. Returns the summary."""
    from gac.io import clean_temp_files, os_error, temp_path

    out = Path(output).expanduser()
    if out.parent.is_dir():
        clean_temp_files(out.parent)  # temp directories of exports that were killed
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
            check = _gguf(model, tokenizer, holds, staged, quant, tmp)
            note["arch"] = holds.arch
        else:
            from gac.export.hf import verify_hf, write_hf

            write_hf(model, tokenizer, holds, staged, note)
            check = verify_hf(staged, model)
        size = (sum(f.stat().st_size for f in staged.rglob("*") if f.is_file()) if staged.is_dir()
                else sum(f.stat().st_size for f in tmp.iterdir() if f.is_file()))
        _place(tmp, staged, out)
    except OSError as e:
        raise os_error(e, "write the export", out) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keep = ("source", "format", "quant", "arch", "model_type", "base_model")
    return {"output": str(out), **{k: note[k] for k in keep if note.get(k) is not None}, "bytes": size, "check": check}


def _gguf(model, tokenizer, layout, staged: Path, quant: str, tmp: Path) -> dict:
    import logging

    from gac.export import gguf

    fallback = {}
    if quant in UNQUANTIZED:
        gguf.write_gguf(model, tokenizer, layout, staged, dtype=quant)
    else:
        (tmp / "input").mkdir()  # the quantizer's input: never the output's name, removed with the temp directory
        f32 = tmp / "input" / "f32.gguf"
        gguf.write_gguf(model, tokenizer, layout, f32, dtype="f32")
        gguf.quantize(f32, staged, quant)
        f32.unlink()
        fallback = gguf.fallback_tensors(staged, quant)  # measured from the file written, not from the quantizer's log
    check = gguf.verify_gguf(staged, model, quant)
    check["tensor_types"] = gguf.tensor_types(staged)
    check["fallback"] = fallback  # tensors whose rows are not whole blocks of the type, stored in another
    if fallback:
        logging.getLogger(__name__).warning("%s", gguf.fallback_line(quant, fallback))
    return check


def _place(tmp: Path, staged: Path, out: Path) -> None:
    """Move the checked export into place: its side files first (an ONNX graph's ``.data``), the output last, each by
    one rename (:func:`gac.io.replace_file`); a folder replaces an earlier one only once the new one is complete
    (:func:`gac.fixtures._build.publish`)."""
    from gac.fixtures._build import publish
    from gac.io import replace_file

    for f in sorted(tmp.iterdir()):
        if f != staged and f.is_file() and f.name.startswith(out.name):
            replace_file(out.with_name(f.name), lambda t, f=f: shutil.move(f, t))
    if staged.is_dir():
        publish(staged, out)
    else:
        replace_file(out, lambda t: shutil.move(staged, t))
    if not out.exists():
        raise GacError(f"the export could not be moved to {str(out)!r}")
