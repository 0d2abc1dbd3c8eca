"""One call that profiles a device and writes everything: :func:`profile_device` (behind ``experiments/profile_device.py``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from gac.errors import GacError
from gac.io import write_text_atomic
from gac.profiling.cliffs import DEFAULT_HORIZON, DEFAULT_TOLERANCE, sdpa_backend_table, summarize, tier_table
from gac.profiling.device import resolve_device
from gac.profiling.figures import save_figures, summary_markdown
from gac.profiling.profile import HardwareProfile
from gac.profiling.sweeps import SweepPlan, run_sweeps
from gac.profiling.timing import TimingProtocol

log = logging.getLogger(__name__)


def profile_device(
    out_dir: str | Path,
    device: str | torch.device = "auto",
    dtype: str = "auto",
    quick: bool = False,
    sweeps: Sequence[str] | None = None,
    plan_overrides: dict | None = None,
    protocol_overrides: dict | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    horizon: int | None = DEFAULT_HORIZON,
    figures: bool = True,
    table_format: str = "parquet",
    num_threads: int | None = None,
) -> HardwareProfile:
    """Run the sweeps, save the profile to ``out_dir`` and write its cliff analysis and figures beside it.

    ``quick`` picks small shapes and a short protocol (seconds on a CPU); otherwise the paper's sizes and
    protocol. ``plan_overrides``/``protocol_overrides`` replace single fields of :class:`SweepPlan` /
    :class:`TimingProtocol` (None values are ignored). ``num_threads`` sets torch's CPU threads for the run
    (None: 1 for a quick CPU run, where shared cores make OpenMP spin-waits dominate; else unchanged); the count
    used is recorded in the profile's metadata.
    """
    dev = resolve_device(device)
    plan = SweepPlan.quick() if quick else SweepPlan.paper()
    protocol = TimingProtocol.quick() if quick else TimingProtocol.paper()
    over = {
        k: (tuple(v) if isinstance(v, list) else v)
        for k, v in (plan_overrides or {}).items()
        if v is not None
    }
    if sweeps is not None:
        over["sweeps"] = tuple(sweeps)
    try:
        plan = replace(plan, **over)
        protocol = replace(protocol, **{k: v for k, v in (protocol_overrides or {}).items() if v is not None})
    except TypeError as e:
        raise GacError(f"unknown sweep or protocol setting: {e}") from None
    if num_threads is None and quick and dev.type == "cpu":
        num_threads = 1
    before = torch.get_num_threads()
    if num_threads is not None:
        from gac.checks import check_threads

        torch.set_num_threads(check_threads(num_threads, "threads"))
    try:
        profile = run_sweeps(dev, dtype, plan, protocol)
    finally:
        torch.set_num_threads(before)
    profile.meta["quick"] = bool(quick)
    out = profile.save(out_dir, fmt=table_format)
    write_analysis(profile, out, tolerance, horizon)
    if figures:
        save_figures(profile, out / "figures")
    return profile


def write_analysis(
    profile: HardwareProfile,
    out_dir: str | Path,
    tolerance: float = DEFAULT_TOLERANCE,
    horizon: int | None = DEFAULT_HORIZON,
) -> dict:
    """Write ``cliffs.csv`` (Table 4-like), ``tiers.csv`` (Table 3-like), ``sdpa_backends.csv`` and ``summary.md``."""
    out = Path(out_dir)
    tables = {
        "Alignment constraints (Table 4)": summarize(profile.table, tolerance, horizon),
        "GEMM kernel tiers (Table 3)": tier_table(profile.table),
        "SDPA backends": sdpa_backend_table(profile.table),
    }
    for (_, df), name in zip(tables.items(), ("cliffs.csv", "tiers.csv", "sdpa_backends.csv"), strict=True):
        write_text_atomic(out / name, df.to_csv(index=False), overwrite=True)
    header = f"# Hardware profile\n\n```\n{profile.describe()}\n```\n\ntolerance {tolerance}, horizon {horizon}\n\n"
    write_text_atomic(out / "summary.md", header + summary_markdown(tables), overwrite=True)
    log.info("cliff summary:\n%s", tables["Alignment constraints (Table 4)"].to_string(index=False))
    return tables
