"""The GPU profiles gac ships from published data: the GAC authors' A100 and H100 measurements.

The authors measured on an A100-80GB and an H100-80GB (PyTorch 2.9.1, CUDA 12.8, fp16) but committed only their
figures; :mod:`tools.extract_published` reads the points back from the figures' vector paths into two
:class:`~gac.profiling.profile.HardwareProfile` directories under ``gac/data/profiles/published/<gpu>``. Their
``profile.json`` says where every number comes from (``meta["published"]``: repository, commit, files, extraction
method and checks, stated conditions, what is unknown). They are hypotheses about *your* A100/H100 (another driver,
clocks, PyTorch), better than none: a job on such a GPU uses one only when no profile measured on its node exists,
and its record says which (``profile.published``).
"""

from __future__ import annotations

from pathlib import Path

from gac.errors import GacError, unknown_name
from gac.profiling.profile import HardwareProfile

PUBLISHED_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles" / "published"
#: gpu name (``conf/gpu/<name>.yaml``'s ``name``) -> published profile directory name
PUBLISHED_GPUS = ("a100", "h100")


def published_dir(gpu: str) -> Path:
    g = str(gpu).strip().lower()
    if g not in PUBLISHED_GPUS:
        raise unknown_name("GPU with published kernel data", str(gpu), PUBLISHED_GPUS)
    path = PUBLISHED_DIR / g
    if not (path / "profile.json").is_file():
        raise GacError(f"the published {g} profile is missing from this installation ({path}); reinstall gac or "
                       f"regenerate it from a gac checkout with python -m tools.extract_published GAC_CHECKOUT")
    return path


def published_profile(gpu: str) -> HardwareProfile:
    """The published profile of ``gpu`` (``a100`` or ``h100``)."""
    return HardwareProfile.load(published_dir(gpu))


def provenance(profile: HardwareProfile) -> dict:
    """What a job record keeps about a published profile it used (source, commit, what is unknown)."""
    pub = profile.meta.get("published") or {}
    src = pub.get("source") or {}
    return {"gpu": profile.meta.get("gpu"), "device_name": profile.device_name, "repository": src.get("repository"),
            "commit": src.get("commit"), "extraction": (pub.get("extraction") or {}).get("tool"),
            "unknown": pub.get("unknown")}
