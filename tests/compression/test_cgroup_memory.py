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


def test_v2_page_cache_is_not_used_memory(tmp_path):
    """A job that just read 40 GB of weights has them in its cgroup's page cache: memory.current counts them, the
    kernel reclaims them first, so they are free for the check (tmpfs/shmem, on the anon lists, stays used)."""
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "0::/job_9\n")
    _write(cg, "job_9/memory.max", str(64 * GB))
    _write(cg, "job_9/memory.current", str(50 * GB))
    _write(cg, "job_9/memory.stat", f"anon {8 * GB}\nfile {42 * GB}\nshmem {2 * GB}\n"
                                    f"active_file {10 * GB}\ninactive_file {30 * GB}\nunevictable 0\n")
    assert cgroup_memory(proc, cg) == (64 * GB, 54 * GB)  # 64 - (50 - 40): the 2 GB of shmem stay counted
    (cg / "job_9" / "memory.stat").write_text("garbage\n")
    assert cgroup_memory(proc, cg) == (64 * GB, 14 * GB)  # unreadable stat: usage as the kernel reports it


def test_v1_page_cache_uses_the_hierarchical_counters(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "4:memory:/slurm/job_7\n")
    _write(cg, "memory/slurm/job_7/memory.limit_in_bytes", str(8 * GB))
    _write(cg, "memory/slurm/job_7/memory.usage_in_bytes", str(7 * GB))
    _write(cg, "memory/slurm/job_7/memory.stat", f"active_file 0\ninactive_file 0\ntotal_active_file {GB}\n"
                                                 f"total_inactive_file {3 * GB}\n")
    assert cgroup_memory(proc, cg) == (8 * GB, 5 * GB)


def test_the_benchs_swap_mode_check_reads_the_jobs_limit_not_the_nodes(monkeypatch):
    """memory=swap keeps every variant on the host: a node with 1 TB free but a job limited to 16 GB (its cgroup)
    cannot hold 40 GB of weights, and the bench says so before loading anything."""
    import pytest
    import torch

    from gac.errors import GacError
    from gac.evaluation import bench

    monkeypatch.setattr(bench, "memory_estimate", lambda v, p: {"weights": 40 * GB, "activations": GB,
                                                                "largest_model": 16 * GB, "per_variant": {}})

    host = resources.device_memory

    def memory(device="cpu"):  # the GPU's side faked; the host's read for real (MemAvailable and the cgroup)
        if device == "cpu":
            return host(device)
        return {"device": device, "total_mb": 80 * 1024, "available_mb": 79 * 1024}

    monkeypatch.setattr(resources, "device_memory", memory)
    monkeypatch.setattr(resources, "cgroup_memory", lambda *a, **k: (16 * GB, 12 * GB))  # the job's --mem
    with pytest.raises(GacError, match=r"need about 40.00 GB on the host .* has (\d+\.\d+) GB available to this job"
                       ) as e:
        bench.plan_memory([object(), object()], [(1, 64)], torch.device("cuda", 0), "swap")
    assert float(str(e.value).split(" has ")[1].split(" GB")[0]) <= 12.0  # never the node's free memory
    # and what the job may take is what the resident CPU check reads too
    with pytest.raises(GacError, match=r"GB available to this job"):
        bench.plan_memory([object(), object()], [(1, 64)], torch.device("cpu"), "auto")
