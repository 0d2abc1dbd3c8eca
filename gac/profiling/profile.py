"""HardwareProfile: measured kernel latencies by (sweep, shape, dim) on one device and software stack.

On disk a profile is a directory::

    profile.json    format name + version, metadata (device, compute capability, driver, CUDA, torch, dtype,
                    timing protocol, sweep plan, date), the table's file name, row count and SHA-256
    table.parquet   the tidy table, one row per (sweep, dim, backend) (``table.csv`` when saved as CSV)

:meth:`HardwareProfile.load` checks all of this and raises :class:`gac.errors.GacError` naming the problem
(missing file, unreadable JSON, unknown format version, checksum mismatch, missing columns).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gac.errors import GacError
from gac.hashing import file_sha256
from gac.io import file_problem, replace_file, write_text_atomic

log = logging.getLogger(__name__)

FORMAT = "gac-hardware-profile"
FORMAT_VERSION = 1
META_FILE = "profile.json"

#: the table's columns and their pandas dtypes
SCHEMA: dict[str, str] = {
    "sweep": "string",  # sdpa_head_dim, gemm_M, gemm_N, gemm_K, gemm_tput_K, gemm_tput_N, gemv_K, gemv_N, target
    "op": "string",  # sdpa | gemm | gemv | lowrank | width | head_dim
    "axis": "string",  # the swept axis: head_dim, M, N, K (d for target rows)
    "dim": "Int64",  # the swept value
    "M": "Int64",
    "N": "Int64",
    "K": "Int64",
    "batch": "Int64",
    "seq_len": "Int64",
    "heads": "Int64",
    "head_dim": "Int64",
    "dtype": "string",
    "backend": "string",  # auto (PyTorch's choice) or a forced SDPA backend
    "selected_backend": "string",  # the SDPA backend that ran
    "supported": "boolean",  # False: the forced backend rejected the shape
    "latency_ms": "float64",  # median over trials of the per-iteration mean
    "latency_min_ms": "float64",
    "latency_max_ms": "float64",
    "tflops": "float64",
    "kernel": "string",  # longest kernel (CUDA) or leaf ATen op (CPU); "" if not captured
    "tier": "string",  # kernel tier (native, fallback, align2, align1, gemv, cpu...) or SDPA backend
    "context": "string",  # target kernel context (target rows), "" for sweeps
}
COLUMNS = tuple(SCHEMA)


def empty_table() -> pd.DataFrame:
    return _typed(pd.DataFrame({c: [] for c in COLUMNS}))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    out = df.loc[:, list(COLUMNS)].copy()
    for col, dt in SCHEMA.items():
        if dt == "string":
            out[col] = out[col].astype("object").where(out[col].notna(), "").astype(str).astype("string")
        elif dt == "boolean":
            out[col] = out[col].astype("boolean")
        elif dt == "Int64":
            out[col] = pd.to_numeric(out[col], errors="raise").astype("Int64")
        else:
            out[col] = pd.to_numeric(out[col], errors="raise").astype(dt)
    return out.reset_index(drop=True)


#: a sweep whose name holds this is a curve as drawn in a figure (median-filtered), not measurements: kept for reading,
#: never analysed for cliffs, drawn or used by the candidate filter (the published profiles' ``gemm_*_filtered``)
DERIVED_MARK = "_filtered"


def is_derived_sweep(name: str) -> bool:
    return DERIVED_MARK in str(name)


def normalize_device_name(name: str | None) -> str:
    return re.sub(r"\s+", " ", str(name or "")).strip().lower()


class HardwareProfile:
    """A tidy table of kernel latencies plus the metadata of the platform that produced it."""

    def __init__(self, table: pd.DataFrame, meta: dict):
        missing = [c for c in COLUMNS if c not in table.columns]
        if missing:
            raise GacError(f"hardware profile table lacks columns {missing}; expected {list(COLUMNS)}")
        if not meta.get("device_name"):
            raise GacError(
                "hardware profile metadata lacks 'device_name'; a profile must say which device it measured"
            )
        self.table = _typed(table)
        self.meta = dict(meta)
        self.meta.setdefault("format", FORMAT)
        self.meta.setdefault("format_version", FORMAT_VERSION)

    # ------------------------------------------------------------------ identity
    @property
    def device_name(self) -> str:
        return str(self.meta["device_name"])

    @property
    def device_type(self) -> str:
        return str(self.meta.get("device_type", "cuda"))

    @property
    def dtype(self) -> str | None:
        return self.meta.get("dtype")

    def sweeps(self) -> list[str]:
        return sorted(self.table["sweep"].unique().tolist())

    def sweep(self, name: str, backend: str = "auto") -> pd.DataFrame:
        """Rows of one sweep (``backend="auto"``: PyTorch's own choice; None: all backends)."""
        t = self.table[self.table["sweep"] == name]
        if backend is not None:
            t = t[t["backend"] == backend]
        return t.sort_values("dim").reset_index(drop=True)

    def contexts(self) -> list[str]:
        return sorted(c for c in self.table["context"].unique().tolist() if c)

    def matches_device(self, device) -> bool:
        """Does this profile describe ``device`` (a name, a ``torch.device`` or a device-info dict)?"""
        return normalize_device_name(self.device_name) == normalize_device_name(_name_of(device))

    def check_device(self, device, allow_mismatch: bool = False) -> None:
        """Refuse a profile measured on another device unless ``allow_mismatch``."""
        want = _name_of(device)
        if self.matches_device(want):
            return
        msg = (
            f"hardware profile was measured on {self.device_name!r} but the job runs on {want!r}; its cliffs need "
            f"not hold there. Measure a profile on this device (python experiments/profile_device.py device=cuda "
            f"out_dir=...), or allow the mismatch to use it anyway (a job: gpu.allow_profile_mismatch=true; Python: "
            f"allow_device_mismatch=True)"
        )
        if not allow_mismatch:
            raise GacError(msg)
        log.warning("using a profile from another device: %s", msg.split(";")[0])

    def describe(self) -> str:
        m = self.meta
        parts = [
            f"device: {m.get('device_name')} ({m.get('device_type')}, cc {m.get('compute_capability')})",
            f"stack: torch {m.get('torch')}, CUDA {m.get('cuda')}, driver {m.get('driver')}, cuDNN {m.get('cudnn')}",
            f"dtype: {m.get('dtype')}; protocol: {m.get('protocol')}; date: {m.get('date')}",
            f"format: {m.get('format')} v{m.get('format_version')}; {len(self.table)} rows",
        ]
        for name in self.sweeps():
            t = self.sweep(name, backend=None)
            auto = t[t["backend"] == "auto"]
            parts.append(
                f"  {name:<14} {len(auto):>5} dims {int(auto['dim'].min()) if len(auto) else '-'}.."
                f"{int(auto['dim'].max()) if len(auto) else '-'}, latency {auto['latency_ms'].min():.4g}.."
                f"{auto['latency_ms'].max():.4g} ms" + (" (a median-filtered curve as drawn: not measurements)"
                                                         if is_derived_sweep(name) else "")
            )
        return "\n".join(parts)

    # ------------------------------------------------------------------ combining, comparing
    def merged(self, other: HardwareProfile, allow_mismatch: bool = False) -> HardwareProfile:
        """This profile's rows plus ``other``'s (same device); other's rows win where (sweep, context, dim, backend) repeat."""
        other.check_device(self.device_name, allow_mismatch)
        key = ["sweep", "context", "dim", "backend"]
        table = pd.concat([self.table, other.table], ignore_index=True).drop_duplicates(key, keep="last")
        return HardwareProfile(
            table, dict(self.meta, merged_from=[self.meta.get("date"), other.meta.get("date")])
        )

    def __eq__(self, other) -> bool:
        if not isinstance(other, HardwareProfile):
            return NotImplemented
        return self.meta == other.meta and self.table.equals(other.table)

    def __repr__(self) -> str:
        return f"HardwareProfile({self.device_name!r}, dtype={self.dtype}, rows={len(self.table)}, sweeps={self.sweeps()})"

    # ------------------------------------------------------------------ disk
    def save(self, path: str | os.PathLike, fmt: str = "parquet") -> Path:
        """Write ``profile.json`` and ``table.parquet`` (or ``table.csv``) into directory ``path``."""
        if fmt not in ("parquet", "csv"):
            raise GacError(f"profile table format must be 'parquet' or 'csv', got {fmt!r}")
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        table_file = out / f"table.{fmt}"
        # each file through a temp file of its own writer: two jobs caching one profile cannot mix their files
        if fmt == "parquet":
            replace_file(table_file, lambda tmp: self.table.to_parquet(tmp, index=False))
        else:
            replace_file(table_file, lambda tmp: self.table.to_csv(tmp, index=False))
        meta = dict(
            self.meta,
            format=FORMAT,
            format_version=FORMAT_VERSION,
            table_file=table_file.name,
            table_sha256=file_sha256(table_file),
            rows=len(self.table),
            columns=list(COLUMNS),
        )
        text = json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n"
        write_text_atomic(out / META_FILE, text, overwrite=True)
        self.meta = {k: v for k, v in meta.items() if k not in _FILE_KEYS}
        log.info("saved hardware profile (%d rows, %s) to %s", len(self.table), self.device_name, out)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> HardwareProfile:
        """Read a profile directory (or its ``profile.json``), checking format, version, checksum and columns."""
        p = Path(path)
        meta_file = p if p.name == META_FILE else p / META_FILE
        why = file_problem(meta_file)
        if why:
            raise GacError(
                f"no hardware profile at {str(path)!r}: {meta_file} {why}; give the directory "
                f"that python experiments/profile_device.py wrote (it holds {META_FILE} and table.parquet)"
            )
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise GacError(
                f"corrupt hardware profile {meta_file}: cannot parse its JSON ({e}); re-measure it"
            ) from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise GacError(
                f"{meta_file} is not a gac hardware profile (format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                f"expected {FORMAT!r})"
            )
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise GacError(
                f"hardware profile {meta_file} has format version {version!r}; this gac reads version "
                f"{FORMAT_VERSION}. Re-measure it with this gac version"
            )
        table_file = meta_file.parent / str(meta.get("table_file", ""))
        if not meta.get("table_file") or not table_file.is_file():
            raise GacError(
                f"corrupt hardware profile {meta_file.parent}: table file {table_file.name!r} is missing"
            )
        digest = file_sha256(table_file)
        if meta.get("table_sha256") and digest != meta["table_sha256"]:
            raise GacError(
                f"corrupt hardware profile {meta_file.parent}: {table_file.name} does not match the checksum "
                f"in {META_FILE} (truncated or edited); re-measure or restore it"
            )
        try:
            if table_file.suffix == ".parquet":
                table = pd.read_parquet(table_file)
            else:
                table = pd.read_csv(
                    table_file,
                    keep_default_na=False,
                    na_values={c: [""] for c, t in SCHEMA.items() if t != "string"},
                )
        except Exception as e:  # pyarrow/pandas raise many types for a bad file
            raise GacError(
                f"corrupt hardware profile {meta_file.parent}: cannot read {table_file.name} ({e})"
            ) from None
        missing = [c for c in COLUMNS if c not in table.columns]
        if missing:
            raise GacError(f"corrupt hardware profile {meta_file.parent}: table lacks columns {missing}")
        for c in ("latency_ms", "latency_min_ms", "latency_max_ms", "tflops"):
            v = pd.to_numeric(table[c], errors="coerce")
            bad = v.notna() & ~(np.isfinite(v) & ((v > 0) if c != "tflops" else (v >= 0)))
            if bad.any():
                i = int(bad.to_numpy().nonzero()[0][0])
                raise GacError(f"corrupt hardware profile {meta_file.parent}: {c} = {float(v.iloc[i])!r} in row {i + 1} of "
                               f"{table_file.name}; a measured value is a finite, positive number: re-measure it")
        if "rows" in meta and meta["rows"] != len(table):
            raise GacError(
                f"corrupt hardware profile {meta_file.parent}: {len(table)} rows, metadata says {meta['rows']}"
            )
        try:
            return cls(table, {k: v for k, v in meta.items() if k not in _FILE_KEYS})
        except (ValueError, TypeError) as e:
            raise GacError(
                f"corrupt hardware profile {meta_file.parent}: bad values in the table ({e})"
            ) from None


_FILE_KEYS = ("table_file", "table_sha256", "rows", "columns")



def _name_of(device) -> str:
    if isinstance(device, HardwareProfile):
        return device.device_name
    if isinstance(device, dict):
        return str(device.get("device_name"))
    if isinstance(device, torch.device) or (
        isinstance(device, str) and re.fullmatch(r"(cpu|cuda(:\d+)?|auto)", device.strip().lower())
    ):
        from gac.profiling.device import device_name, resolve_device

        return device_name(resolve_device(device))
    return str(device)


def load_profile(
    path: str | os.PathLike, device=None, allow_device_mismatch: bool = False
) -> HardwareProfile:
    """Load a profile; if ``device`` is given, refuse it when measured elsewhere (unless ``allow_device_mismatch``)."""
    prof = HardwareProfile.load(path)
    if device is not None:
        prof.check_device(device, allow_device_mismatch)
    return prof
