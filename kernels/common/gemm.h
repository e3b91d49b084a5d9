// GEMMs through cuBLASLt with its fused epilogues, the algorithm chosen once per shape: host code,
// torch-free (the caller passes the handle, workspace and stream).
//
// Why not torch's addmm/mm: torch asks cuBLASLt's heuristic on every call (tens of microseconds of
// CPU a GEMM, which decides launch-bound training steps). Here its answer is cached per shape,
// strides, alignment and epilogue, once for the process, and so are the descriptors cuBLASLt reads
// at each launch, once per thread (kernels/common/keyed_cache.h): a call that was made before costs
// a hash lookup and the launch.
//
// Not used: cuBLASLt's bias-gradient epilogue (BGRADB). On an H200 with cuBLAS 13.1 it is not a
// fusion: it runs a GEMM without split-K and then its own reduction kernel, so a linear layer's dW
// for [512 x 320,000] x [320,000 x 512] took 551 us instead of 216 us, and its reduction 187 us
// instead of torch's 132 (bench/README.md, multi-head attention notes).
//
// Row-major, as torch holds matrices: D[m, n] = op(A)[m, k] op(B)[k, n] (+ bias[n] on every row)
// (+ beta D), op(X) = X or X^T. Every matrix's rows are contiguous (element stride 1), ld >= its
// column count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/dtype.h"

#if HFNN_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif

namespace hfnn::kernels::gemm {

struct Params {
  DType dtype = DType::kFloat32;  // of A, B, D and the bias vectors; the sums are float
  bool tf32 = false;              // fp32 inputs multiplied in TF32 (torch.backends.cuda.matmul.allow_tf32)
  // D (and the bias) in float32 whatever dtype A and B have: 16-bit inputs whose float32 sums are
  // kept unrounded (LSTM's input projection, and its step GEMMs accumulating onto it with beta 1).
  bool float32_out = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // [m, k], or [k, m] with trans_a
  int64_t lda = 0;
  bool trans_a = false;
  const void* b = nullptr;  // [k, n], or [n, k] with trans_b
  int64_t ldb = 0;
  bool trans_b = false;
  void* d = nullptr;  // [m, n]
  int64_t ldd = 0;
  float beta = 0.0f;              // D = product + beta * D
  const void* bias = nullptr;     // [n] in D's dtype, added to every row of D (beta 0 only)
  void* workspace = nullptr;
  std::size_t workspace_size = 0;
  int device = -1;  // the CUDA device the pointers are on (the current one); -1: run() asks CUDA
};

enum class Status {
  kOk,
  kNoAlgorithm,  // cuBLASLt has no algorithm for this shape, layout and epilogue: use another path
  kError,        // a cuBLAS error: the message says which
};

struct Result {
  Status status = Status::kOk;
  std::string message;
};

#if HFNN_WITH_CUDA
// Runs the GEMM on `stream`. The first call for a shape (sizes, lds, transposes, dtype, epilogue,
// beta != 0, the pointers' alignment, device, workspace size) asks cuBLASLt's heuristic; later ones
// reuse its answer. A thread's first call for a shape makes its descriptors; its later ones reuse
// them (the bias pointer, the one attribute that changes from call to call, is set where it
// differs from the last call's).
Result run(const Params& p, cublasLtHandle_t handle, cudaStream_t stream);

// Heuristic queries so far (the shared cache's misses), and descriptor sets made (the threads'
// caches' misses), for tests: both stay put while a model repeats its shapes.
int64_t heuristic_queries();
int64_t descriptor_sets();
#endif

}  // namespace hfnn::kernels::gemm
