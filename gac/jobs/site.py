"""A Slurm launcher's site settings checked against what the cluster says, before anything is submitted.

A setting the site does not have (a partition, a node feature in ``constraint``, more GPUs, memory, CPUs or time
than its nodes and partition allow, an account or QOS it does not know) makes ``sbatch`` reject the whole array, or
leaves it pending for ever (a time limit above the partition's). :func:`check_site` names the first such setting in
one line, from one ``sinfo`` call (and ``sacctmgr`` for the account and QOS, where the site has accounting).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gac.errors import GacError, unknown_name

# one row per partition and node group: partition (default marked *), features, gres, memory (MB), CPUs, time limit
SINFO_FORMAT = "%P|%f|%G|%m|%c|%l"
WHERE = "(conf/local/default.yaml or hydra.launcher.KEY=... on the command line)"


@dataclass
class NodeGroup:
    """One ``sinfo`` row: a group of alike nodes of one partition (None: the field was not reported)."""

    partition: str
    default: bool = False
    features: frozenset[str] | None = None
    gpus: dict[str, int] | None = None  # GPU type ("" when untyped) -> GPUs per node
    mem_mb: int | None = None
    cpus: int | None = None
    time_min: float | None = None  # the partition's time limit in minutes (inf: none)


def parse_sinfo(text: str) -> list[NodeGroup]:
    """``sinfo -h -o SINFO_FORMAT``'s rows; fields missing from a row (an older sinfo, a terse fake) stay None."""
    groups = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split("|")]
        if not f or not f[0]:
            continue
        g = NodeGroup(partition=f[0].rstrip("*"), default=f[0].endswith("*"))
        if len(f) > 1:
            g.features = frozenset(x for x in f[1].split(",") if x and x != "(null)")
        if len(f) > 2:
            g.gpus = parse_gres(f[2])
        if len(f) > 3:
            g.mem_mb = _int(f[3])
        if len(f) > 4:
            g.cpus = _int(f[4])
        if len(f) > 5:
            g.time_min = slurm_minutes(f[5])
        groups.append(g)
    return groups


def parse_gres(gres: str) -> dict[str, int]:
    """GPUs per node by type from a gres string: ``gpu:a100:4(S:0-1),shard:8`` -> ``{"a100": 4}``, ``gpu:2`` ->
    ``{"": 2}``, ``(null)`` -> ``{}``."""
    out: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        kind, count = (parts[1], parts[2]) if len(parts) > 2 else ("", parts[1])
        n = _int(count)
        if n is not None:
            out[kind] = max(out.get(kind, 0), n)
    return out


def slurm_minutes(limit: str) -> float | None:
    """A Slurm time (``infinite``, ``30``, ``4:00:00``, ``2-00:00:00``, ``1-12``) in minutes; None: unreadable."""
    s = limit.strip().lower()
    if s in ("infinite", "unlimited"):
        return float("inf")
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", s)
    if not m:
        return None
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:  # days-hours[:minutes[:seconds]]
        return days * 1440 + a * 60 + (b or 0) + (c or 0) / 60
    if c is not None:  # hours:minutes:seconds
        return a * 60 + b + c / 60
    if b is not None:  # minutes:seconds
        return a + b / 60
    return float(a)  # minutes


def _int(s: str) -> int | None:
    m = re.match(r"\d+", s.strip())
    return int(m.group()) if m else None


def _requested_gpus(launcher: Mapping) -> tuple[str, int]:
    """The GPU type ("" for any) and count per node the launcher asks for (gpus_per_node, or gres=gpu[:type]:N)."""
    kind, n = "", int(launcher.get("gpus_per_node") or 0)
    gres = launcher.get("gres")
    if gres:
        got = parse_gres(str(gres))
        if got:
            kind, n = next(iter(got.items()))
    return kind, n


def constraint_features(constraint: str) -> tuple[list[str], bool]:
    """The node features a ``--constraint`` expression names, and whether any one of them is enough (``a|b``)."""
    names = [re.sub(r"\*\d+$", "", t).strip() for t in re.split(r"[&|,\[\]()!]+", constraint)]
    return [n for n in names if n], "|" in constraint


