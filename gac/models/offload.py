"""The offload folder (``model.offload_dir``): where a model spread over its devices keeps the units placed on disk.

gac writes there only what it creates. Each model placed makes a folder of its own inside (``gac-offload-*``, made
new by ``mkdtemp``, private to the user) and creates each unit's file in it exclusively: never through a symbolic
link, into a named pipe or over a file of the user's, whatever the folder held before. A unit's file is unlinked as
soon as it is memory-mapped (the mapping keeps the data, so the weights stay file-backed and never fill host memory;
the space returns when the model is freed, even if the process is killed), and the folder of its own is removed when
the model is freed or the process ends.

The folder is checked before the model loads (:func:`check_offload_dir`, then :class:`OffloadFolder` makes its own
folder there, which proves it writable): a directory, or a path under one that gac makes; not a model directory nor
inside one (the weights there are the model), nor a results store's own directories. Each refusal is one line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from gac.errors import GacError
from gac.io import create_new, os_error, path_kind
from gac.layout import owned_directory

PREFIX = "gac-offload-"  # the folder of its own each placed model makes inside the offload folder
_FIX = "give model.offload_dir a folder of its own for the weights placed on disk (it is made if missing)"


def check_offload_dir(path: str | os.PathLike, key: str = "model.offload_dir") -> Path:
    """``path`` as the folder for the weights placed on disk, checked without writing anything: not a file, a
    link to nothing, a pipe or a device; not under a file (no folder could be made there); not a model directory
    nor inside one, nor a results store's own directories. Returns the expanded path."""
    p = Path(str(path)).expanduser()
    kind = path_kind(p)
    if kind or ((p.exists() or p.is_symlink()) and not p.is_dir()):
        raise GacError(f"config: {key}={path} is not a directory ({kind or 'a file'}); {_FIX}")
    for a in p.parents:
        if a.exists() or a.is_symlink():
            if not a.is_dir():
                raise GacError(f"config: {key}={path} lies under {a}, which is {path_kind(a) or 'a file'}, so no "
                               f"folder can be made there; {_FIX}")
            break
    owned = owned_directory(p, itself=True)
    if owned:
        raise GacError(f"config: {key}={path} {owned}; the weights placed on disk would be written there; {_FIX}")
    return p


class OffloadFolder:
    """The folder of its own a placed model writes its disk units to, made at once inside ``parent`` (checked by
    :func:`check_offload_dir`; made if missing): a folder that cannot be made or written is refused here, before the
    model loads. :meth:`save` creates each file; :meth:`remove` removes the folder and what is left in it."""

    def __init__(self, parent: str | os.PathLike, key: str = "model.offload_dir"):
        p = check_offload_dir(parent, key)
        try:
            p.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=p))
        except OSError as e:
            raise os_error(e, f"make a folder for the weights placed on disk ({key}) in", p) from None
        self.written = 0  # bytes of the unit files written, for the line that says where they went

    def save(self, name: str, state: dict) -> Path:
        """``state`` (tensors) saved by torch to a new file ``name`` in the folder: created exclusively (an entry
        of that name, a link or a pipe included, is never opened), removed again if the write fails."""
        import torch

        path = self.path / name
        try:
            fd = create_new(path, 0o600)
        except OSError as e:
            raise os_error(e, "create the file for weights placed on disk", path) from None
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
        except OSError as e:
            path.unlink(missing_ok=True)
            raise os_error(e, "write the weights placed on disk to", path) from None
        self.written += path.stat().st_size
        return path

    def load_mapped(self, path: Path) -> dict:
        """The tensors of ``path`` (written by :meth:`save`) memory-mapped copy-on-write; the file is then unlinked:
        the mapping keeps its data, and its space returns when the tensors are freed."""
        import torch

        mapped = torch.load(path, mmap=True, weights_only=True)
        with contextlib.suppress(OSError):  # a system that cannot unlink a mapped file: removed with the folder
            path.unlink()
        return mapped

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def offload(module, folder: OffloadFolder, name: str) -> None:
    """``module``'s parameters and buffers written to ``folder`` as ``name.pt`` and read back memory-mapped,
    copy-on-write: the module keeps its tensors (same names, dtypes, ``requires_grad``), now backed by the file
    instead of memory. ``module._gac_offload`` (an :class:`Offloaded`) casts them through a file too."""
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    path = folder.save(f"{name}.pt", state)
    del state
    module.load_state_dict(folder.load_mapped(path), assign=True)
    module._gac_offload = Offloaded(module, folder, name)


class Offloaded:
    """A unit whose weights are memory-mapped from a file of ``folder`` (:func:`offload`), and how to change their
    dtype without reading them into host memory: the gradient pass runs a float16 model in bfloat16
    (:func:`gac.compression.gradients.collect_gradient_stats`), and an ordinary ``p.data.to(dtype)`` would turn
    every weight on disk into host memory (131 GiB for Llama-3-70B)."""

    def __init__(self, module, folder: OffloadFolder, name: str):
        self.module, self.folder, self.name = module, folder, name

    def cast(self, src, dst):
        """The unit's ``src`` parameters and buffers cast to ``dst`` and written to a file of the folder, then
        memory-mapped from it in their place (the same Parameter objects, so hooks and references hold); one unit
        at a time passes through host memory. Returns the function that puts the originals back."""
        from gac.dtypes import dtype_str

        owners = {}  # state-dict name -> (module, attribute, is a parameter)
        for mname, m in self.module.named_modules():
            for k, t in list(m._parameters.items()) + list(m._buffers.items()):
                if t is not None and t.dtype == src:
                    owners[f"{mname}.{k}" if mname else k] = (m, k, k in m._parameters)
        if not owners:
            return lambda: None
        state = {}
        for name, (m, k, is_param) in owners.items():
            t = m._parameters[k] if is_param else m._buffers[k]
            state[name] = t.detach().to(dst)
        path = self.folder.save(f"{self.name}.{dtype_str(dst)}.pt", state)
        del state
        mapped = self.folder.load_mapped(path)
        saved = []
        for name, (m, k, is_param) in owners.items():
            if is_param:
                p = m._parameters[k]
                saved.append((p, None, None, p.data))
                p.data = mapped[name]
            else:
                saved.append((None, m, k, m._buffers[k]))
                m._buffers[k] = mapped[name]
        del mapped

        def restore():
            while saved:
                p, m, k, orig = saved.pop()
                if p is not None:
                    p.data = orig
                else:
                    m._buffers[k] = orig

        return restore


__all__ = ["PREFIX", "OffloadFolder", "Offloaded", "check_offload_dir", "offload"]
