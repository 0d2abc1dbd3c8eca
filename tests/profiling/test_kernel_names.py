"""Kernel tiers and attention backends of real kernel names, as torch.profiler / Nsight recorded them on Ampere and
Hopper GPUs (no GPU here: the names are the data). Each row names where the string was published; "GitHub code
search" = a public profiler table found by exact-string search over public repositories (no stable URL)."""

import pytest

from gac.profiling.kernels import TIER_RANK, attention_backend, kernel_tier

GEMM_NAMES = [
    # --- Ampere (sm80) cuBLAS-native kernels
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", "native", "GitHub code search (A100 trace diff)"),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_nn", "native",
     "https://github.com/karpathy/nanochat/pull/105"),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel", "native",
     "GitHub code search (A100 torch.profiler diff)"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma", "native",
     "https://github.com/pytorch/pytorch/pull/167503"),
    # --- CUTLASS 2 kernels cuBLAS falls back to (paper Table 3: align2 = tier 2, sm75 align1 = tier 3)
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_32x6_tn_align8>"
     "(cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_32x6_tn_align8::Params)", "align8",
     "GitHub code search (nsys cuda_gpu_kern_sum)"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_32x6_tn_align2>", "align2",
     "GAC paper Table 3 (CUTLASS sm80 align2), issue 21"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1>"
     "(cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1::Params)", "align1",
     "GitHub code search (PaLU grouped_bmm trace)"),
    ("cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_64x64_tn_align1>", "align1",
     "GitHub code search (LSTM trace)"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1", "align1",
     "https://github.com/pytorch/pytorch/pull/167503"),
    # --- Hopper (sm90): cuBLASLt's nvjet kernels (fp16 hsh / hss, bf16 tst; CUDA 13 adds the sm prefix)
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", "native", "GitHub code search (H100 torch matmul trace)"),
    ("nvjet_tst_128x24_64x11_2x1_v_bz_TNT", "native", "https://github.com/sgl-project/sglang/pull/22353"),
    ("nvjet_tst_64x24_64x16_4x1_v_bz_splitK_TNT", "native", "https://github.com/sgl-project/sglang/pull/22353"),
    ("nvjet_hss_64x8_64x16_1x1_v_bz_splitK_NNT", "native", "GitHub code search (sm_90, CUDA 12.8 cuBLASLt)"),
    ("nvjet_sm90_hsh_32x64_64x16_4x1_v_bz_TNN", "native", "GitHub code search (sm_90, CUDA 13 torch.profiler)"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     "native", "GitHub code search (H100 kernel grouping table)"),
    # --- CUTLASS 3 (Hopper): by library name (alignment in the name) or by template (no alignment in the name)
    ("cutlass3x_sm90_tensorop_gemm_f16_f16_f32_f16_f32_128x128x64_2x1x1_0_ntn_align8", "align8",
     "NVIDIA/cutlass profiler documentation (kernel naming convention)"),
    ("cutlass3x_sm90_tensorop_gemm_f16_f16_f32_void_f16_128x128x64_1x2x1_0_tnn_align8_warpspecialized_cooperative_"
     "epi_tma", "align8", "issue 21 (CUTLASS 3 library name)"),
    ("void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm10<cutlass::gemm::kernel::GemmUniversal<"
     "cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int>>, cutlass::gemm::collective::CollectiveMma<",
     "cutlass", "https://github.com/pytorch/pytorch/pull/156203"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
     "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<", "cutlass",
     "issue 21 (CUTLASS 3 template name)"),
    # --- GEMV (M = 1)
    ("void gemv2T_kernel_val<int, int, __half, __half, float, 128, 16, 4, 4, false>", "gemv",
     "GitHub code search (decode trace)"),
    ("internal::gemvx::kernel", "gemv", "GitHub code search (decode trace: the LM head)"),
    ("void reduce_1Block_kernel<float, 128, 7, cublasGemvTensorStridedBatched<float>>", "gemv",
     "https://github.com/vllm-project/vllm-omni/pull/553"),
    # --- not a GPU GEMM
    ("aten::mm", "cpu", "torch.profiler on CPU"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<", "unknown",
     "https://github.com/sgl-project/sglang/pull/22353"),
    ("", "unknown", "-"),
    (None, "unknown", "-"),
]


