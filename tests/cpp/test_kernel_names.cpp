// profiles/kernel_names: real kernels' names as the reports show them (demangled, shortened) and
// what each is, and ops in the same categories as the kernels they launch.
#include "profiles/kernel_names.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <string>

namespace hfnn::profiles {
namespace {

struct KernelCase {
  const char* raw;  // as CUPTI reports it
  const char* short_name;
  const char* category;
  const char* library;
};

const KernelCase kKernels[] = {
    // torch's own kernels (nm on torch 2.11's libtorch_cuda.so; the host symbols' internal-linkage L dropped, as
    // CUPTI names the device kernels)
    {"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
     "at::native::vectorized_elementwise_kernel<4, at::nat...", "elementwise", "aten"},
    {"_ZN2at6native29vectorized_elementwise_kernelILi2E18__nv_hdl_wrapper_tILb0ELb1ELb0E11__nv_dl_tagIPFvR"
     "NS_18TensorIteratorBaseEEXadL_ZNS0_23direct_copy_kernel_cudaES5_EELj10EEFhhEJEESt5arrayIPcLm2EEEEviT"
     "0_T1_",
     "at::native::vectorized_elementwise_kernel<2, __nv_hd...", "copy", "aten"},
    {"_ZN2at6native27unrolled_elementwise_kernelIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBase"
     "EENKUlvE1_clEvENKUlvE5_clEvEUlfE_NS_6detail5ArrayIPcLi2EEE23TrivialOffsetCalculatorILi1EjESC_NS0_6me"
     "mory12LoadWithCastILi1EEENSD_13StoreWithCastILi1EEEEEviT_T0_T1_T2_T3_T4_",
     "at::native::unrolled_elementwise_kernel<at::native::...", "copy", "aten"},
    {"_ZN2at6native27unrolled_elementwise_kernelI18__nv_hdl_wrapper_tILb0ELb1ELb0E11__nv_dl_tagIPFvRNS_18T"
     "ensorIteratorBaseEEXadL_ZNS0_23direct_copy_kernel_cudaES5_EELj10EEFhhEJEESt5arrayIPcLm2EELi4E23Trivi"
     "alOffsetCalculatorILi1EjESF_NS0_6memory15LoadWithoutCastENSG_16StoreWithoutCastEEEviT_T0_T2_T3_T4_T5"
     "_",
     "at::native::unrolled_elementwise_kernel<__nv_hdl_wra...", "copy", "aten"},
    {"_ZN2at6native40_GLOBAL__N__0f1a8107_8_Shape_cu_49f7391c19CatArrayBatchedCopyINS1_10OpaqueTypeILj16EE"
     "EjLi1ELi128ELi1EEEvPT_NS1_25CatArrInputTensorMetadataIS5_T0_XT2_EXT3_EEENS1_16TensorSizeStrideIS8_Lj"
     "4EEEiS8_",
     "at::native::CatArrayBatchedCopy<at::native::OpaqueTy...", "copy", "aten"},
    {"_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIf18__nv_hdl_wrapper_tILb0"
     "ELb1ELb0E11__nv_dl_tagIMNS0_11sum_functorIfffEEFvRNS_14TensorIteratorEEXadL_ZNS7_clES9_EELj1EEFfffEJ"
     "EEEEjfLi4ELi4EEEEEvT1_",
     "at::native::reduce_kernel<512, 1, at::native::Reduce...", "reduction", "aten"},
    {"_ZN2at6native51_GLOBAL__N__d9d46141_18_ForeachReduceOp_cu_b83ec48c25multi_tensor_apply_kernelINS1_18"
     "TensorListMetadataILi1EEENS0_13LpNormFunctorIN3c104HalfELNS0_8NormTypeE0ENS6_8BFloat16ELi1ELi1ELi0EE"
     "EJPfiEEEvT_T0_DpT1_",
     "at::native::multi_tensor_apply_kernel<at::native::Te...", "reduction", "aten"},
    {"_ZN2at6native51_GLOBAL__N__f7f2fd5f_18_fused_adam_impl_cu_454205f325multi_tensor_apply_kernelINS1_32"
     "FusedOptimizerTensorListMetadataILi4EEENS1_20FusedAdamMathFunctorIN3c104HalfELi4ELNS0_9ADAM_MODEE0EL"
     "b0EEEJPKfdddddbSB_SB_EEEvT_T0_DpT1_",
     "at::native::multi_tensor_apply_kernel<at::native::Fu...", "elementwise", "aten"},
    {"_ZN2at6native43_GLOBAL__N__50f1b6c4_10_Dropout_cu_0e96ed3820fused_dropout_kernelIN3c104HalfEfjLi1ELi"
     "1EbEEvNS_4cuda6detail10TensorInfoIKT_T1_EENS7_IS8_SA_EENS7_IT4_SA_EESA_T0_NS_15PhiloxCudaStateE",
     "at::native::fused_dropout_kernel<c10::Half, float, u...", "elementwise", "aten"},
    {"_ZN2at6native24index_elementwise_kernelILi128ELi4E17__nv_dl_wrapper_tI11__nv_dl_tagIPFvRNS_14TensorI"
     "teratorEEXadL_ZNS0_16flip_kernel_implINS0_10OpaqueTypeILi16EEEEEvS5_EELj1EEJK16OffsetCalculatorILi2E"
     "jLb1EErKPcrKPKcEEEEvlT1_",
     "at::native::index_elementwise_kernel<128, 4, __nv_dl...", "elementwise", "aten"},
    {"_ZN2at6native39_GLOBAL__N__5cd812b1_7_Loss_cu_5b0651e138nll_loss_forward_reduce_cuda_kernel_2dIN3c10"
     "4HalfEfhEEvPT_S6_PKS5_PKT1_S8_bllll",
     "at::native::nll_loss_forward_reduce_cuda_kernel_2d<c...", "elementwise", "aten"},
    {"_ZN43_GLOBAL__N__b6de9c8c_10_SoftMax_cu_9f978f6320softmax_warp_forwardIfffLi8ELb0ELb0EEEvPT0_PKT_iii"
     "PKbib",
     "softmax_warp_forward<float, float, float, 8, false, ...", "softmax", ""},
    {"_ZN2at6native43_GLOBAL__N__b6de9c8c_10_SoftMax_cu_9f978f6319cunn_SoftMaxForwardILi4EfffNS1_22SoftMax"
     "ForwardEpilogueEEEvPT2_PKT0_i",
     "at::native::cunn_SoftMaxForward<4, float, float, flo...", "softmax", "aten"},
    {"_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a28vectorized_layer_norm_kernelIf"
     "fLb0EEEviT0_PKT_S6_S6_PS3_S7_PS4_",
     "at::native::vectorized_layer_norm_kernel<float, floa...", "layer_norm", "aten"},
    {"_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a35GammaBetaBackwardCUDAKernelTem"
     "plateIffLj32ELj16ELj128ELb0ELb0ELb0EEEvllPKT_S5_PKT0_S8_PS3_S9_",
     "at::native::GammaBetaBackwardCUDAKernelTemplate<floa...", "layer_norm", "aten"},
    {"_ZN2at6native36batch_norm_collect_statistics_kernelINS0_3VarEN3c104HalfES4_fiEEvN5torch10headeronly6"
     "detail27GenericPackedTensorAccessorINS7_14TensorAccessorINS3_8ArrayRefIlEEKT0_Lm2ENS6_17RestrictPtrT"
     "raitsET3_EENS_6detail16IndexBoundsCheckILm3ESF_EESD_Lm3ESE_SF_EET2_SL_NS8_INS9_ISB_SL_Lm0ESE_SF_EENS"
     "I_ILm1ESF_EESL_Lm1ESE_SF_EESO_",
     "at::native::batch_norm_collect_statistics_kernel<at:...", "norm", "aten"},
    {"_ZN2at6native38_GLOBAL__N__7649b931_6_RNN_cu_eca79a6d6kernel17lstm_cell_forwardIffiLi1EEEvNS_4cuda6"
     "detail10TensorInfoIT_T1_EES9_S9_S9_S9_S9_S9_S9_S8_S8_",
     "at::native::kernel::lstm_cell_forward<float, float, ...", "lstm", "aten"},
    {"_ZN2at6native13im2col_kernelIN3c104HalfEEEvlPKT_llllllllllllPS4_",
     "at::native::im2col_kernel<c10::Half>", "conv", "aten"},
    // attention: flash (pytorch_flash), memory-efficient (fmha_cutlass), cuDNN's SDPA
    {"_ZN13pytorch_flash16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi32ELi4ELb0ELb0EN7cutlas"
     "s10bfloat16_tE19Flash_kernel_traitsILi128ELi128ELi32ELi4ES3_EELb0ELb0ELb0ELb0ELb0ELb0ELb0ELb0EEEvNS_"
     "16Flash_fwd_paramsE",
     "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_tra...", "attention", "flash"},
    {"_Z41fmha_cutlassF_bf16_aligned_64x128_rf_sm80N22PyTorchMemEffAttention15AttentionKernelIN7cutlass10b"
     "float16_tENS1_4arch4Sm80ELb1ELi64ELi128ELi128ELb1ELb1EE6ParamsE",
     "fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention", "mem_efficient"},
    {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0",
     "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg...", "attention", "cudnn"},
    // cuBLAS and cuBLASLt (strings of libcublasLt.so.13; nvjet names from Hopper traces)
    {"nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN",
     "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN", "gemm", "cublas"},
    {"nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN",
     "nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN", "gemm", "cublas"},
    {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_cgasize1x1x1_warpgroupsize1x1x1_aligna2_"
     "alignc2_execute_segment_k_off_kernel__5x_cublas",
     "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128...", "gemm", "cublas"},
    {"sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_align"
     "a2_alignc2",
     "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128...", "gemm", "cublas"},
    {"ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn",
     "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_...", "gemm", "cublas"},
    {"_Z17gemv2T_kernel_valIii13__nv_bfloat16S0_S0_fLi128ELi16ELi2ELi2ELb0ELb0E18cublasGemvParamsExIi23cub"
     "lasGemvTensorBatchedIKS0_ES4_S2_IS0_EfEEvT11_T4_S8_",
     "gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bflo...", "gemm", "cublas"},
    {"_Z13gemmk1_kernelIi6float2Li256ELi5ELb0ELb0ELb0ELb0E23cublasGemvTensorBatchedIKS0_ES3_S1_IS0_ES0_Li0"
     "EEv18cublasGemmk1ParamsIT0_T7_T8_T9_T10_N8biasTypeINS9_10value_typeESA_E4typeEE",
     "gemmk1_kernel<int, float2, 256, 5, false, false, fal...", "gemm", "cublas"},
    // cutlass: the 2.x kernels cuBLAS ships, and a 3.x kernel of torch's of 1,208 characters, over what
    // libstdc++ demangles (torch.profiler shows it mangled too): kept as it is, still known as cutlass's GEMM
    {"_ZN7cutlass7Kernel2I41cutlass_80_simt_sgemm_64x64_8x5_nn_align1EEvNT_6ParamsE",
     "cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_...", "gemm", "cutlass"},
    {"_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiEEENS1_10collective13Coll"
     "ectiveMmaINS1_34MainloopSm90TmaGmmaWarpSpecializedILi4ENS5_IJNS4_1CILi2EEENSA_ILi1EEESC_EEENS1_35Ker"
     "nelTmaWarpSpecializedCooperativeEEENS5_IJNSA_ILi128EEENSA_ILi256EEENSA_ILi64EEEEEENS_10bfloat16_tENS"
     "5_IJlSC_lEEESK_SL_NS4_8TiledMMAINS4_8MMA_AtomIJNS4_4SM904GMMA28MMA_64x256x16_F32BF16BF16_SSILNSP_5Ma"
     "jorE0ELSR_0ELNSP_7ScaleInE1ELSS_1EEEEEENS4_6LayoutISD_NS5_IJSC_NSA_ILi0EEESW_EEEEENS5_IJNS4_10Unders"
     "coreESZ_SZ_EEEEENS4_13SM90_TMA_LOADENS4_14ComposedLayoutINS4_7SwizzleILi3ELi4ELi3EEENS4_18smem_ptr_f"
     "lag_bitsILi16EEENSV_INS5_IJNSA_ILi8EEESI_EEENS5_IJSI_SC_EEEEEEEvNS4_8identityENS4_23SM90_TMA_LOAD_MU"
     "LTICASTES1C_vS1D_EENS_8epilogue10collective18CollectiveEpilogueINS1G_22Sm90TmaWarpSpecializedILi4ELi"
     "2ELi16ELb1ELb0EEEJSJ_NS5_IJSG_NSA_ILi32EEEEEESK_SL_SK_SL_NS1G_6fusion15FusionCallbacksIS1K_NS1N_17Li"
     "nearCombinationISK_fSK_fLNS_15FloatRoundStyleE2EEESJ_S1M_JEEES12_NS13_INS14_ILi2ELi4ELi3EEES17_NSV_I"
     "NS5_IJS18_S1L_EEENS5_IJS1L_SC_EEEEEEENS4_17SM75_U32x4_LDSM_NENS4_14SM90_TMA_STOREES1X_NS4_17SM90_U32"
     "x4_STSM_NENS4_9Copy_AtomIJS20_NS_6half_tEEEEvEEENS1_29PersistentAsyncInputSchedulerISE_vEEvEEEEvNT_6"
     "ParamsE",
     "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniv...", "gemm", "cutlass"},
    // cuDNN: convolutions (xmma implicit GEMMs) and a layout change
    {"sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_warpgroupsize1x1x1_g4"
     "_execute_split_k_kernel__5x_cudnn",
     "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwc...", "conv", "cudnn"},
    {"sm80_xmma_dgrad_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize64x64x64_stage4_warpsize1x4x1_"
     "g4_tensor16x8x16",
     "sm80_xmma_dgrad_implicit_gemm_f16f16_f16f16_f16_nhwc...", "conv", "cudnn"},
    {"_ZN5cudnn6fusion23nchwToNhwcKernel_32_bitImmfLb0ELb1EEEvNS0_18nchw2nhwc_params_tIT1_EEPKT_PT0_",
     "cudnn::fusion::nchwToNhwcKernel_32_bit<unsigned long...", "copy", "cudnn"},
    // NCCL (strings of libnccl.so.2)
    {"_Z39ncclDevKernel_AllReduce_Sum_f16_RING_LL24ncclDevKernelArgsStorageILm4096EE",
     "ncclDevKernel_AllReduce_Sum_f16_RING_LL", "communication", "nccl"},
    {"_Z22ncclDevKernel_SendRecv24ncclDevKernelArgsStorageILm4096EE",
     "ncclDevKernel_SendRecv", "communication", "nccl"},
    // hfnn's own (nm on this build's kernel objects)
    {"_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__68502824_17_layer_norm_fwd_cu_ac60f00415fwd_regs_kernelI13"
     "__nv_bfloat16Li16ELi1ELi1ELi16EEEvNS1_9FwdParamsE",
     "hfnn::kernels::layer_norm::fwd_regs_kernel<__nv_bflo...", "layer_norm", "hfnn"},
    {"_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__68502824_17_layer_norm_fwd_cu_ac60f00416fwd_block_kernelI1"
     "3__nv_bfloat16Li16ELb0EEEvNS1_9FwdParamsE",
     "hfnn::kernels::layer_norm::fwd_block_kernel<__nv_bfl...", "layer_norm", "hfnn"},
    {"_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__f3c16a32_17_layer_norm_bwd_cu_7915fd8215bwd_regs_kernelI13"
     "__nv_bfloat16Li16ELi1ELi1ELi16EEEvNS1_9BwdParamsE",
     "hfnn::kernels::layer_norm::bwd_regs_kernel<__nv_bflo...", "layer_norm", "hfnn"},
    {"_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__f3c16a32_17_layer_norm_bwd_cu_7915fd8216bwd_block_kernelI1"
     "3__nv_bfloat16Li16ELb0EEEvNS1_9BwdParamsE",
     "hfnn::kernels::layer_norm::bwd_block_kernel<__nv_bfl...", "layer_norm", "hfnn"},
    {"_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__f3c16a32_17_layer_norm_bwd_cu_7915fd8222reduce_partials_ke"
     "rnelI13__nv_bfloat16EEvPKfilPT_S8_",
     "hfnn::kernels::layer_norm::reduce_partials_kernel<__...", "layer_norm", "hfnn"},
    {"_ZN4hfnn7kernels10layer_norm56_GLOBAL__N__1ebc5e2e_18_layer_norm_wide_cu_6efc6a3b_671815fwd_wide_ker"
     "nelI13__nv_bfloat16Li1ELi16EEEvNS1_9FwdParamsEl",
     "hfnn::kernels::layer_norm::fwd_wide_kernel<__nv_bflo...", "layer_norm", "hfnn"},
    {"_ZN4hfnn7kernels10layer_norm56_GLOBAL__N__1ebc5e2e_18_layer_norm_wide_cu_6efc6a3b_671815bwd_wide_ker"
     "nelI13__nv_bfloat16Li1ELi16ELb0EEEvNS1_9BwdParamsEl",
     "hfnn::kernels::layer_norm::bwd_wide_kernel<__nv_bflo...", "layer_norm", "hfnn"},
    // As CUPTI named them on an H200 (hfnn profile of examples/transformer.py in bfloat16 with --hfnn,
    // evoformer.py in bfloat16, lstm_lm.py, transformer.py in float32)
    {"_ZN14at_cuda_detail3cub6detail10radix_sort29DeviceRadixSortOnesweepKernelINS1_5radix10policy_hubIlN2"
     "at4cuda3cub6detail10OpaqueTypeILi8EEEyE10Policy1000ELNS0_9SortOrderE0ElSB_yiiNS1_21identity_decompos"
     "er_tEEEvPT5_SH_PT3_PKSI_PT1_PKSM_PT2_PKSQ_T4_iiT6_",
     "at_cuda_detail::cub::detail::radix_sort::DeviceRadix...", "other", "cub"},
    {"_ZN50_GLOBAL__N__fa15d16e_17_RangeFactories_cu_38772b0829elementwise_kernel_with_indexIiZZZN2at6nati"
     "ve15arange_cuda_outERKN3c106ScalarES6_S6_RNS1_6TensorEENKUlvE_clEvENKUlvE2_clEvEUllE_EEvT_T0_PN15fun"
     "ction_traitsISD_E11result_typeE",
     "elementwise_kernel_with_index<int, at::native::arang...", "elementwise", ""},
    {"_ZN5cudnn6fusion20convert_dq_to_16bitsILb1EEEvPKvPvjjjjjjjjjjPKfS6_S6_PfS3_S4_S4_bb",
     "cudnn::fusion::convert_dq_to_16bits<true>", "attention", "cudnn"},
    {"_ZN5cudnn6fusion28compute_dot_do_o_specializedILb1ELi64EEEvPKvS3_PvS4_jjjjjjjjjjjjjjjjjfS3_S3_S3_S3_"
     "S3_bS3_S4_S3_iiiiiiiii",
     "cudnn::fusion::compute_dot_do_o_specialized<true, 64...", "attention", "cudnn"},
    {"_ZN8cublasLt19splitKreduce_kernelILi32ELi16Eif13__nv_bfloat16fS1_Lb0EfS1_S1_Lb1ELb0ELb0ELb0EEEvNS_18"
     "cublasSplitKParamsIT4_EEPKT2_PKT8_PT7_PT3_PKS3_SG_PKT9_S7_PSH_PvlPS3_PiSM_SM_SG_SG_SG_SG_SG_",
     "cublasLt::splitKreduce_kernel<32, 16, int, float, __...", "gemm", "cublas"},
    {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_"
     "0",
     "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wg...", "attention", "cudnn"},
    {"nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_splitK_NTN",
     "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_splitK_NT...", "gemm", "cublas"},
    {"_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_22gpu_kernel_impl_nocastIZZZNS0_23direct_copy_kerne"
     "l_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE10_clEvEUlN3c108BFloat16EE_EEvS4_RKT_EUliE_EEviT"
     "1_",
     "at::native::elementwise_kernel<128, 4, at::native::g...", "copy", "aten"},
    {"_ZN7cutlass7Kernel2I67cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_64x1_tn_align2EEvNT_6Para"
     "msE",
     "cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s1616...", "gemm", "cutlass"},
    {"_Z15elemWiseRNNcellIfffL14cudnnRNNMode_t2EL18cudnnRNNBiasMode_t2EEviiiiibPKT_S4_PKT0_S4_S4_S4_S4_PS5"
     "_PS2_S9_S9_S9_18cudnnRNNClipMode_t21cudnnNanPropagation_tff",
     "elemWiseRNNcell<float, float, float, (cudnnRNNMode_t...", "lstm", "cudnn"},
    {"_Z16gemmSN_TN_kernelIfLi128ELi16ELi2ELi4ELi4ELi4ELb1E30cublasGemvTensorStridedBatchedIKfES2_S0_IfEEv"
     "22cublasGemmSmallNParamsIT7_T8_T9_T_E",
     "gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true, c...", "gemm", "cublas"},
    {"_Z20LSTM_elementWise_bp1IfffEviiPT_S1_S1_S1_S1_S1_S1_PT0_S3_ii18cudnnRNNClipMode_t21cudnnNanPropagat"
     "ion_tff",
     "LSTM_elementWise_bp1<float, float, float>", "lstm", "cudnn"},
    {"_Z40fmha_cutlassB_f32_aligned_64x64_k64_sm80N22PyTorchMemEffAttention23AttentionBackwardKernelIN7cut"
     "lass4arch4Sm80EfLb1ELb0ELb0ELi64ELi64ELi64ELb0EE6ParamsE",
     "fmha_cutlassB_f32_aligned_64x64_k64_sm80", "attention", "mem_efficient"},
    // inductor's Triton kernels, CUPTI's memcpy and memset records, names no rule knows
    {"triton_poi_fused__to_copy_add_0",
     "triton_poi_fused__to_copy_add_0", "elementwise", "triton"},
    {"triton_red_fused_sum_1",
     "triton_red_fused_sum_1", "reduction", "triton"},
    {"triton_tem_fused_mm_2",
     "triton_tem_fused_mm_2", "gemm", "triton"},
    {"[memcpy]",
     "[memcpy]", "copy", "cuda"},
    {"[memset]",
     "[memset]", "copy", "cuda"},
    {"my_custom_kernel",
     "my_custom_kernel", "other", ""},
    {"_Zgarbage",
     "_Zgarbage", "other", ""},
};

bool known_category(const std::string& c) {
  return std::find(std::begin(kCategories), std::end(kCategories), c) != std::end(kCategories);
}

TEST(KernelNames, RealKernelsAreShortenedAndCategorised) {
  for (const auto& c : kKernels) {
    SCOPED_TRACE(c.raw);
    const KernelName k = describe_kernel(c.raw);
    EXPECT_EQ(k.raw, c.raw);
    EXPECT_EQ(k.full, demangle(c.raw));
    EXPECT_EQ(k.short_name, c.short_name);
    EXPECT_EQ(k.category, c.category);
    EXPECT_EQ(k.library, c.library);
    EXPECT_TRUE(known_category(k.category));
    EXPECT_LE(k.short_name.size(), kShortNameWidth);
  }
}

TEST(KernelNames, DemangledAsTorchProfilerNamesThem) {
  // Issue 13's kernel (an autocast cast, torch before 2.11), as torch._C._demangle and c++filt read it.
  EXPECT_EQ(demangle("_ZN2at6native27unrolled_elementwise_kernelIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIte"
                     "ratorBaseEENKUlvE1_clEvENKUlvE5_clEvEUlfE_NS_6detail5ArrayIPcLi2EEE23TrivialOffsetCalculatorILi"
                     "1EjESC_NS0_6memory12LoadWithCastILi1EEENSD_13StoreWithCastILi1EEEEEviT_T0_T1_T2_T3_T4_"),
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
            "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
            "at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, "
            "unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, "
            "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
            "{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, "
            "TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
            "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)");
  EXPECT_EQ(demangle("_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__68502824_17_layer_norm_fwd_cu_ac60f00415fwd_regs_kern"
                     "elI13__nv_bfloat16Li16ELi1ELi1ELi16EEEvNS1_9FwdParamsE"),
            "void hfnn::kernels::layer_norm::(anonymous namespace)::fwd_regs_kernel<__nv_bfloat16, 16, 1, 1, 16>"
            "(hfnn::kernels::layer_norm::FwdParams)");
  // Plain names stay as they are, one-letter ones too (the ABI reads "t" as "unsigned short"), and so
  // does a name the ABI cannot read.
  for (const char* plain : {"nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN", "triton_red_fused_sum_1", "[memcpy]", "t", "i",
                            "_Zgarbage", ""})
    EXPECT_EQ(demangle(plain), plain);
  // Up to 1,024 characters (libstdc++'s limit, and Kineto's).
  const std::string name(1017, 'k');
  EXPECT_EQ(demangle("_Z1017" + name + "v"), name + "()");
}

TEST(KernelNames, ShortenedToTorchProfilersColumn) {
  // torch.profiler's table: a name of 52 characters or more becomes its first 52 and "...".
  const std::string s51(51, 'x'), s52(52, 'x');
  EXPECT_EQ(shorten(s51), s51);
  EXPECT_EQ(shorten(s52), s52 + "...");
  EXPECT_EQ(shorten(std::string(300, 'x')), s52 + "...");
  EXPECT_EQ(shorten("abcdefgh", 8), "abcde...");
  // Without the return type, anonymous namespaces and the parameter list; the parentheses inside
  // template arguments (lambdas, function types) stay.
  EXPECT_EQ(shorten("void (anonymous namespace)::k<float>(float*, int)"), "k<float>");
  EXPECT_EQ(shorten("void a::(anonymous namespace)::k<a::f(int)::{lambda(float)#1}>(int)"),
            "a::k<a::f(int)::{lambda(float)#1}>");
  EXPECT_EQ(shorten("fmha_cutlassF_f32(P::AttentionKernel<float>::Params)"), "fmha_cutlassF_f32");
  EXPECT_EQ(shorten("nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN"), "nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN");
}

TEST(KernelNames, OpCategories) {
  const std::pair<const char*, const char*> ops[] = {
      {"aten::mm", "gemm"},
      {"aten::addmm", "gemm"},
      {"aten::linear", "gemm"},
      {"aten::_scaled_mm", "gemm"},
      {"AddmmBackward0", "gemm"},
      {"autograd::engine::evaluate_function: MmBackward0", "gemm"},
      {"aten::cudnn_convolution", "conv"},
      {"aten::convolution_backward", "conv"},
      {"aten::_scaled_dot_product_flash_attention", "attention"},
      {"aten::_efficient_attention_backward", "attention"},
      {"hfnn::multi_head_attention", "attention"},
      {"aten::native_layer_norm", "layer_norm"},
      {"NativeLayerNormBackward0", "layer_norm"},
      {"hfnn::layer_norm_fwd", "layer_norm"},
      {"aten::native_batch_norm", "norm"},
      {"aten::native_group_norm", "norm"},
      {"aten::_fused_rms_norm", "norm"},
      {"aten::_softmax", "softmax"},
      {"aten::_log_softmax_backward_data", "softmax"},
      {"aten::sum", "reduction"},
      {"aten::mean", "reduction"},
      {"aten::linalg_vector_norm", "reduction"},
      {"aten::add_", "elementwise"},
      {"aten::copysign", "elementwise"},
      {"aten::broadcast_tensors", "elementwise"},  // not a collective
      {"aten::native_dropout", "elementwise"},
      {"aten::copy_", "copy"},
      {"aten::_to_copy", "copy"},
      {"aten::cat", "copy"},
      {"ToCopyBackward0", "copy"},
      {"nccl:all_reduce", "communication"},
      {"c10d::allreduce_", "communication"},
      {"c10d::broadcast_", "communication"},
      {"aten::lstm", "lstm"},
      {"aten::gru", "lstm"},
      {"aten::_cudnn_rnn", "lstm"},
      {"Optimizer.step#AdamW.step", "other"},
      {"", "other"},
  };
  for (const auto& [op, category] : ops) {
    SCOPED_TRACE(op);
    EXPECT_EQ(op_category(op), category);
    EXPECT_TRUE(known_category(op_category(op)));
  }
}

// An op and the kernels it launches fall in one category: the op table and the kernel table agree.
TEST(KernelNames, OpsFallInTheirKernelsCategories) {
  const std::pair<const char*, const char*> launches[] = {
      {"aten::mm", "nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN"},
      {"aten::addmm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_cgasize1x1x1_warpgroupsize1x1x1_"
                      "aligna2_alignc2_execute_segment_k_off_kernel__5x_cublas"},
      {"aten::copy_", "_ZN2at6native27unrolled_elementwise_kernelIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIter"
                      "atorBaseEENKUlvE1_clEvENKUlvE5_clEvEUlfE_NS_6detail5ArrayIPcLi2EEE23TrivialOffsetCalculatorILi"
                      "1EjESC_NS0_6memory12LoadWithCastILi1EEENSD_13StoreWithCastILi1EEEEEviT_T0_T1_T2_T3_T4_"},
      {"aten::cat", "_ZN2at6native40_GLOBAL__N__0f1a8107_8_Shape_cu_49f7391c19CatArrayBatchedCopyINS1_10OpaqueTypeILj"
                    "16EEEjLi1ELi128ELi1EEEvPT_NS1_25CatArrInputTensorMetadataIS5_T0_XT2_EXT3_EEENS1_16TensorSizeStri"
                    "deIS8_Lj4EEEiS8_"},
      {"aten::add", "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0"
                    "_T1_"},
      {"aten::_softmax", "_ZN43_GLOBAL__N__b6de9c8c_10_SoftMax_cu_9f978f6320softmax_warp_forwardIfffLi8ELb0ELb0EEEvPT"
                         "0_PKT_iiiPKbib"},
      {"aten::native_layer_norm_backward",
       "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a35GammaBetaBackwardCUDAKernelTemplateIffLj"
       "32ELj16ELj128ELb0ELb0ELb0EEEvllPKT_S5_PKT0_S8_PS3_S9_"},
      {"hfnn::layer_norm_bwd", "_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__f3c16a32_17_layer_norm_bwd_cu_7915fd8222redu"
                               "ce_partials_kernelI13__nv_bfloat16EEvPKfilPT_S8_"},
      {"aten::_foreach_norm", "_ZN2at6native51_GLOBAL__N__d9d46141_18_ForeachReduceOp_cu_b83ec48c25multi_tensor_apply_"
                              "kernelINS1_18TensorListMetadataILi1EEENS0_13LpNormFunctorIN3c104HalfELNS0_8NormTypeE0ENS6"
                              "_8BFloat16ELi1ELi1ELi0EEEJPfiEEEvT_T0_DpT1_"},
      {"aten::_efficient_attention_forward",
       "_Z41fmha_cutlassF_bf16_aligned_64x128_rf_sm80N22PyTorchMemEffAttention15AttentionKernelIN7cutlass10bfloat16_tE"
       "NS1_4arch4Sm80ELb1ELi64ELi128ELi128ELb1ELb1EE6ParamsE"},
      {"aten::_scaled_dot_product_cudnn_attention",
       "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0"},
      {"aten::cudnn_convolution", "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_warp"
                                  "groupsize1x1x1_g4_execute_split_k_kernel__5x_cudnn"},
      {"aten::_thnn_fused_lstm_cell", "_ZN2at6native38_GLOBAL__N__7649b931_6_RNN_cu_eca79a6d6kernel17lstm_cell_forwardIf"
                                      "fiLi1EEEvNS_4cuda6detail10TensorInfoIT_T1_EES9_S9_S9_S9_S9_S9_S9_S8_S8_"},
      {"nccl:all_reduce", "_Z39ncclDevKernel_AllReduce_Sum_f16_RING_LL24ncclDevKernelArgsStorageILm4096EE"},
      {"aten::nll_loss_forward", "_ZN2at6native39_GLOBAL__N__5cd812b1_7_Loss_cu_5b0651e138nll_loss_forward_reduce_cuda_"
                                 "kernel_2dIN3c104HalfEfhEEvPT_S6_PKS5_PKT1_S8_bllll"},
  };
  for (const auto& [op, kernel] : launches) {
    SCOPED_TRACE(op);
    EXPECT_EQ(op_category(op), describe_kernel(kernel).category);
  }
}

}  // namespace
}  // namespace hfnn::profiles
