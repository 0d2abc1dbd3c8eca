"""A Slurm launcher's site settings checked against what the cluster says, before anything is submitted.

A setting the site does not have (a partition, a node feature in ``constraint``, more GPUs, memory, CPUs or time
than its nodes and partition allow, an account or QOS it does not know) makes ``sbatch`` reject the whole array, or
leaves it pending for ever (a time limit above the partition's). :func:`check_site` names the first such setting in
one line, from one ``sinfo`` call (and ``sacctmgr`` for the account and QOS, where the site has accounting). The
node-level settings are checked together: one node must have the features, the GPUs, the memory and the CPUs at
once (``constraint=h100`` with ``mem_gb=900`` fails when no H100 node has 900 GB, though some other node has).

On a partition that mixes GPU types, an untyped GPU request may land on any of them; :func:`check_site` resolves the
job's ``gpu=`` (``h100``) to the site's typed GRES (``gpu:h100:1``) or, where the GPUs are untyped, to a node feature
naming it, and refuses a request that names another GPU (:func:`resolve_gpu`). :func:`check_slurm` runs it all from
the launching machine: the Slurm commands exist, ``sinfo`` answers with partitions, every value is in range.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gac.errors import GacError, unknown_name

# one row per partition and node group: partition (default marked *), features, gres, memory (MB), CPUs, time limit
SINFO_FORMAT = "%P|%f|%G|%m|%c|%l"
WHERE = "(conf/local/slurm.yaml, or hydra.launcher.KEY=... on the command line)"


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


_FIELDS = SINFO_FORMAT.count("|") + 1
_PARTITION = re.compile(r"[A-Za-z0-9_.\-]+\*?")


def parse_sinfo(text: str) -> list[NodeGroup]:
    """``sinfo -h -o SINFO_FORMAT``'s rows. Only lines with the format's fields and a partition name count: a site's
    banner or message of the day around them (some sites print one on every command) is not a partition."""
    groups = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) != _FIELDS or not _PARTITION.fullmatch(f[0]):
            continue
        groups.append(NodeGroup(partition=f[0].rstrip("*"), default=f[0].endswith("*"),
                                features=frozenset(x for x in f[1].split(",") if x and x != "(null)"),
                                gpus=parse_gres(f[2]), mem_mb=_mem_mb(f[3]), cpus=_int(f[4]), time_min=slurm_minutes(f[5])))
    return groups


def parse_gres(gres: str) -> dict[str, int]:
    """GPUs per node by type from a gres string: ``gpu:a100:4(S:0-1),shard:8`` -> ``{"a100": 4}``, ``gpu:2`` ->
    ``{"": 2}``, ``(null)`` -> ``{}``."""
    out: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        if len(parts) > 2:
            kind, count = parts[1], parts[2]
        else:  # gpu:N, or gpu:TYPE (one GPU of that type, as sbatch reads it)
            kind, count = ("", parts[1]) if parts[1][:1].isdigit() else (parts[1], "1")
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


_MEM_UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}


def _mem_mb(s: str) -> int | None:
    """sinfo's memory in MB: plain megabytes (``%m``), or with Slurm's unit suffix where a site prints one
    (``1000G``, ``2T``: 1000 GB read as 1000 MB refused every job "at most 0 GB"); ``+`` (nodes vary) is dropped."""
    m = re.match(r"(\d+(?:\.\d+)?)\s*([KMGTP]?)", s.strip().upper())
    return int(float(m[1]) * _MEM_UNITS[m[2]]) if m else None


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


# the launcher's numeric settings: (key, smallest allowed value, what it is)
_NUMBERS = (("nodes", 1, "nodes per job"), ("tasks_per_node", 1, "tasks per node"),
            ("gpus_per_node", 0, "GPUs per node"), ("cpus_per_task", 1, "CPUs per task"), ("mem_gb", 1, "GB of memory"),
            ("timeout_min", 1, "minutes"), ("signal_delay_s", 0, "seconds"), ("max_num_timeout", 0, "requeues"),
            ("array_parallelism", 1, "jobs at once"))


#: set by the launch's environment file to its own path: a job's record (``provenance.launch_env_file``) shows that
#: the job read it (the canary checks it, :mod:`gac.launch.canary`)
ENV_FILE_VAR = "GAC_LAUNCH_ENV_FILE"


def is_env_name(name: str) -> bool:
    """A name a shell can export (ASCII letters, digits and ``_``, not starting with a digit), or such a prefix
    followed by ``*``."""
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", str(name)) is not None


def env_names(names: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """``hydra.launcher.env`` expanded: each name once, a ``PREFIX*`` as the variables of ``environ`` (default: this
    process's) with that prefix, in order; names a shell cannot export are left out (:func:`check_values` refuses
    them first)."""
    import os

    environ = os.environ if environ is None else environ
    out: dict[str, None] = {}
    for n in names:
        n = str(n)
        if not is_env_name(n):
            continue
        if n.endswith("*"):
            out.update(dict.fromkeys(sorted(k for k in environ if k.startswith(n[:-1]) and is_env_name(k))))
        else:
            out[n] = None
    return list(out)


def check_values(launcher: Mapping) -> None:
    """Every numeric launcher setting is a whole number in range (``mem_gb=-4`` or ``timeout_min=0`` would reach
    ``sbatch``, or make every job time out at once), and a job outlives its own timeout signal."""
    for key, low, what in _NUMBERS:
        v = launcher.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < low:
            raise GacError(f"Slurm site setting hydra.launcher.{key}={v}: give a whole number of {what} >= {low} "
                           f"{WHERE}")
    env = launcher.get("env")
    if env is not None:
        names = env if isinstance(env, (list, tuple)) else [env]
        bad = [str(n) for n in names if not isinstance(n, str) or not is_env_name(n)]
        if bad or not isinstance(env, (list, tuple)):
            raise GacError(f"Slurm site setting hydra.launcher.env: {(bad or [str(env)])[0]!r} is not a variable name "
                           f"(ASCII letters, digits and _, not starting with a digit; NAME* for every variable with "
                           f"that prefix); it would be written into every job's environment file {WHERE}")
    timeout, delay = launcher.get("timeout_min"), launcher.get("signal_delay_s")
    if timeout is not None and delay is not None and timeout * 60 <= delay + 60:
        raise GacError(f"Slurm site setting hydra.launcher.timeout_min={timeout}: a job is told to stop "
                       f"signal_delay_s={delay} seconds before its time limit, so it would stop before it starts; give "
                       f"timeout_min above {(delay + 60) // 60 + 1} or a smaller signal_delay_s {WHERE}")
    gres = launcher.get("gres")
    if gres and not parse_gres(str(gres)) and "gpu" in str(gres):
        raise GacError(f"Slurm site setting hydra.launcher.gres={gres}: not a GPU request Slurm reads; write "
                       f"gpu:N or gpu:TYPE:N (e.g. gpu:h100:1) {WHERE}")


def _fits(g: NodeGroup, names: list[str], any_one: bool, kind: str, n: int, mem_mb: float, cpus: int) -> dict:
    """Which node-level requests the group ``g`` meets (a field sinfo did not report meets it)."""
    feats = g.features
    return {
        "constraint": not names or feats is None or (any(x in feats for x in names) if any_one
                                                     else all(x in feats for x in names)),
        "gpus": n <= 0 or g.gpus is None or max([c for k, c in g.gpus.items() if not kind or k == kind] or [0]) >= n,
        "mem": not mem_mb or g.mem_mb is None or g.mem_mb >= mem_mb,
        "cpus": not cpus or g.cpus is None or g.cpus >= cpus,
    }


def check_site(launcher: Mapping, groups: Sequence[NodeGroup], sacctmgr: str | None = None, user: str | None = None,
               gpu: str | None = None) -> dict:
    """Every site setting of ``launcher`` (hydra.launcher) against the cluster's ``groups`` (:func:`parse_sinfo`):
    the partition exists; one node group of it has the constraint's features, the GPUs (gpus_per_node / gres), mem_gb
    and cpus_per_task asked for, all at once; timeout_min is within its time limit; account and qos are known to the
    accounting (``sacctmgr``, when given). ``gpu``: the job's ``gpu=`` (``h100``; None, ``cpu`` or ``auto``: any),
    resolved to the site's GPU types (:func:`resolve_gpu`). Returns the launcher settings to submit with (``launcher``
    with a typed GRES or a constraint added where the GPU needed one); a :class:`GacError` names the first setting that
    cannot be met."""
    check_values(launcher)
    if not groups:
        raise GacError("Slurm's sinfo lists no partition here, so no job could be placed; check SLURM_CONF (it names "
                       "the cluster) and that your account may use a partition (sinfo -a lists the hidden ones)")
    partition = launcher.get("partition")
    if partition:
        rows = [g for g in groups if g.partition == str(partition)]
        if not rows:
            raise unknown_name("Slurm partition (hydra.launcher.partition=...)", str(partition),
                               {g.partition for g in groups})
        where = f"partition {partition!r}"
    else:
        rows = [g for g in groups if g.default] or list(groups)
        where = f"the default partition ({rows[0].partition!r})" if rows[0].default else "the cluster"
    launcher = dict(launcher)
    _check_nodes(launcher, rows, where)
    launcher = resolve_gpu(launcher, rows, where, gpu)
    limits = [g.time_min for g in rows if g.time_min is not None]
    timeout = launcher.get("timeout_min")
    if timeout and limits and float(timeout) > max(limits):
        raise GacError(f"Slurm site setting hydra.launcher.timeout_min={timeout}: the time limit of {where} is "
                       f"{max(limits):g} minutes (a longer job would wait for ever); ask for at most {max(limits):g} "
                       f"{WHERE}")
    if sacctmgr:
        _check_accounting(launcher, sacctmgr, user)
    return launcher


def _check_nodes(launcher: Mapping, rows: Sequence[NodeGroup], where: str) -> list[NodeGroup]:
    """The node groups of ``rows`` that meet every node-level request at once; a :class:`GacError` when none does:
    the request no node meets alone, else the combination no node meets together."""
    constraint = launcher.get("constraint")
    names, any_one = constraint_features(str(constraint)) if constraint else ([], False)
    kind, n = _requested_gpus(launcher)
    mem_mb = float(launcher.get("mem_gb") or 0) * 1024
    cpus = int(launcher.get("cpus_per_task") or 0) * int(launcher.get("tasks_per_node") or 1)
    fits = [(g, _fits(g, names, any_one, kind, n, mem_mb, cpus)) for g in rows]
    ok = [g for g, f in fits if all(f.values())]
    if ok:
        return ok
    for need in ("constraint", "gpus", "mem", "cpus"):
        if not any(f[need] for _, f in fits):
            _alone(need, launcher, rows, where, names, any_one, kind, n)
    # each request is met by some node, but no node meets them all: the first requests that no node meets together,
    # and what the nodes meeting all but the last of them have
    order = [need for need in ("constraint", "gpus", "mem", "cpus") if any(not f[need] for _, f in fits)]
    have, asked = list(fits), []
    for need in order:
        asked.append(need)
        left = [(g, f) for g, f in have if f[need]]
        if not left:
            break
        have = left
    last, nodes = asked[-1], [g for g, _ in have]
    words = {"constraint": f"constraint={constraint}", "gpus": f"gpus_per_node={n}" + (f" of gpu:{kind}" if kind else ""),
             "mem": f"mem_gb={launcher.get('mem_gb')}", "cpus": f"cpus_per_task={launcher.get('cpus_per_task')}"}
    if last == "gpus":
        best = f"{max(max(g.gpus.values() or [0]) for g in nodes if g.gpus is not None)} GPU(s)"
    elif last == "mem":
        best = f"{max(g.mem_mb for g in nodes if g.mem_mb is not None) // 1024} GB"
    elif last == "cpus":
        best = f"{max(g.cpus for g in nodes if g.cpus is not None)} CPUs"
    else:
        best = "the features " + ", ".join(sorted(frozenset().union(*[g.features or frozenset() for g in nodes])))
    raise GacError(f"Slurm site settings hydra.launcher.{' + '.join(words[x] for x in asked)}: no node of {where} has "
                   f"them together (its nodes with {' and '.join(words[x] for x in asked[:-1])} have at most {best}); "
                   f"ask for what one node has, or choose another partition {WHERE}")


def _alone(need: str, launcher: Mapping, rows: Sequence[NodeGroup], where: str, names: list[str], any_one: bool,
           kind: str, n: int) -> None:
    """The message for a request no node of ``rows`` meets even alone."""
    if need == "constraint":
        known = [g.features for g in rows if g.features is not None]
        have = frozenset().union(*known)
        missing = [x for x in names if x not in have] or names
        raise GacError(f"Slurm site setting hydra.launcher.constraint={launcher.get('constraint')}: no node of {where} "
                       f"has the feature {missing[0]!r} (features there: {', '.join(sorted(have)) or 'none'}); set "
                       f"constraint to null or to one of those {WHERE}")
    if need == "gpus":
        gres = [g.gpus for g in rows if g.gpus is not None]
        counts = [c for gp in gres for k, c in gp.items() if not kind or k == kind]
        if not counts:
            asked = f"gpu:{kind}" if kind else "GPUs"
            types = sorted({k for gp in gres for k in gp if k})
            raise GacError(f"Slurm site setting hydra.launcher.{'gres' if kind else 'gpus_per_node'}: no node of "
                           f"{where} has {asked}" + (f" (GPU types there: {', '.join(types)})" if types else
                                                     " (no GPU gres)")
                           + f"; choose a GPU partition (hydra.launcher.partition=...) {WHERE}")
        raise GacError(f"Slurm site setting hydra.launcher.gpus_per_node={n}: the nodes of {where} have at most "
                       f"{max(counts)} GPU(s); ask for at most {max(counts)} {WHERE}")
    if need == "mem":
        mem = max(g.mem_mb for g in rows if g.mem_mb is not None)
        raise GacError(f"Slurm site setting hydra.launcher.mem_gb={launcher.get('mem_gb')}: the nodes of {where} have "
                       f"at most {mem // 1024} GB ({mem} MB); ask for at most {mem // 1024} {WHERE}")
    cpus = max(g.cpus for g in rows if g.cpus is not None)
    raise GacError(f"Slurm site setting hydra.launcher.cpus_per_task={launcher.get('cpus_per_task')}: the nodes of "
                   f"{where} have at most {cpus} CPUs; ask for at most {cpus} {WHERE}")


def resolve_gpu(launcher: dict, rows: Sequence[NodeGroup], where: str, gpu: str | None) -> dict:
    """``launcher`` with its GPU request narrowed to the job's ``gpu`` (``h100``) on a partition whose nodes are not
    all that GPU: the site's typed GRES of that GPU (``gres=gpu:h100:N``; any GRES type whose name says it:
    ``h100``, ``h100_80gb``, ``nvidia_h100_80gb_hbm3``), else a node feature that names it (``constraint=h100``).
    A request that names another GPU (``gres=gpu:a100:1`` with ``gpu=h100``), or a partition with typed GPUs none of
    which is the job's, is refused: the job would refuse the device after its wait in the queue. Untyped GPUs
    without such a feature cannot be told apart here; the job itself checks its device."""
    from gac.devices import gpu_name_matches

    kind, n = _requested_gpus(launcher)
    if n <= 0 or not gpu or str(gpu).lower() in ("cpu", "auto"):
        return launcher
    gpu = str(gpu).lower()
    if kind:
        if not gpu_name_matches(gpu, kind):
            raise GacError(f"Slurm site setting hydra.launcher.gres={launcher.get('gres')} asks for {kind} GPUs but the "
                           f"job says gpu={gpu}; ask for gpu:{gpu}:{n} (the site's type name) or set gpu= to the GPU "
                           f"you request {WHERE}")
        return launcher
    candidates = _check_nodes(launcher, rows, where)
    gpu_rows = [g for g in candidates if g.gpus]
    types = sorted({k for g in gpu_rows for k in g.gpus if k})
    constraint = launcher.get("constraint")
    if types:
        mine = [t for t in types if gpu_name_matches(gpu, t)]
        if not mine:
            raise GacError(f"gpu={gpu}, but the GPUs of {where}{' with constraint=' + str(constraint) if constraint else ''}"
                           f" are {', '.join(types)} (sinfo's GRES types); choose the partition with {gpu.upper()}s "
                           f"(hydra.launcher.partition=...), or run gpu=auto on what it has {WHERE}")
        if len(mine) == 1:
            return {**launcher, "gres": f"gpu:{mine[0]}:{n}", "gpus_per_node": None}
        if set(mine) == set(types):
            return launcher  # every GPU there is this one, under several type names
    feats = sorted({f for g in gpu_rows for f in (g.features or ()) if gpu_name_matches(gpu, f)})
    if len(feats) == 1 and not constraint and any(feats[0] not in (g.features or ()) for g in gpu_rows):
        return {**launcher, "constraint": feats[0]}
    if types:
        raise GacError(f"gpu={gpu}: {where} has several GRES types of it ({', '.join(mine)}) beside others "
                       f"({', '.join(t for t in types if t not in mine)}); choose one with hydra.launcher.gres="
                       f"gpu:TYPE:{n} {WHERE}")
    return launcher


SACCTMGR_ANSWER_S = 20  # how long the accounting may take before its checks are skipped (said)


class _Silent(Exception):
    """sacctmgr did not answer in time."""


def _sacctmgr(sacctmgr: str, args: list[str]) -> list[str] | None:
    try:
        r = subprocess.run([sacctmgr, "-n", "-P", *args], capture_output=True, text=True, timeout=SACCTMGR_ANSWER_S)
    except subprocess.TimeoutExpired:
        raise _Silent from None
    except (OSError, subprocess.SubprocessError):
        return None
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.returncode == 0 else None


def _check_accounting(launcher: Mapping, sacctmgr: str, user: str | None) -> None:
    """account: one of the user's associations; qos: one the accounting knows. A site without accounting (sacctmgr
    fails or lists nothing) is left to sbatch; so is one whose sacctmgr does not answer in
    :data:`SACCTMGR_ANSWER_S` (once, said: sbatch still refuses an account or QOS it does not know)."""
    account, qos = launcher.get("account"), launcher.get("qos")
    try:
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
    except _Silent:
        print(f"warning: sacctmgr did not answer in {SACCTMGR_ANSWER_S} s: the account and QOS settings were not "
              f"checked (sbatch refuses one it does not know)", file=sys.stderr)


def check_slurm(launcher=None, gpu: str | None = None) -> dict:
    """Before a Slurm launch, from the launching machine: ``sbatch`` and ``srun`` exist (submitit needs both), Slurm
    answers (``sinfo``: a missing or wrong ``SLURM_CONF`` fails here with one line, not in submitit's traceback) with
    partitions, and every site setting of ``launcher`` (hydra.launcher: a mapping, or just a partition name) is one
    the cluster has (:func:`check_site`, with this cluster's ``sacctmgr`` where it is installed). Returns the settings
    to submit with (a typed GRES or constraint for the job's ``gpu``, :func:`resolve_gpu`)."""
    import getpass
    import os

    if not isinstance(launcher, Mapping):
        launcher = {"partition": launcher}
    check_values(launcher)
    for tool in ("sbatch", "srun"):
        if shutil.which(tool) is None:
            raise GacError(f"a Slurm launcher was chosen but `{tool}` is not on PATH (no Slurm client here); run from "
                           f"a login node of your cluster (module load slurm, where the site uses modules), use "
                           f"hydra/launcher=local, or start a cluster: python -m gac.launch.local_cluster start")
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return dict(launcher)
    try:
        r = subprocess.run([sinfo, "-h", "-o", SINFO_FORMAT], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        r = subprocess.CompletedProcess([sinfo], 1, "", f"{type(e).__name__}: {e}")
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()] or [f"exit code {r.returncode}"]
        conf = os.environ.get("SLURM_CONF")
        raise GacError(f"Slurm does not answer here (sinfo: {lines[-1].removeprefix('sinfo: ')}); SLURM_CONF is "
                       f"{repr(conf) if conf else 'unset'}: export SLURM_CONF=<your cluster's slurm.conf> (the loopback "
                       f"cluster: `python -m gac.launch.local_cluster start` prints it), or use hydra/launcher=local")
    groups = parse_sinfo(r.stdout)
    if not groups and r.stdout.strip():
        first = r.stdout.strip().splitlines()[0].strip()
        raise GacError(f"sinfo printed no partition rows, only other text ({first[:80]!r}); check that `sinfo -h -o "
                       f"'{SINFO_FORMAT}'` lists partitions here (a site banner alone is not a cluster)")
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = None
    return check_site(launcher, groups, shutil.which("sacctmgr"), user, gpu=gpu)