@pytest.mark.parametrize(("name", "tier", "source"), GEMM_NAMES, ids=[str(n)[:48] for n, _, _ in GEMM_NAMES])
def test_real_gemm_kernel_names_get_their_tier(name, tier, source):
    assert kernel_tier(name) == tier, source


def test_every_gemm_tier_has_a_rank_and_the_fallbacks_rank_below_native():
    tiers = {t for _, t, _ in GEMM_NAMES} - {"gemv", "cpu", "unknown"}
    assert tiers <= set(TIER_RANK)
    assert TIER_RANK["native"] == TIER_RANK["align8"] < TIER_RANK["align2"] < TIER_RANK["align1"]


ATTENTION_NAMES = [
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t, "
     "Flash_kernel_traits<64, 128, 128, 4, cutlass::half_t> >, false, false, false, false, false, true, false, false>"
     "(pytorch_flash::Flash_fwd_params)", "flash", "GitHub code search (torch.profiler table)"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
     "cutlass::half_t", "flash", "PyTorch's flash port (split-KV decode kernel)"),
    ("fmha_cutlassF_f16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
     "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)", "efficient",
     "GitHub code search (sdpa_kernel backend sweep)"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "efficient", "GitHub code search (H100 SDPA memory study)"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "cudnn",
     "GitHub code search (sdpa_kernel backend sweep)"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", "cudnn",
     "GitHub code search (H100 FSDP trace, name truncated there after 4x)"),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "cudnn",
     "https://github.com/meta-pytorch/tritonbench/issues/41"),
    ("sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", "cudnn",
     "a cuDNN SDPA kernel named without the cudnn_generated prefix (runtime-compiled)"),
    ("cudnn::fusion::sdpa_forward_kernel<half>", "cudnn", "a cuDNN SDPA kernel named by its namespace"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 32, 4, false, false, cutlass::half_t, "
     "Flash_kernel_traits<128, 128, 32, 4, cutlass::half_t> >, true, false, false, false, false, true, false, false>",
     "flash", "H200, torch 2.11+cu130, gac doctor at d=107"),
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", None, "a GEMM (math SDPA runs these)"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half>", None,
     "the math backend's softmax"),
    (None, None, "-"),
]


@pytest.mark.parametrize(("name", "backend", "source"), ATTENTION_NAMES,
                         ids=[str(n)[:48] for n, _, _ in ATTENTION_NAMES])
def test_attention_kernels_name_their_sdpa_backend(name, backend, source):
    assert attention_backend(name) == backend, source


# (kernel name, its architecture, its tier on an A100 (8.0), on an RTX A6000 (8.6), on an H100 (9.0)) for a
# misaligned GEMM: an older generation's cuBLAS kernel there is what cuBLAS fell back to
ARCH_TIERS = [
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel", 80,
     "native", "native", "fallback"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", 80, "native", "native", "fallback"),
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", 75, "fallback", "fallback", "fallback"),
    ("volta_sgemm_128x64_nn", 70, "fallback", "fallback", "fallback"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     90, "native", "native", "native"),
    ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_TNT", 90, "native", "native", "native"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", None, "native", "native", "native"),
    ("cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_32x6_nn_align2", 80, "align2", "align2", "align2"),
    ("cutlass3x_sm90_tensorop_gemm_f16_f16_f32_f16_f32_128x128x64_2x1x1_0_ntn_align8", 90, "align8", "align8",
     "align8"),
    ("void gemv2T_kernel_val<int, int, __half, __half, float, 128, 16, 4, 4, false>", None, "gemv", "gemv", "gemv"),
]


@pytest.mark.parametrize(("name", "arch", "a100", "a6000", "h100"), ARCH_TIERS, ids=[n[:40] for n, *_ in ARCH_TIERS])
def test_previous_generation_kernels_are_a_fallback_on_a_newer_gpu_for_a_misaligned_gemm(name, arch, a100, a6000,
                                                                                         h100):
    from gac.profiling.kernels import kernel_arch

    assert kernel_arch(name) == arch
    assert [kernel_tier(name, cc, aligned=False) for cc in ((8, 0), "8.6", 90)] == [a100, a6000, h100]
    # an aligned (or unknown) shape: cuBLAS chose the kernel, nothing refused the shape; the tier is its family
    family = "native" if a100 == "fallback" else a100
    for cc in ((8, 0), "8.6", 90, None):
        assert kernel_tier(name, cc, aligned=True) == family
        assert kernel_tier(name, cc) == family