def check_site(launcher: Mapping, groups: Sequence[NodeGroup], sacctmgr: str | None = None, user: str | None = None
               ) -> None:
    """Every site setting of ``launcher`` (hydra.launcher) against the cluster's ``groups`` (:func:`sinfo_groups`):
    the partition exists; its nodes have the constraint's features, the GPUs (gpus_per_node / gres), mem_gb and
    cpus_per_task asked for; timeout_min is within its time limit; account and qos are known to the accounting
    (``sacctmgr``, when given). A :class:`GacError` naming the first setting that is not."""
    partition = launcher.get("partition")
    if not groups:
        return
    if partition:
        rows = [g for g in groups if g.partition == str(partition)]
        if not rows:
            raise unknown_name("Slurm partition (hydra.launcher.partition=...)", str(partition),
                               {g.partition for g in groups})
        where = f"partition {partition!r}"
    else:
        rows = [g for g in groups if g.default] or list(groups)
        where = f"the default partition ({rows[0].partition!r})" if rows[0].default else "the cluster"
    constraint = launcher.get("constraint")
    known = [g.features for g in rows if g.features is not None]
    if constraint and known:
        have = frozenset().union(*known)
        names, any_one = constraint_features(str(constraint))
        missing = [n for n in names if n not in have]
        if missing and (not any_one or len(missing) == len(names)):
            raise GacError(f"Slurm site setting hydra.launcher.constraint={constraint}: no node of {where} has the "
                           f"feature {missing[0]!r} (features there: {', '.join(sorted(have)) or 'none'}); set "
                           f"constraint to null or to one of those {WHERE}")
    kind, n = _requested_gpus(launcher)
    gres = [g.gpus for g in rows if g.gpus is not None]
    if n > 0 and gres:
        counts = [c for gp in gres for k, c in gp.items() if not kind or k == kind]
        if not counts:
            asked = f"gpu:{kind}" if kind else "GPUs"
            types = sorted({k for gp in gres for k in gp if k})
            raise GacError(f"Slurm site setting hydra.launcher.{'gres' if kind else 'gpus_per_node'}: no node of "
                           f"{where} has {asked}" + (f" (GPU types there: {', '.join(types)})" if types else
                                                     " (no GPU gres)")
                           + f"; choose a GPU partition (hydra.launcher.partition=...) {WHERE}")
        if max(counts) < n:
            raise GacError(f"Slurm site setting hydra.launcher.gpus_per_node={n}: the nodes of {where} have at most "
                           f"{max(counts)} GPU(s); ask for at most {max(counts)} {WHERE}")
    mem = [g.mem_mb for g in rows if g.mem_mb is not None]
    mem_gb = launcher.get("mem_gb")
    if mem_gb and mem and float(mem_gb) * 1024 > max(mem):
        raise GacError(f"Slurm site setting hydra.launcher.mem_gb={mem_gb}: the nodes of {where} have at most "
                       f"{max(mem) // 1024} GB ({max(mem)} MB); ask for at most {max(mem) // 1024} {WHERE}")
    cpus = [g.cpus for g in rows if g.cpus is not None]
    want = int(launcher.get("cpus_per_task") or 0) * int(launcher.get("tasks_per_node") or 1)
    if want and cpus and want > max(cpus):
        raise GacError(f"Slurm site setting hydra.launcher.cpus_per_task={launcher.get('cpus_per_task')}: the nodes "
                       f"of {where} have at most {max(cpus)} CPUs; ask for at most {max(cpus)} {WHERE}")
    limits = [g.time_min for g in rows if g.time_min is not None]
    timeout = launcher.get("timeout_min")
    if timeout and limits and float(timeout) > max(limits):
        raise GacError(f"Slurm site setting hydra.launcher.timeout_min={timeout}: the time limit of {where} is "
                       f"{max(limits):g} minutes (a longer job would wait for ever); ask for at most {max(limits):g} "
                       f"{WHERE}")
    if sacctmgr:
        _check_accounting(launcher, sacctmgr, user)


def _sacctmgr(sacctmgr: str, args: list[str]) -> list[str] | None:
    try:
        r = subprocess.run([sacctmgr, "-n", "-P", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.returncode == 0 else None


def _check_accounting(launcher: Mapping, sacctmgr: str, user: str | None) -> None:
    """account: one of the user's associations; qos: one the accounting knows. A site without accounting (sacctmgr
    fails or lists nothing) is left to sbatch."""
    account, qos = launcher.get("account"), launcher.get("qos")
    if account:
        args = ["show", "assoc"] + (["where", f"user={user}"] if user else []) + ["format=account"]
        accounts = _sacctmgr(sacctmgr, args)
        if accounts and str(account) not in accounts:
            raise unknown_name(f"Slurm account{f' of user {user}' if user else ''} (hydra.launcher.account=...)",
                               str(account), set(accounts))
    if qos:
        names = _sacctmgr(sacctmgr, ["show", "qos", "format=name"])
        if names and str(qos) not in names:
            raise unknown_name("Slurm QOS (hydra.launcher.qos=...)", str(qos), set(names))


def check_slurm_site(launcher: Mapping, groups: Sequence[NodeGroup]) -> None:
    """:func:`check_site` with ``sinfo``'s ``groups`` and this cluster's ``sacctmgr`` (skipped where it is not
    installed)."""
    import getpass

    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = None
    check_site(launcher, groups, shutil.which("sacctmgr"), user)
