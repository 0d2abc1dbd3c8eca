"""The numbers a user hands gac that the libraries under it take on trust, one checker per kind, used by every
command, config and environment variable that takes one: a seed (numpy refuses a negative one, torch one past
2**64, both with a traceback), a thread count (``torch.set_num_threads(100000)`` crashes the process with no
message) and a number read from the environment (a typo there would otherwise fail at import, or be ignored).
Each raises :class:`~gac.errors.GacError` naming the value, where it came from and the range."""

from __future__ import annotations

import math
import os

from gac import hub
from gac.errors import GacError

#: the seeds every generator gac uses accepts (numpy's legacy ``RandomState`` takes no more than 32 bits)
SEED_MAX = 2**32 - 1


def _whole(value) -> int | None:
    """``value`` as an int when it is a whole number (an int, an integral float, or such a string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        f = float(str(value).strip()) if not isinstance(value, float) else value
    except ValueError:
        return None
    if not math.isfinite(f) or f != int(f):
        return None
    try:
        return int(str(value).strip()) if isinstance(value, str) else int(f)
    except ValueError:
        return int(f)


def _named(name: str, value) -> str:
    return f"{name} {value}" if name else str(value)


def check_seed(value, name: str = "seed") -> int:
    """A seed: a whole number in [0, :data:`SEED_MAX`]."""
    v = _whole(value)
    if v is None or not 0 <= v <= SEED_MAX:
        raise GacError(f"{_named(name, value)} is not a seed: give a whole number from 0 to {SEED_MAX} (the range "
                       f"numpy, torch and Python's random all accept)")
    return v


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a Slurm allocation or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(value, name: str = "threads") -> int:
    """A number of CPU threads: a whole number from 1 to the CPUs this process may use."""
    v = _whole(value)
    n = available_cpus()
    if v is None or v < 1:
        raise GacError(f"{_named(name, value)} is not a number of threads: give a whole number from 1 to {n} (the "
                       f"CPUs this process may use)")
    if v > n:
        raise GacError(f"{_named(name, value)} is more threads than the {n} CPU(s) this process may use (more "
                       f"would crash torch, or slow it down); give 1 to {n}")
    return v


#: the numbers gac reads from the environment: name -> (default, unit, zero allowed, what it sets)
ENV_NUMBERS = {
    "GAC_LOCK_HEARTBEAT_S": (30.0, "seconds", False, "how often a job's lock says it is alive"),
    "GAC_LOCK_STALE_S": (300.0, "seconds", False, "how long a silent lock counts as held"),
    "GAC_TEMP_STALE_S": (6 * 3600.0, "seconds", False, "the age at which a temp file has no live writer"),
    "GAC_PROGRESS_INTERVAL": (10.0, "seconds", True, "the time between two progress lines off a terminal"),
    "GAC_SOLVER_MAX_MB": (1024.0, "MiB", False, "the exact solver's memory limit"),
}


def env_number(var: str) -> float:
    """The number in environment variable ``var`` (one of :data:`ENV_NUMBERS`; its default when unset or empty):
    finite and positive (or zero where that has a meaning), else one line naming the variable."""
    default, unit, zero, what = ENV_NUMBERS[var]
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        sign = "non-negative" if zero else "positive"
        raise GacError(f"{var}={raw!r} must be a {sign} number of {unit} ({what}); set one, e.g. "
                       f"{var}={default:g} (the default), or unset it")
    return v


def check_environment() -> None:
    """Every number of :data:`ENV_NUMBERS` set in the environment is one, and the Hugging Face token one line:
    checked when a command or job starts, not when the value is first read in the middle of the work."""
    for var in ENV_NUMBERS:
        env_number(var)
    hub.check_hub_token()


def arg_type(check):
    """``check`` as an argparse ``type=``: its message after argparse's ``argument --X:``."""
    import argparse

    def convert(text: str):
        try:
            return check(text, "")
        except GacError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = check.__name__
    return convert


def check_utf8_args(argv) -> None:
    """Every command-line argument valid UTF-8: a path whose name is not (``mod\\xff``, kept by Python as a surrogate
    escape) cannot go into the JSON records, checkpoint manifests and safetensors headers gac writes (it was
    reported as a truncated safetensors file, or a traceback once the work was done)."""
    for a in argv:
        try:
            a.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(a).decode("utf-8", "backslashreplace")
            raise GacError(f"argument '{shown}' is not valid UTF-8 text; gac records paths in JSON and safetensors "
                           f"headers, which hold UTF-8 only: rename it (or make a link with a UTF-8 name) and give "
                           f"that") from None