def test_sm80_hmma_kernels_on_hopper_for_skinny_aligned_gemms_are_tier_1_not_fallback():
    """cuBLAS runs sm80 HMMA kernels on an H100 for skinny aligned GEMMs (M=16, K=N=4096): Table 3's tier 1
    (cuBLAS-native, mma.m16n8k16), ranked with nvjet, not with the align-2 kernels."""
    from gac.profiling.kernels import gemm_aligned, mma_instruction

    name = "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64_stage4_warpsize2x2x1_tensor16x8x16_kernel"
    tier = kernel_tier(name, (9, 0), gemm_aligned(4096, 4096))
    assert tier == "native" and TIER_RANK[tier] == TIER_RANK["native"] < TIER_RANK["align2"]
    assert mma_instruction("ampere_fp16_s16816gemm_fp16_64x64_ldg8_f2f_stages_64x5_tn") == "m16n8k16"
    assert kernel_tier(name, (9, 0), gemm_aligned(4097, 4096)) == "fallback"


def test_gemm_alignment_is_16_bytes_of_k_and_n():
    from gac.profiling.kernels import gemm_aligned

    assert gemm_aligned(4096, 4096) and gemm_aligned(4104, 8) and gemm_aligned(12, 4, itemsize=4)
    assert not gemm_aligned(4097, 4096) and not gemm_aligned(4096, 4098) and not gemm_aligned(6, 4, itemsize=4)


# what ran on a real H200 (torch 2.11+cu130): gac doctor's GEMM at K=4096/4097, then torch.profiler over F.linear at
# M in 1..4096, N in (4096, 11008), K in 4096..4104, fp16 and bf16 (180 shapes, no name unplaced; no sm80 kernel
# for these shapes there); each keeps its classification: (name, N, K, tier)
H200_GEMMS = [
    ("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", 4096, 4096, "native"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1>(cutlass_75_tensorop_f16_s1688"
     "gemm_f16_256x128_nn_align1::Params)", 4096, 4097, "align1"),
    ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", 4096, 4096, "native"),  # bf16, M=1
    ("void cutlass::Kernel2<cutlass_75_wmma_tensorop_f16_s161616gemm_f16_32x32_128x1_tn_align1>(cutlass_75_wmma_"
     "tensorop_f16_s161616gemm_f16_32x32_128x1_tn_align1::Params)", 11008, 4097, "align1"),  # fp16, M=4
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align2>(cutlass_80_wmma_"
     "tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align2::Params)", 4096, 4098, "align2"),  # bf16, M=4
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, "
     "cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16> >("
     "cublasGemmSmallNParams<cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<"
     "__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float>)", 4096, 4097, "gemv"),  # M=4
]


@pytest.mark.parametrize(("name", "n", "k", "tier"), H200_GEMMS, ids=[f"{n[:24]}-K{k}" for n, _, k, _ in H200_GEMMS])
def test_the_h200s_gemm_kernels_keep_their_tiers(name, n, k, tier):
    from gac.profiling.kernels import gemm_aligned

    assert kernel_tier(name, "9.0", gemm_aligned(k, n)) == tier


def test_fallback_ranks_below_native():
    assert TIER_RANK["native"] < TIER_RANK["fallback"] < TIER_RANK["align1"]


@pytest.mark.parametrize("name,library,tile,split_k", [
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", "cublas", "128x64", None),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel", "cublas",
     "96x128", None),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     "cublas", "128x128", False),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", "cublas", "128x256", None),
    ("nvjet_tst_64x24_64x16_4x1_v_bz_splitK_TNT", "cublas", "64x24", True),
    ("void splitKreduce_kernel<32, 16, int, __half, __half, float, __half, true, false, false>"
     "(cublasSplitKParams<float>, __half const*)", "cublas", None, True),
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_32x6_tn_align2>", "cutlass", "64x64",
     None),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t>",
     "flash", None, None),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<", "aten", None, None),
    ("", None, None, None),
])
def test_kernel_fields_read_library_tile_and_split_k(name, library, tile, split_k):
    from gac.profiling.kernels import kernel_fields

    assert kernel_fields(name) == {"library": library, "tile": tile, "split_k": split_k}
