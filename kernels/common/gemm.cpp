// cuBLASLt GEMMs with cached algorithms (gemm.h).
#include "kernels/common/gemm.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace hfnn::kernels::gemm {
namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

int alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  for (int a = 16; a > 1; a /= 2)
    if (v % static_cast<std::uintptr_t>(a) == 0) return a;
  return 1;
}

cublasLtEpilogue_t epilogue_of(const Params& p) {
  return p.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// What the heuristic's answer depends on.
using Key = std::array<int64_t, 16>;
struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

std::mutex cache_mutex;
std::unordered_map<Key, Entry, KeyHash> cache;
std::atomic<int64_t> queries{0};

// The column-major problem cuBLASLt sees: D^T[n, m] = op(B)^T op(A)^T, so cuBLAS's A is our B.
struct ColMajor {
  cublasOperation_t op_a, op_b;
  uint64_t a_rows, a_cols, b_rows, b_cols;
};

ColMajor col_major(const Params& p) {
  ColMajor c{};
  // Our B, row-major [k, n] (or [n, k] with trans_b), is column-major [n, k] (or [k, n]).
  c.op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.a_rows = static_cast<uint64_t>(p.trans_b ? p.k : p.n), c.a_cols = static_cast<uint64_t>(p.trans_b ? p.n : p.k);
  c.op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.b_rows = static_cast<uint64_t>(p.trans_a ? p.m : p.k), c.b_cols = static_cast<uint64_t>(p.trans_a ? p.k : p.m);
  return c;
}

struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~Descriptors() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Result error(cublasStatus_t s, const char* what) {
  return {Status::kError, std::string("cuBLASLt ") + what + ": " + cublasLtGetStatusString(s)};
}

}  // namespace

int64_t heuristic_queries() { return queries.load(std::memory_order_relaxed); }

Result run(const Params& p, cublasLtHandle_t handle, cudaStream_t stream) {
  const ColMajor c = col_major(p);
  const cudaDataType_t type = cuda_type(p.dtype);
  const cudaDataType_t out_type = p.float32_out ? CUDA_R_32F : type;
  const cublasComputeType_t compute =
      p.dtype == DType::kFloat32 && p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasLtEpilogue_t epilogue = epilogue_of(p);
  Descriptors desc;
  cublasStatus_t s = cublasLtMatmulDescCreate(&desc.op, compute, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return error(s, "descriptor");
  cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &c.op_a, sizeof(c.op_a));
  cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &c.op_b, sizeof(c.op_b));
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias));
  }
  if ((s = cublasLtMatrixLayoutCreate(&desc.a, type, c.a_rows, c.a_cols, p.ldb)) != CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&desc.b, type, c.b_rows, c.b_cols, p.lda)) != CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&desc.d, out_type, static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.m), p.ldd)) !=
          CUBLAS_STATUS_SUCCESS)
    return error(s, "layout");

  int device = 0;
  cudaGetDevice(&device);
  const int align_vec = p.bias ? alignment(p.bias) : 16;
  const Key key{p.m, p.n, p.k, p.lda, p.ldb, p.ldd, (p.trans_a ? 1 : 0) | (p.trans_b ? 2 : 0) | (p.beta != 0 ? 4 : 0),
                static_cast<int64_t>(p.dtype) | (p.tf32 ? 16 : 0) | (p.float32_out ? 32 : 0), static_cast<int64_t>(epilogue), alignment(p.a),
                alignment(p.b), alignment(p.d), align_vec, device, static_cast<int64_t>(p.workspace_size), 0};
  Entry entry;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(key);
    if (it != cache.end()) entry = it->second, cached = true;
  }
  if (!cached) {
    queries.fetch_add(1, std::memory_order_relaxed);
    cublasLtMatmulPreference_t pref = nullptr;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS) return error(s, "preference");
    const uint64_t ws = p.workspace_size;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    // cuBLAS's A is our B and the other way round.
    const uint32_t al_a = static_cast<uint32_t>(alignment(p.b)), al_b = static_cast<uint32_t>(alignment(p.a)),
                   al_d = static_cast<uint32_t>(alignment(p.d));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    s = cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    entry.found = s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (entry.found) entry.algo = result.algo;
    if (std::getenv("HFNN_GEMM_LOG"))
      std::fprintf(stderr, "hfnn gemm: m=%lld n=%lld k=%lld trans=%d%d epilogue=%d beta=%g: %s, waves %.2f\n",
                   static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), p.trans_a,
                   p.trans_b, static_cast<int>(epilogue), p.beta, entry.found ? "algorithm" : "none",
                   entry.found ? result.wavesCount : 0.0f);
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache.emplace(key, entry);
  }
  if (!entry.found) return {Status::kNoAlgorithm, "no cuBLASLt algorithm"};
  const float alpha = 1.0f, beta = p.beta;
  s = cublasLtMatmul(handle, desc.op, &alpha, p.b, desc.a, p.a, desc.b, &beta, p.d, desc.d, p.d, desc.d, &entry.algo,
                     p.workspace, p.workspace_size, stream);
  if (s != CUBLAS_STATUS_SUCCESS) return error(s, "matmul");
  return {};
}

}  // namespace hfnn::kernels::gemm
