"""The GPU peak of a stage is the maximum over every stage inside it, even when another meter's stages (those of
``prepare()`` inside a job's ``prepare`` stage) reset the device's peak counter; checked with a fake counter."""

from __future__ import annotations

from gac.compression.resources import ResourceMeter

MB = 2**20


class FakePeak:
    """A device's peak counter: ``alloc(n)`` / ``free(n)`` move the allocated bytes; the peak is the most since the
    last reset, as torch.cuda.max_memory_allocated."""

    key = ("fake", 0)
    index = 0

    def __init__(self):
        self.now = self.top = 0
        self.resets = 0

    def alloc(self, mb):
        self.now += mb * MB
        self.top = max(self.top, self.now)

    def free(self, mb):
        self.now -= mb * MB

    def peak(self):
        return self.top

    def reset(self):
        self.resets += 1
        self.top = self.now

    def sync(self):
        pass


def test_an_outer_stage_keeps_the_peak_of_an_inner_meter_s_earlier_stage():
    gpu = FakePeak()
    job, inner = ResourceMeter("cpu", gpu=gpu), ResourceMeter("cpu", gpu=gpu)
    gpu.alloc(100)  # the weights
    with job.stage("prepare"):
        with inner.stage("gradients"):
            gpu.alloc(300)
            gpu.free(300)
        with inner.stage("factorize"):
            gpu.alloc(50)
            gpu.free(50)
    with job.stage("evaluate"):
        gpu.alloc(20)
        gpu.free(20)
    inner_mem, job_mem = inner.memory(), job.memory()
    assert inner_mem["gradients"]["gpu_peak_mb"] == 400 and inner_mem["factorize"]["gpu_peak_mb"] == 150
    # the job's prepare stage: the maximum over its inner stages, not the last one's 150
    assert job_mem["prepare"]["gpu_peak_mb"] == 400
    assert job_mem["evaluate"]["gpu_peak_mb"] == 120  # a later stage starts from what is allocated then
    assert gpu.resets == 4


def test_the_same_meter_nested_and_a_peak_between_inner_stages():
    gpu = FakePeak()
    meter = ResourceMeter("cpu", gpu=gpu)
    with meter.stage("outer"):
        gpu.alloc(70)  # between inner stages, inside the outer one
        gpu.free(70)
        with meter.stage("inner"):
            gpu.alloc(10)
            gpu.free(10)
        gpu.alloc(5)
        gpu.free(5)
    mem = meter.memory()
    assert mem["outer"]["gpu_peak_mb"] == 70 and mem["inner"]["gpu_peak_mb"] == 10


def test_a_bench_reset_inside_a_stage_folds_the_peak_first(monkeypatch):
    import gac.compression.resources as R

    gpu = FakePeak()
    monkeypatch.setattr(R, "_cuda", lambda device: 0)
    monkeypatch.setattr(R, "CudaPeak", lambda index: gpu)
    monkeypatch.setattr("torch.cuda.reset_peak_memory_stats", lambda index: gpu.reset())
    meter = ResourceMeter("cpu", gpu=gpu)
    with meter.stage("evaluate"):
        gpu.alloc(200)
        gpu.free(200)
        R.reset_gpu_peak("cuda:0")  # e.g. the bench measuring its own peak
        gpu.alloc(30)
        gpu.free(30)
    assert meter.memory()["evaluate"]["gpu_peak_mb"] == 200


def test_a_cpu_meter_records_no_gpu_peak():
    meter = ResourceMeter("cpu")
    with meter.stage("x"):
        pass
    assert "gpu_peak_mb" not in meter.memory()["x"] and meter.gpu is None
