// cuBLASLt GEMMs with cached algorithms and descriptors (gemm.h).
#include "kernels/common/gemm.h"

#include "kernels/common/keyed_cache.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>

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

// The heuristic's answer for a key, shared by every thread.
struct Algo {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

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

// One key's descriptors, owned by one thread's cache (made at its first call, destroyed with the
// thread). Per thread, not shared: the bias pointer is an attribute of the operation descriptor, set
// before each launch where it changed, and a shared descriptor would need a lock held from that
// setting through the launch. cuBLASLt reads the descriptors while cublasLtMatmul runs on the host
// (a captured launch keeps its arguments by value), so changing one after that returns is safe.
struct Prepared {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  const void* bias = nullptr;  // what CUBLASLT_MATMUL_DESC_BIAS_POINTER holds now
  Algo algo;
  Prepared() = default;
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
  ~Prepared() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Leaked on purpose: heuristic answers outlive every thread (the autograd engine's device threads
// run their GEMMs until the process ends).
SharedCache<Key, Algo, KeyHash>& algorithms() {
  static auto* cache = new SharedCache<Key, Algo, KeyHash>();
  return *cache;
}
thread_local ThreadCache<Key, Prepared, KeyHash> prepared;
std::atomic<int64_t> queries{0}, descriptor_count{0};

Result error(cublasStatus_t s, const char* what) {
  return {Status::kError, std::string("cuBLASLt ") + what + ": " + cublasLtGetStatusString(s)};
}

// The descriptors of p's problem: the operation (compute type, transposes, epilogue and bias) and
// the three layouts.
Result describe(const Params& p, cublasLtEpilogue_t epilogue, Prepared& e) {
  const ColMajor c = col_major(p);
  const cudaDataType_t type = cuda_type(p.dtype);
  const cudaDataType_t out_type = p.float32_out ? CUDA_R_32F : type;
  const cublasComputeType_t compute =
      p.dtype == DType::kFloat32 && p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasStatus_t s = cublasLtMatmulDescCreate(&e.op, compute, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return error(s, "descriptor");
  cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSA, &c.op_a, sizeof(c.op_a));
  cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSB, &c.op_b, sizeof(c.op_b));
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias));
    e.bias = p.bias;
  }
  if ((s = cublasLtMatrixLayoutCreate(&e.a, type, c.a_rows, c.a_cols, p.ldb)) != CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&e.b, type, c.b_rows, c.b_cols, p.lda)) != CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&e.d, out_type, static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.m), p.ldd)) !=
          CUBLAS_STATUS_SUCCESS)
    return error(s, "layout");
  return {};
}

// cuBLASLt's heuristic for p's problem, described by e.
Result ask_heuristic(const Params& p, cublasLtHandle_t handle, const Prepared& e, cublasLtEpilogue_t epilogue,
                     Algo& out) {
  queries.fetch_add(1, std::memory_order_relaxed);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
  if (s != CUBLAS_STATUS_SUCCESS) return error(s, "preference");
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
  s = cublasLtMatmulAlgoGetHeuristic(handle, e.op, e.a, e.b, e.d, e.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  out.found = s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (out.found) out.algo = result.algo;
  if (std::getenv("HFNN_GEMM_LOG"))
    std::fprintf(stderr, "hfnn gemm: m=%lld n=%lld k=%lld trans=%d%d epilogue=%d beta=%g: %s, waves %.2f\n",
                 static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), p.trans_a,
                 p.trans_b, static_cast<int>(epilogue), p.beta, out.found ? "algorithm" : "none",
                 out.found ? result.wavesCount : 0.0f);
  return {};
}

}  // namespace

int64_t heuristic_queries() { return queries.load(std::memory_order_relaxed); }
int64_t descriptor_sets() { return descriptor_count.load(std::memory_order_relaxed); }

Result run(const Params& p, cublasLtHandle_t handle, cudaStream_t stream) {
  const cublasLtEpilogue_t epilogue = epilogue_of(p);
  int device = p.device;
  if (device < 0) cudaGetDevice(&device);
  const int align_vec = p.bias ? alignment(p.bias) : 16;
  const Key key{p.m, p.n, p.k, p.lda, p.ldb, p.ldd, (p.trans_a ? 1 : 0) | (p.trans_b ? 2 : 0) | (p.beta != 0 ? 4 : 0),
                static_cast<int64_t>(p.dtype) | (p.tf32 ? 16 : 0) | (p.float32_out ? 32 : 0), static_cast<int64_t>(epilogue), alignment(p.a),
                alignment(p.b), alignment(p.d), align_vec, device, static_cast<int64_t>(p.workspace_size), 0};
  Result failed;
  Prepared* e = prepared.get(key, [&](Prepared& fresh) {
    if ((failed = describe(p, epilogue, fresh)).status != Status::kOk) return false;
    if (const auto known = algorithms().find(key)) {
      fresh.algo = *known;
    } else {
      Algo algo;
      if ((failed = ask_heuristic(p, handle, fresh, epilogue, algo)).status != Status::kOk) return false;
      fresh.algo = algorithms().insert(key, algo);
    }
    descriptor_count.fetch_add(1, std::memory_order_relaxed);
    return true;
  });
  if (!e) return failed;
  if (!e->algo.found) return {Status::kNoAlgorithm, "no cuBLASLt algorithm"};
  if (p.bias && p.bias != e->bias) {
    cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias));
    e->bias = p.bias;
  }
  const float alpha = 1.0f, beta = p.beta;
  const cublasStatus_t s = cublasLtMatmul(handle, e->op, &alpha, p.b, e->a, p.a, e->b, &beta, p.d, e->d, p.d, e->d,
                                          &e->algo.algo, p.workspace, p.workspace_size, stream);
  if (s != CUBLAS_STATUS_SUCCESS) return error(s, "matmul");
  return {};
}

}  // namespace hfnn::kernels::gemm
