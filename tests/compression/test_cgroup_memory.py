"""The host-memory check reads the limit of the job's own cgroup (as /proc/self/cgroup names it), not the root's:
fake /proc and cgroup trees in tmp."""

from pathlib import Path

from gac.compression import resources
from gac.compression.resources import cgroup_memory

GB = 1 << 30


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_v2_job_cgroup_limit_binds_not_the_root(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n")
    _write(cg, "cgroup.controllers", "cpu memory\n")
    _write(cg, "memory.current", str(100 * GB))  # the root: no memory.max (unlimited)
    job = "system.slice/slurmstepd.scope/job_42"
    _write(cg, f"{job}/memory.max", str(64 * GB))
    _write(cg, f"{job}/memory.current", str(10 * GB))
    _write(cg, f"{job}/step_0/user/task_0/memory.max", "max")
    _write(cg, f"{job}/step_0/user/task_0/memory.current", str(9 * GB))
    assert cgroup_memory(proc, cg) == (64 * GB, 54 * GB)


def test_v2_tightest_level_wins(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "0::/a/b\n")
    _write(cg, "a/memory.max", str(32 * GB))
    _write(cg, "a/memory.current", str(30 * GB))  # 2 GB left at the parent
    _write(cg, "a/b/memory.max", str(16 * GB))
    _write(cg, "a/b/memory.current", str(4 * GB))  # 12 GB left at the job
    assert cgroup_memory(proc, cg) == (16 * GB, 2 * GB)


def test_v1_memory_controller_line(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "9:name=systemd:/\n4:memory:/slurm/uid_1000/job_7/step_0\n3:cpuset:/\n0::/\n")
    _write(cg, "memory/memory.limit_in_bytes", str(9223372036854771712))  # v1's unlimited root
    _write(cg, "memory/slurm/uid_1000/job_7/memory.limit_in_bytes", str(8 * GB))
    _write(cg, "memory/slurm/uid_1000/job_7/memory.usage_in_bytes", str(3 * GB))
    assert cgroup_memory(proc, cg) == (8 * GB, 5 * GB)


def test_no_limit_anywhere_and_no_proc(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "0::/job\n")
    _write(cg, "job/memory.max", "max\n")
    assert cgroup_memory(proc, cg) == (None, None)
    # /proc/self/cgroup unreadable: the mount's root still counts (a container's own limit)
    _write(cg, "memory.max", str(4 * GB))
    _write(cg, "memory.current", str(1 * GB))
    assert cgroup_memory(tmp_path / "nowhere", cg) == (4 * GB, 3 * GB)


def test_device_memory_takes_the_job_limit(monkeypatch):
    monkeypatch.setattr(resources, "cgroup_memory", lambda *a, **k: (2 * GB, GB))
    info = resources.device_memory("cpu")
    assert info["total_mb"] <= 2048 and info["available_mb"] <= 1024
