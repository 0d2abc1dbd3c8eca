"""The GPU a job's config names (gpu=a100/h100/h200) is compared with the device it lands on, before any work: a
faked CUDA device (the name the driver would report)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from gac.errors import GacError
from gac.jobs.run import preflight
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config
from gac.jobs.run.preflight import check_job_here
from gac.devices import gpu_name_matches


@pytest.mark.parametrize(("gpu", "name", "ok"), [
    ("h100", "NVIDIA H100 80GB HBM3", True),
    ("h100", "NVIDIA H100 PCIe", True),
    ("a100", "NVIDIA A100-SXM4-80GB", True),
    ("a100", "NVIDIA A100 80GB PCIe", True),
    ("h200", "NVIDIA H200", True),
    ("rtx4090", "NVIDIA GeForce RTX 4090", True),
    ("a100", "NVIDIA H100 80GB HBM3", False),
    ("h100", "NVIDIA A100-SXM4-40GB", False),
    ("a100", "NVIDIA RTX A1000", False),  # a word, not a prefix
    ("h200", "NVIDIA GH200 480GB", False),
])
def test_gpu_name_matches(gpu, name, ok):
    assert gpu_name_matches(gpu, name) is ok


def _spec(*overrides):
    return spec_from_config(OmegaConf.to_container(compose_config(["model=tiny", *overrides]), resolve=True))


@pytest.fixture
def fake_gpu(monkeypatch):
    def use(name):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(preflight, "cuda_device_name", lambda device: name)
    return use


def test_config_gpu_on_another_device_is_refused_in_one_line(fake_gpu):
    fake_gpu("NVIDIA H100 80GB HBM3")
    with pytest.raises(GacError) as e:
        check_job_here(_spec("gpu=a100"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("config: gpu=a100, but this job's device cuda is a 'NVIDIA H100 80GB HBM3'")
    assert "use gpu=h100 (this device's config) or gpu=auto here" in msg


def test_matching_and_auto_gpus_pass(fake_gpu):
    fake_gpu("NVIDIA H100 80GB HBM3")
    check_job_here(_spec("gpu=h100"))
    spec = _spec("gpu=auto")
    assert spec.gpu == "auto" and spec.device == "cuda"
    check_job_here(spec)  # any device; the record's provenance.device_name names it
    fake_gpu("NVIDIA L40S")
    with pytest.raises(GacError, match=r"is a 'NVIDIA L40S'.*; use gpu=auto here"):
        check_job_here(_spec("gpu=h200"))
