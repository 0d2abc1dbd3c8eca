"""A job's key: a stable hash of its resolved config, with the settings that do not change the result left out and
floats taken to :data:`FLOAT_DIGITS` significant digits (values equal up to float drift are one point)."""

from __future__ import annotations

import json
import math

from gac.hashing import digest

NON_SEMANTIC_KEYS = frozenset({"results_dir", "force", "on_busy", "logger", "launcher", "hydra", "wandb", "slurm", "work_dir"})


FLOAT_DIGITS = 12  # significant digits of a float in a key: float drift (0.30000000000000004) is not a new point


def canonical_number(x):
    """``x`` as a key sees it: a float rounded to :data:`FLOAT_DIGITS` significant digits, so that values equal up to
    float drift (``0.1 + 0.2`` and ``0.3``, what Hydra's ``range(0.1, 0.5, 0.1)`` gives) are one point, and an
    integral float as an int. A float that is already short (``0.15``, ``1e-05``: at most 12 digits) is returned
    unchanged, so every key made before this rule keeps its value. Anything else is returned as it is."""
    if isinstance(x, float) and math.isfinite(x):
        x = float(f"{x:.{FLOAT_DIGITS}g}")
        if x.is_integer() and abs(x) < 2**53:
            return int(x)
    return x


def _canonical(obj):
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    return canonical_number(obj)


def config_key(config: dict, ignore: frozenset[str] = NON_SEMANTIC_KEYS) -> str:
    """A stable 16-hex-digit key of a resolved config (top-level non-semantic keys ignored)."""
    payload = {k: v for k, v in config.items() if k not in ignore}
    return digest(json.dumps(_canonical(payload), sort_keys=True, separators=(",", ":"), default=str))
