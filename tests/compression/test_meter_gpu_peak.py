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


class FakeDevicePeak(FakePeak):
    """One device of several: its own counter, keyed by its index (as CudaPeak keys ``("cuda", i)``)."""

    def __init__(self, index):
        super().__init__()
        self.index = index
        self.key = ("fake", index)


def test_each_device_of_a_spread_job_keeps_its_own_peak():
    gpus = [FakeDevicePeak(0), FakeDevicePeak(1), FakeDevicePeak(2)]
    meter = ResourceMeter("cpu", gpu=gpus[0], others=gpus[1:])
    gpus[0].alloc(100)  # the first half of the weights
    gpus[1].alloc(80)  # the second half; device 2 holds nothing
    with meter.stage("prepare"):
        gpus[1].alloc(300)  # layer 5's statistics, on the device that holds it
        gpus[1].free(300)
        gpus[0].alloc(40)
        gpus[0].free(40)
    with meter.stage("evaluate"):
        gpus[0].alloc(10)
        gpus[0].free(10)
    mem = meter.memory()
    assert mem["prepare"]["gpu_peaks_mb"] == {"fake:0": 140, "fake:1": 380, "fake:2": 0}
    assert mem["prepare"]["gpu_peak_mb"] == 140  # the job's own device, as before
    assert mem["evaluate"]["gpu_peaks_mb"] == {"fake:0": 110, "fake:1": 80, "fake:2": 0}
    assert all(g.resets == 2 for g in gpus)  # every device's counter reset per stage


def test_the_record_block_keeps_every_device_s_peak_and_the_estimate():
    from types import SimpleNamespace

    from gac.jobs.run.recipe import resources

    gpus = [FakeDevicePeak(0), FakeDevicePeak(1)]
    meter = ResourceMeter("cpu", gpu=gpus[0], others=gpus[1:])
    with meter.stage("load"):
        gpus[0].alloc(50)
        gpus[1].alloc(500)
    est = SimpleNamespace(device_bytes=600 * MB, host_bytes=100 * MB, weights=550 * MB, dtype="float16", params=7)
    block = resources(meter, {}, "cuda:0", est)
    assert block["gpu_peaks_mb"] == {"fake:0": 50, "fake:1": 500} and block["gpu_peak_mb"] == 50
    assert block["estimate"] == {"device_mb": 600, "host_mb": 100, "weights_mb": 550, "dtype": "float16", "params": 7}


def test_a_one_gpu_job_names_its_device_and_a_cpu_job_has_no_device_peaks():

    from gac.jobs.run.recipe import resources

    gpu = FakePeak()
    meter = ResourceMeter("cpu", gpu=gpu)
    with meter.stage("load"):
        gpu.alloc(30)
    assert "gpu_peaks_mb" not in meter.memory()["load"]
    assert resources(meter, {}, "cuda", None)["gpu_peaks_mb"] == {"fake:0": 30}
    cpu = ResourceMeter("cpu")  # the real CPU path: no counters, the host's peak only
    with cpu.stage("load"):
        blob = bytearray(8 * MB)
    block = resources(cpu, {}, "cpu", None)
    assert "gpu_peaks_mb" not in block and "estimate" not in block and block["peak_rss_mb"] >= 8 and blob
    assert cpu.gpus == []
