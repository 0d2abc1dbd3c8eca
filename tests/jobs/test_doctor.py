"""``gac doctor`` on this CPU node (its GPU branch: tests/gpu/test_gpu_node.py): one line per check, CUDA reported as
not available (exit 0), a failing check exits 1, and the judgements the GPU branch makes, fed real kernel names."""

from __future__ import annotations

import json

import pytest
import torch

from gac.cli import main
from gac.jobs.doctor import node as doctor
from gac.jobs.doctor import runs as doctor_runs

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-node behaviour (a GPU is present)")


def test_doctor_on_a_cpu_node_runs_the_cpu_checks_and_exits_0(tmp_path, capsys):
    out_json = tmp_path / "doctor.json"
    assert main(["doctor", "--no-smoke", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    status = {ln.split()[1]: ln.split()[0] for ln in lines if ln[:4] in ("PASS", "FAIL", "INFO")}
    assert status["versions"] == "PASS" and status["cuda"] == "INFO" and status["device"] == "PASS"
    assert any("CUDA not available" in ln for ln in lines)
    sdpa = [ln for ln in lines if ln.split()[1] == "sdpa"]
    assert len(sdpa) == len(doctor.HEAD_DIMS) and all(ln.startswith("PASS") for ln in sdpa)
    assert any("gemm K=512/513" in ln and ln.startswith("PASS") for ln in lines)
    assert lines[-2] == "all checks passed" and lines[-1] == f"wrote {out_json}"
    doc = json.loads(out_json.read_text())
    assert doc["failed"] == 0 and doc["device"] == "cpu"
    by_name = {c["name"]: c for c in doc["checks"]}
    d107 = by_name["sdpa d=107 fp32"]["data"]
    assert d107["ran"] in ("flash (cpu)", "math") and "math" in d107["accepts"] and d107["latency_ms"]["auto"] > 0
    gemm = by_name["gemm K=512/513"]["data"]["points"]
    assert gemm["513"]["kernel"] == "aten::mm" and gemm["513"]["tier"] == "cpu"


def test_asking_for_cuda_on_a_cpu_node_is_a_failed_check(capsys):
    assert main(["doctor", "--device", "cuda:1", "--no-smoke"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  cuda" in out and "CUDA is not available" in out and "srun --gres=gpu:1" in out
    assert "sdpa" not in out  # nothing measured on a device that is not there


def test_smoke_compresses_reloads_evaluates_and_benches_tiny():
    c = doctor_runs.smoke_check(torch.device("cpu"))
    assert c.status == "PASS", c.detail
    d = c.data
    assert d["aligned_fraction"] == 1.0 and d["ppl_compressed"] < 1.5 * d["ppl_baseline"]
    assert d["prefill_ms"] > 0 and d["bench_ratio"] > 0 and d["timer"] == ("thread_time" if torch.get_num_threads() == 1 else "perf_counter")


def test_transformers_that_disables_this_torch_fails_the_versions_check(monkeypatch):
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_torch_available", lambda: False)
    c = doctor.check_versions()
    assert c.status == "FAIL" and "transformers<5.20" in c.detail and "needs torch >= 2.6" in c.detail


# ------------------------------------------------------------- the GPU branch's judgements, on real kernel names


def _sdpa_check(d, selected, accepts):
    data = {"head_dim": d, "dtype": "float16", "selected": selected, "accepts": accepts,
            "latency_ms": {"auto": 2.139, **{b: 1.0 for b in accepts}},
            "source_accepts": [b for b in ("flash", "efficient", "cudnn", "math") if doctor.source_accepts(b, d)]}
    return doctor.Check(f"sdpa d={d} fp16", "PASS", "", data)


def test_sdpa_check_passes_when_the_kernel_that_ran_is_the_dispatchers_choice():
    c = _sdpa_check(107, "flash", ["flash", "math"])
    doctor._finish_sdpa(c, "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
                           "false, cutlass::half_t", cuda=True)
    assert c.status == "PASS" and c.detail.startswith("runs flash (2.139 ms") and "differs" not in c.detail


def test_sdpa_check_fails_when_another_backend_ran_and_notes_a_source_difference():
    c = _sdpa_check(64, "flash", ["flash", "efficient", "math"])  # cudnn rejected though the source admits 64
    doctor._finish_sdpa(c, "fmha_cutlassF_f16_aligned_64x128_rf_sm80", cuda=True)
    assert c.status == "FAIL" and "picks flash but the kernel that ran is efficient's" in c.detail
    assert "differs from the torch 2.5-2.9 source for: cudnn" in c.detail
    m = _sdpa_check(107, "math", ["math"])
    doctor._finish_sdpa(m, "ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", cuda=True)
    assert m.status == "PASS" and m.data["ran"] == "math"  # GEMMs and a softmax: math


def test_gemm_check_fails_on_a_kernel_gac_cannot_place_in_a_tier():
    def check(k1, k2):
        c = doctor.Check("gemm K=4096/4097", "PASS", "", {"points": {"4096": {"ms": 1.0}, "4097": {"ms": 1.6}}})
        doctor._finish_gemm(c, {"4096": k1, "4097": k2})
        return c

    ok = check("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN",
               "void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1>")
    assert ok.status == "PASS" and "K=4097 1.600 ms align1" in ok.detail and "1.60x" in ok.detail
    bad = check("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", "some_new_kernel_1x1")
    assert bad.status == "FAIL" and "does not know 'some_new_kernel_1x1'" in bad.detail


def test_gemm_check_tiers_by_the_devices_capability():
    c = doctor.Check("gemm K=4096/4097", "PASS", "", {"points": {"4096": {"ms": 1.0}, "4097": {"ms": 1.6}},
                                                       "capability": "9.0"})
    doctor._finish_gemm(c, {"4096": "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN",
                            "4097": "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_kernel"})
    assert c.status == "PASS" and c.data["points"]["4096"]["tier"] == "native"
    assert c.data["points"]["4097"]["tier"] == "fallback"  # an A100 kernel on an H100, for the misaligned K
    # the same sm80 HMMA kernel on the aligned K is cuBLAS's own pick (tier 1), not a fallback
    a = doctor.Check("gemm K=4096/4097", "PASS", "", {"points": {"4096": {"ms": 1.0}, "4097": {"ms": 1.6}},
                                                       "capability": "9.0", "N": 4096, "dtype": "float16"})
    sm80 = "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64_stage4_warpsize2x2x1_tensor16x8x16_kernel"
    doctor._finish_gemm(a, {"4096": sm80, "4097": "void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x"
                                                    "128_nn_align1>"})
    assert a.status == "PASS" and a.data["points"]["4096"]["tier"] == "native"
    assert a.data["points"]["4097"]["tier"] == "align1"


H200_SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0"


def test_sdpa_check_passes_on_the_h200s_cudnn_kernel_and_on_a_cudnn_name_without_cudnn_generated():
    for kernel in (H200_SDPA, "sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0"):
        c = _sdpa_check(128, "cudnn", ["flash", "efficient", "cudnn", "math"])
        doctor._finish_sdpa(c, kernel, cuda=True)
        assert c.status == "PASS" and c.data["ran"] == "cudnn", c.detail


def test_sdpa_check_never_fails_on_an_attention_kernel_gac_does_not_name():
    c = _sdpa_check(128, "cudnn", ["flash", "efficient", "cudnn", "math"])
    doctor._finish_sdpa(c, "sm100_fort_sdpa_fwd_kernel_v2<half>", cuda=True)  # a made-up future name
    assert c.status == "INFO" and c.data["ran"] == "unknown"
    assert "not one gac names" in c.detail and "sm100_fort_sdpa_fwd_kernel_v2" in c.detail
    # but a GEMM where the dispatcher picked cudnn is the math backend: a real mismatch, still a FAIL
    m = _sdpa_check(128, "cudnn", ["flash", "efficient", "cudnn", "math"])
    doctor._finish_sdpa(m, "ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", cuda=True)
    assert m.status == "FAIL" and "picks cudnn but the kernel that ran is math's" in m.detail


def test_the_source_rules_are_what_the_readme_says():
    assert [b for b in ("flash", "efficient", "cudnn") if doctor.source_accepts(b, 107)] == ["flash"]
    assert all(doctor.source_accepts(b, 112) for b in ("flash", "efficient", "cudnn"))
    assert not doctor.source_accepts("cudnn", 136) and doctor.source_accepts("flash", 256)
    assert not doctor.source_accepts("flash", 264)


def test_the_caches_are_named_with_their_variable_and_free_space(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_CACHE", raising=False)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "ds"))
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "gac"))
    monkeypatch.setenv("LM_HARNESS_CACHE_PATH", str(tmp_path / "lm"))
    monkeypatch.setattr(doctor, "free_gb", lambda path: 5.0 if "hf" in str(path) else 500.0)
    checks = {c.name: c for c in doctor.check_caches()}
    assert list(checks) == ["cache hub", "cache datasets", "cache gac", "cache lm-eval"]
    assert all(c.status == "INFO" for c in checks.values())
    assert checks["cache hub"].detail.startswith(f"{tmp_path / 'hf' / 'hub'} (5 GB free; model weights; moved by "
                                                 f"HF_HOME or HF_HUB_CACHE); low for an 8B model")
    assert checks["cache datasets"].data["path"] == str(tmp_path / "ds") and "low" not in checks["cache datasets"].detail
    assert checks["cache gac"].data == {"path": str(tmp_path / "gac"), "free_gb": 500.0, "variable": "GAC_CACHE"}
    assert checks["cache lm-eval"].data["path"] == str(tmp_path / "lm")


def test_free_space_is_read_at_the_nearest_existing_parent(tmp_path):
    assert doctor.free_gb(tmp_path / "not" / "yet" / "made") > 0


def test_the_hub_line_says_reachability_and_token(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    c = doctor.check_hub()
    assert c.status == "INFO" and "not reachable (HF_HUB_OFFLINE is set)" in c.detail
    assert "a token is set (HF_TOKEN)" in c.detail and c.data == {"reachable": False, "token": True}
