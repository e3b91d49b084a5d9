// The LSTM variant `cudnn_persistent`: cuDNN's own persistent kernel (CUDNN_RNN_ALGO_PERSIST_STATIC)
// through cuDNN's RNN API, for one layer in one direction. torch's nn.LSTM asks cuDNN for it only
// in float16, for a module of one layer and one direction with hidden up to 1,024, hidden and input
// multiples of 128 and batch a multiple of 8 up to 128, on sm_80 and later with 98 SMs or more
// (aten/src/ATen/native/cudnn/RNN.cpp, use_persist_*_heuristics); this variant asks for it at any
// shape cuDNN takes, in every dtype, so the tuner times it beside hfnn's persistent kernel and
// torch's choice.
//
// Per call: the weights are copied into cuDNN's weight space (its layout: matrices and biases per
// gate, cudnnGetRNNWeightParams), cuDNN runs the forward and keeps what its backward needs in its
// reserve space; the backward runs cudnnRNNBackwardData_v8 then cudnnRNNBackwardWeights_v8 and
// copies the weight-space gradients back into torch's layout. Gates in torch's order (i, f, g, o)
// are cuDNN's (linear layers 0-3 on x, 4-7 on h). Without biases the weight space's biases are
// zeros (one descriptor for both cases). cuDNN runs the steps t = 0 .. T-1 only: a reverse layer
// runs on x reversed in time (a copy in the workspace) and its y and dx are reversed back.
//
// The workspace holds, for the backward: the weight space, cuDNN's reserve space, y (cuDNN's
// backward reads it), h0 (or zeros), x reversed, the batch's sequence lengths (and the forward's
// work space); the scratch: cuDNN's
// work space, a copy of the reserve space (cuDNN's backward writes into it), the weight gradients,
// dy reversed (or zeros where dy is absent), dx reversed. Their
// sizes come from cuDNN (cudnnGetRNNTempSpaceSizes, cudnnGetRNNWeightSpaceSize), so this variant
// has its own workspace sizes (Variant::fwd_workspace_bytes). cuDNN's backward consumes its reserve
// space (a second backward over the same one is wrong; torch clones it under retain_graph): the
// backward works on a copy, so a second backward over one forward gives the first's gradients.
//
// supports(): cuDNN documents no closed rule for where its persistent kernels run (hidden size,
// batch, dtype and GPU all count). So the answer is cuDNN's own: the first question about a batch,
// input, hidden size and dtype on a device runs a two-step forward and backward on a private stream
// (stream-ordered allocations, so no capture elsewhere is disturbed), in both of float32's math
// modes, and keeps the answer; a failure that is not cuDNN's refusal (out of memory) is not kept.
// A build without cuDNN (CMake found none: HFNN_WITH_CUDNN unset) has the variant take no shape.

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/lstm/lstm_common.cuh"

#if HFNN_WITH_CUDNN
#include <cudnn.h>

namespace hfnn::kernels::lstm::detail {

namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

cudnnDataType_t data_type(DType d) {
  switch (d) {
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    case DType::kFloat32: break;
  }
  return CUDNN_DATA_FLOAT;
}

// Every dtype computes in float32 (torch's cuDNN RNN computes bfloat16 in bfloat16, a precision
// cuDNN's persistent kernel does not take); tensor cores in 16-bit, and in float32 exactly where
// TF32 is allowed, as torch's.
cudnnDataType_t math_precision(DType) { return CUDNN_DATA_FLOAT; }
cudnnMathType_t math_type(DType d, bool tf32) {
  return d == DType::kFloat32 && !tf32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

// This thread's last cuDNN failure (the probe tells a refusal from a failure by its category).
thread_local cudnnStatus_t last_status = CUDNN_STATUS_SUCCESS;
bool is_refusal(cudnnStatus_t st) {
  const auto category = CUDNN_STATUS_CATEGORY(st);
  return category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED;
}

// A cuDNN failure as the variant's error: cudaErrorUnknown, with the message for last_gemm_error().
cudaError_t fail(cudnnStatus_t status, const char* what) {
  last_status = status;
  gemm_error = std::string("cuDNN ") + what + ": " + cudnnGetErrorString(status);
  return cudaErrorUnknown;
}
#define HFNN_CUDNN(call)                                                      \
  do {                                                                        \
    if (const cudnnStatus_t st_ = (call); st_ != CUDNN_STATUS_SUCCESS) return fail(st_, #call); \
  } while (0)

// The device `device` current for the scope (cuDNN binds a handle to the device current at its
// creation; the probe allocates and runs there).
struct DeviceScope {
  int before = -1;
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&before) == cudaSuccess && before != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = -1;
    if (before >= 0 && cudaGetDevice(&now) == cudaSuccess && now != before) cudaSetDevice(before);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};
// A CUDA failure keeps its call's text for last_gemm_error() too: the innermost failure's (the
// entry points clear it first).
cudaError_t fail_cuda(cudaError_t e, const char* what) {
  if (gemm_error.empty()) gemm_error = std::string(what) + ": " + cudaGetErrorString(e);
  return e;
}
#define HFNN_CUDA(call)                                                          \
  do {                                                                           \
    if (const cudaError_t e_ = (call); e_ != cudaSuccess) return fail_cuda(e_, #call); \
  } while (0)

// One cuDNN handle per device and thread (cuDNN's rule: a handle is not used by two threads at once).
cudnnStatus_t handle_for(int device, cudnnHandle_t& out) {
  thread_local std::vector<std::pair<int, cudnnHandle_t>> handles;
  for (const auto& [d, h] : handles)
    if (d == device) return out = h, CUDNN_STATUS_SUCCESS;
  cudnnHandle_t h = nullptr;
  const DeviceScope scope(device);
  if (const cudnnStatus_t st = cudnnCreate(&h); st != CUDNN_STATUS_SUCCESS) return st;
  handles.emplace_back(device, h);
  out = h;
  return CUDNN_STATUS_SUCCESS;
}

// The descriptors of one (T, B, I, H, dtype, math) on a device, and the sizes cuDNN gives them.
struct Descriptors {
  cudnnHandle_t handle = nullptr;
  cudnnDropoutDescriptor_t dropout = nullptr;
  cudnnRNNDescriptor_t rnn = nullptr;
  cudnnRNNDataDescriptor_t x = nullptr, y = nullptr;
  cudnnTensorDescriptor_t h = nullptr;  // h0, h_n, c0, c_n: [1, B, H]
  std::size_t weight_bytes = 0, work_bytes = 0, reserve_bytes = 0;

  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (h) cudnnDestroyTensorDescriptor(h);
    if (y) cudnnDestroyRNNDataDescriptor(y);
    if (x) cudnnDestroyRNNDataDescriptor(x);
    if (rnn) cudnnDestroyRNNDescriptor(rnn);
    if (dropout) cudnnDestroyDropoutDescriptor(dropout);
  }

  cudnnStatus_t build(const Shape& s, cudnnMathType_t math) {
    cudnnStatus_t st = handle_for(s.device.device, handle);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    const int T = static_cast<int>(s.steps), B = static_cast<int>(s.batch);
    const int I = static_cast<int>(s.input), H = static_cast<int>(s.hidden);
    const cudnnDataType_t dt = data_type(s.dtype);
    auto ok = [&](cudnnStatus_t r) { return (st = r) == CUDNN_STATUS_SUCCESS; };
    if (!ok(cudnnCreateDropoutDescriptor(&dropout)) || !ok(cudnnSetDropoutDescriptor(dropout, handle, 0.0f, nullptr, 0, 0)))
      return st;
    if (!ok(cudnnCreateRNNDescriptor(&rnn)) ||
        !ok(cudnnSetRNNDescriptor_v8(rnn, CUDNN_RNN_ALGO_PERSIST_STATIC, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS,
                                     CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, dt, math_precision(s.dtype), math, I, H,
                                     H, 1, dropout, CUDNN_RNN_PADDED_IO_DISABLED)))
      return st;
    const std::vector<int> lengths(static_cast<std::size_t>(B), T);
    if (!ok(cudnnCreateRNNDataDescriptor(&x)) ||
        !ok(cudnnSetRNNDataDescriptor(x, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I, lengths.data(), nullptr)))
      return st;
    if (!ok(cudnnCreateRNNDataDescriptor(&y)) ||
        !ok(cudnnSetRNNDataDescriptor(y, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, H, lengths.data(), nullptr)))
      return st;
    const int dims[3] = {1, B, H}, strides[3] = {B * H, H, 1};
    if (!ok(cudnnCreateTensorDescriptor(&h)) || !ok(cudnnSetTensorNdDescriptor(h, dt, 3, dims, strides))) return st;
    if (!ok(cudnnGetRNNWeightSpaceSize(handle, rnn, &weight_bytes))) return st;
    return cudnnGetRNNTempSpaceSizes(handle, rnn, CUDNN_FWD_MODE_TRAINING, x, &work_bytes, &reserve_bytes);
  }
};

// The descriptors of a shape, built once and kept (a few shapes a thread: the op asks for the
// sizes and runs the same shape over and over). nullptr with the status where cuDNN refused.
const Descriptors* descriptors(const Shape& s, cudnnMathType_t math, cudnnStatus_t& status) {
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, DType, cudnnMathType_t>;
  struct Entry {
    Key key;
    std::unique_ptr<Descriptors> d;
  };
  thread_local std::array<Entry, 8> cache;
  thread_local unsigned next = 0;
  const Key key{s.device.device, s.steps, s.batch, s.input, s.hidden, s.dtype, math};
  for (const Entry& e : cache)
    if (e.d && e.key == key) return status = CUDNN_STATUS_SUCCESS, e.d.get();
  auto d = std::make_unique<Descriptors>();
  status = d->build(s, math);
  if (status != CUDNN_STATUS_SUCCESS) return nullptr;
  Entry& slot = cache[next++ % cache.size()];
  slot.key = key, slot.d = std::move(d);
  return slot.d.get();
}

// Byte offsets in the forward's workspace and the backward's scratch (each kAlign-aligned). cuDNN's
// sizes are the largest of the dtype's math modes (float32: TF32 or not), so the layout of a shape
// is one whatever torch's setting is when the forward and the backward run. What cuDNN keeps in its
// reserve space is its own: like torch's cuDNN path, which builds the backward's descriptor with the
// setting of its own time, a float32 forward and its backward must run under one TF32 setting.
struct Layout {
  std::size_t weights = 0, reserve = 0, y = 0, h0 = 0, xr = 0, lengths = 0, work_fwd = 0, fwd_bytes = 0;
  std::size_t work = 0, reserve_copy = 0, dweights = 0, dyr = 0, dxr = 0, bwd_bytes = 0;
  std::size_t reserve_bytes = 0;
  bool ok = false;  // cuDNN described the shape in every math mode
};
Layout layout_of(const Shape& s) {
  Layout l;
  std::size_t weight_bytes = 0, work_bytes = 0, reserve_bytes = 0;
  for (const bool tf32 : {true, false}) {
    if (!tf32 && s.dtype != DType::kFloat32) break;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    const Descriptors* d = descriptors(s, math_type(s.dtype, tf32), st);
    if (!d) return l;
    weight_bytes = std::max(weight_bytes, d->weight_bytes);
    work_bytes = std::max(work_bytes, d->work_bytes);
    reserve_bytes = std::max(reserve_bytes, d->reserve_bytes);
  }
  const std::size_t e = dtype_size(s.dtype);
  const auto T = static_cast<std::size_t>(s.steps), B = static_cast<std::size_t>(s.batch);
  const auto I = static_cast<std::size_t>(s.input), H = static_cast<std::size_t>(s.hidden);
  std::size_t at = 0;
  l.weights = at, at = align_up(at + weight_bytes);
  l.reserve = at, at = align_up(at + reserve_bytes);
  l.y = at, at = align_up(at + T * B * H * e);
  l.h0 = at, at = align_up(at + B * H * e);
  l.xr = at, at = align_up(at + T * B * I * e);
  l.lengths = at, at = align_up(at + B * sizeof(int));
  l.work_fwd = at, at = align_up(at + work_bytes);  // the forward's own: the scratch is the backward's
  l.fwd_bytes = at;
  at = 0;
  l.work = at, at = align_up(at + work_bytes);
  l.reserve_copy = at, at = align_up(at + reserve_bytes);
  l.reserve_bytes = reserve_bytes;
  l.dweights = at, at = align_up(at + weight_bytes);
  l.dyr = at, at = align_up(at + T * B * H * e);
  l.dxr = at, at = align_up(at + T * B * I * e);
  l.bwd_bytes = at;
  l.ok = true;
  return l;
}

// Rows [T, n] reversed in time: dst[t] = src[T-1-t], each row n elements of E bytes.
template <typename E>
__global__ void reverse_steps_kernel(const E* src, E* dst, int64_t steps, int64_t row) {
  const int64_t total = steps * row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, k = i - t * row;
    dst[(steps - 1 - t) * row + k] = src[i];
  }
}
cudaError_t reverse_steps(const void* src, void* dst, const Shape& s, int64_t width, cudaStream_t stream) {
  const int64_t row = s.batch * width;
  const int64_t blocks = std::min<int64_t>((s.steps * row + 255) / 256, 4096);
  if (dtype_size(s.dtype) == 4)
    return launch_plain(reverse_steps_kernel<uint32_t>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
                        static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), s.steps, row);
  return launch_plain(reverse_steps_kernel<uint16_t>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
                      static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), s.steps, row);
}

__global__ void fill_kernel(int* out, int n, int value) {
  const int i = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

// The addresses of the weight space's eight matrices and biases (linear layers 0-3 on x, 4-7 on h,
// gates i, f, g, o), each checked to hold what torch's layout gives it.
struct Params {
  std::array<void*, 8> matrix{}, bias{};
};
cudaError_t weight_params(const Shape& s, const Descriptors& d, void* space, Params& out) {
  cudnnTensorDescriptor_t m = nullptr, b = nullptr;
  cudnnCreateTensorDescriptor(&m);
  cudnnCreateTensorDescriptor(&b);
  // The number of elements a descriptor describes (0 where it cannot be read).
  auto elements = [](cudnnTensorDescriptor_t t) -> int64_t {
    cudnnDataType_t type;
    int rank = 0, dims[8] = {}, strides[8] = {};
    if (cudnnGetTensorNdDescriptor(t, 8, &type, &rank, dims, strides) != CUDNN_STATUS_SUCCESS || rank < 1) return 0;
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  };
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  bool shapes = true;
  for (int layer = 0; layer < 8 && st == CUDNN_STATUS_SUCCESS; ++layer) {
    st = cudnnGetRNNWeightParams(d.handle, d.rnn, 0, d.weight_bytes, space, layer, m, &out.matrix[layer], b,
                                 &out.bias[layer]);
    // torch's layout: each gate's W_ih rows [H, I] (layers 0-3), W_hh rows [H, H] (4-7), biases [H]
    if (st == CUDNN_STATUS_SUCCESS)
      shapes = shapes && out.matrix[layer] && out.bias[layer] &&
               elements(m) == s.hidden * (layer < 4 ? s.input : s.hidden) && elements(b) == s.hidden;
  }
  cudnnDestroyTensorDescriptor(m);
  cudnnDestroyTensorDescriptor(b);
  if (st != CUDNN_STATUS_SUCCESS) return fail(st, "cudnnGetRNNWeightParams");
  if (!shapes) return fail(CUDNN_STATUS_INTERNAL_ERROR, "weight space not in torch's gate layout");
  return cudaSuccess;
}

// Device-to-device copies, adjacent ones of one tensor merged (cuDNN keeps a layer's four gates one
// after the other, as torch does: one copy a tensor, where cuDNN lays them so). Two tensors that
// happen to be adjacent in memory stay two copies: a copy across two allocations is refused.
struct Copy {
  char* dst;
  const char* src;
  std::size_t bytes;
  int tensor;  // which of torch's tensors: copies merge within one (adjacent allocations are not one range)
};
cudaError_t run_copies(std::vector<Copy> copies, cudaStream_t stream) {
  std::vector<Copy> merged;
  for (const Copy& c : copies) {
    if (!merged.empty() && merged.back().tensor == c.tensor && merged.back().dst + merged.back().bytes == c.dst &&
        merged.back().src + merged.back().bytes == c.src)
      merged.back().bytes += c.bytes;
    else
      merged.push_back(c);
  }
  for (const Copy& c : merged) {
    if (const cudaError_t e = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream); e != cudaSuccess)
      return fail_cuda(e, ("cudaMemcpyAsync of " + std::to_string(c.bytes) + " bytes, " +
                           std::to_string(reinterpret_cast<std::uintptr_t>(c.src)) + " -> " +
                           std::to_string(reinterpret_cast<std::uintptr_t>(c.dst))).c_str());
  }
  return cudaSuccess;
}

// torch's w_ih [4H, I], w_hh [4H, H], b_ih, b_hh [4H] <-> the weight space (to = true: into it).
// Absent biases: zeros into the space (to), nothing out of it.
cudaError_t move_weights(const Shape& s, const Params& w, const void* w_ih, const void* w_hh, const void* b_ih,
                         const void* b_hh, void* dw_ih, void* dw_hh, void* db, bool to, cudaStream_t stream) {
  const std::size_t e = dtype_size(s.dtype);
  const auto I = static_cast<std::size_t>(s.input), H = static_cast<std::size_t>(s.hidden);
  std::vector<Copy> copies;
  auto add = [&](int tensor, void* space, const void* torch_in, void* torch_out, std::size_t offset,
                 std::size_t bytes) {
    if (to)
      copies.push_back({static_cast<char*>(space), static_cast<const char*>(torch_in) + offset, bytes, tensor});
    else
      copies.push_back({static_cast<char*>(torch_out) + offset, static_cast<const char*>(space), bytes, tensor});
  };
  for (std::size_t g = 0; g < 4; ++g) add(0, w.matrix[g], w_ih, dw_ih, g * H * I * e, H * I * e);
  for (std::size_t g = 0; g < 4; ++g) add(1, w.matrix[4 + g], w_hh, dw_hh, g * H * H * e, H * H * e);
  if (to) {
    // each bias given or zeros (lstm.h lets either be absent on its own)
    for (std::size_t g = 0; g < 4; ++g) {
      if (b_ih)
        add(2, w.bias[g], b_ih, nullptr, g * H * e, H * e);
      else
        HFNN_CUDA(cudaMemsetAsync(w.bias[g], 0, H * e, stream));
      if (b_hh)
        add(3, w.bias[4 + g], b_hh, nullptr, g * H * e, H * e);
      else
        HFNN_CUDA(cudaMemsetAsync(w.bias[4 + g], 0, H * e, stream));
    }
  } else {
    // db: the gradient of b_ih (b_hh's is the same sums: cuDNN gives both)
    for (std::size_t g = 0; g < 4; ++g) add(2, w.bias[g], nullptr, db, g * H * e, H * e);
  }
  return run_copies(std::move(copies), stream);
}

// What both passes start with: the layout, then the descriptors of the call's math mode on the
// stream. The layout first: it may build descriptors, and a build may reuse the cache slot of a
// pointer taken before it; the descriptors are then found built and the pointer stays valid.
cudaError_t prepare(const Shape& s, bool tf32, cudaStream_t stream, Layout& l, const Descriptors*& d) {
  gemm_error.clear();
  l = layout_of(s);
  if (!l.ok) return fail(CUDNN_STATUS_NOT_SUPPORTED, "layout");
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  d = descriptors(s, math_type(s.dtype, tf32), st);
  if (!d) return fail(st, "descriptors");
  HFNN_CUDNN(cudnnSetStream(d->handle, stream));
  return cudaSuccess;
}

cudaError_t forward_impl(const FwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  Layout l;
  const Descriptors* d = nullptr;
  HFNN_CUDA(prepare(s, p.gemm.tf32, stream, l, d));
  auto* ws = static_cast<char*>(p.workspace);
  const std::size_t e = dtype_size(s.dtype);
  const auto B = static_cast<std::size_t>(s.batch), H = static_cast<std::size_t>(s.hidden);
  Params w;
  HFNN_CUDA(weight_params(s, *d, ws + l.weights, w));
  HFNN_CUDA(move_weights(s, w, p.w_ih, p.w_hh, p.b_ih, p.b_hh, nullptr, nullptr, nullptr, true, stream));
  if (p.h0)
    HFNN_CUDA(cudaMemcpyAsync(ws + l.h0, p.h0, B * H * e, cudaMemcpyDeviceToDevice, stream));
  else
    HFNN_CUDA(cudaMemsetAsync(ws + l.h0, 0, B * H * e, stream));
  auto* lengths = reinterpret_cast<int*>(ws + l.lengths);
  HFNN_CUDA(launch_plain(fill_kernel, dim3(static_cast<unsigned>((B + 255) / 256)), dim3(256), 0, stream, lengths,
                         static_cast<int>(B), static_cast<int>(s.steps)));
  const void* x = p.x;
  if (p.reverse) {
    HFNN_CUDA(reverse_steps(p.x, ws + l.xr, s, s.input, stream));
    x = ws + l.xr;
  }
  HFNN_CUDNN(cudnnRNNForward(d->handle, d->rnn, CUDNN_FWD_MODE_TRAINING, lengths, d->x, x, d->y, ws + l.y, d->h,
                             ws + l.h0, p.h_n, d->h, p.c0, p.c_n, d->weight_bytes, ws + l.weights, d->work_bytes,
                             ws + l.work_fwd, d->reserve_bytes, ws + l.reserve));
  if (p.reverse)
    HFNN_CUDA(reverse_steps(ws + l.y, p.y, s, s.hidden, stream));
  else
    HFNN_CUDA(cudaMemcpyAsync(p.y, ws + l.y, static_cast<std::size_t>(s.steps) * B * H * e, cudaMemcpyDeviceToDevice,
                              stream));
  return cudaSuccess;
}

cudaError_t backward_impl(const BwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  Layout l;
  const Descriptors* d = nullptr;
  HFNN_CUDA(prepare(s, p.gemm.tf32, stream, l, d));
  const auto* ws = static_cast<const char*>(p.workspace);
  auto* sc = static_cast<char*>(p.scratch);
  const std::size_t e = dtype_size(s.dtype);
  const auto T = static_cast<std::size_t>(s.steps), B = static_cast<std::size_t>(s.batch);
  const auto H = static_cast<std::size_t>(s.hidden);
  const auto* lengths = reinterpret_cast<const int*>(ws + l.lengths);
  const void* dy = p.dy;
  if (!dy) {
    HFNN_CUDA(cudaMemsetAsync(sc + l.dyr, 0, T * B * H * e, stream));
    dy = sc + l.dyr;
  } else if (p.reverse) {
    HFNN_CUDA(reverse_steps(p.dy, sc + l.dyr, s, s.hidden, stream));
    dy = sc + l.dyr;
  }
  void* dx = p.reverse ? static_cast<void*>(sc + l.dxr) : p.dx;
  // cuDNN's backward consumes its reserve space: a second backward over the same one computes wrong
  // gradients (H100, cuDNN 9.19: relative errors about 1 in every gradient, float32 and float16;
  // LstmKernels.EveryVariantsSecondBackwardOverOneForwardAgrees). torch's autograd clones the
  // reserve where retain_graph is set; the op cannot see that flag, so the backward always works on
  // a copy (one device copy of the reserve a call), the forward's workspace stays read only and a
  // second backward gets the first's gradients.
  char* reserve = sc + l.reserve_copy;
  HFNN_CUDA(cudaMemcpyAsync(reserve, ws + l.reserve, l.reserve_bytes, cudaMemcpyDeviceToDevice, stream));
  // cuDNN takes the weight space by a non-const pointer; it does not write it in the backward.
  void* weights = const_cast<char*>(ws + l.weights);
  Params w;
  HFNN_CUDA(weight_params(s, *d, weights, w));
  HFNN_CUDNN(cudnnRNNBackwardData_v8(d->handle, d->rnn, lengths, d->y, ws + l.y, dy, d->x, dx, d->h, ws + l.h0,
                                     p.dh_n, p.dh0, d->h, p.c0, p.dc_n, p.dc0, d->weight_bytes, weights,
                                     d->work_bytes, sc + l.work, d->reserve_bytes, reserve));
  const void* x = p.reverse ? static_cast<const void*>(ws + l.xr) : p.x;
  HFNN_CUDA(cudaMemsetAsync(sc + l.dweights, 0, d->weight_bytes, stream));
  HFNN_CUDNN(cudnnRNNBackwardWeights_v8(d->handle, d->rnn, CUDNN_WGRAD_MODE_ADD, lengths, d->x, x, d->h, ws + l.h0,
                                        d->y, ws + l.y, d->weight_bytes, sc + l.dweights, d->work_bytes, sc + l.work,
                                        d->reserve_bytes, reserve));
  if (p.reverse) HFNN_CUDA(reverse_steps(sc + l.dxr, p.dx, s, s.input, stream));
  Params dw;
  HFNN_CUDA(weight_params(s, *d, sc + l.dweights, dw));
  HFNN_CUDA(move_weights(s, dw, nullptr, nullptr, nullptr, nullptr, p.dw_ih, p.dw_hh, p.db, false, stream));
  return cudaSuccess;
}

}  // namespace

// ---- the variant's entry points --------------------------------------------------------------

namespace {

bool shape_ok(const Shape& s) {
  // cuDNN's sizes are int; valid_shape() keeps the rest within what the other variants take.
  // The probe runs two steps: a sequence's whole x and y within int too, whatever cuDNN indexes with.
  return valid_shape(s) && s.device.device >= 0 && s.device.cc_major >= 6 && s.steps <= INT_MAX / 2 &&
         s.batch * std::max(s.input, s.hidden) <= INT_MAX / s.steps;
}

// Whether cuDNN runs a forward and a backward of (B, I, H, dtype) in one math mode: two steps on a
// private stream, inputs zero. A refusal is cuDNN's status; anything else (an allocation that
// failed) is `inconclusive`.
bool probe_once(const Shape& s, bool tf32, bool& inconclusive) {
  Shape t = s;
  t.steps = 2;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (!descriptors(t, math_type(t.dtype, tf32), st)) {
    inconclusive = !is_refusal(st);
    return false;
  }
  const Layout l = layout_of(t);
  if (!l.ok) return inconclusive = true, false;  // another math mode's descriptors failed: asked again
  const std::size_t e = dtype_size(t.dtype);
  const auto T = static_cast<std::size_t>(t.steps), B = static_cast<std::size_t>(t.batch);
  const auto I = static_cast<std::size_t>(t.input), H = static_cast<std::size_t>(t.hidden);
  // (x, w_ih, w_hh, b, state, y and every gradient) in one block after the workspace and scratch
  const std::size_t sizes[] = {l.fwd_bytes, l.bwd_bytes, T * B * I * e, 4 * H * I * e, 4 * H * H * e,
                               4 * H * e,   4 * H * e,   B * H * e,     B * H * e,     T * B * H * e,
                               B * H * e,   B * H * e,   T * B * I * e, 4 * H * I * e, 4 * H * H * e,
                               4 * H * e,   B * H * e,   B * H * e};
  std::size_t total = 0;
  for (const std::size_t n : sizes) total += align_up(n);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return inconclusive = true, false;
  char* base = nullptr;
  bool ran = false;
  if (cudaMallocAsync(reinterpret_cast<void**>(&base), total, stream) == cudaSuccess) {
    cudaMemsetAsync(base, 0, total, stream);
    std::vector<char*> at;
    std::size_t off = 0;
    for (const std::size_t n : sizes) at.push_back(base + off), off += align_up(n);
    FwdParams f;
    f.shape = t, f.workspace = at[0], f.x = at[2], f.w_ih = at[3], f.w_hh = at[4], f.b_ih = at[5], f.b_hh = at[6];
    f.h0 = at[7], f.c0 = at[8], f.y = at[9], f.h_n = at[10], f.c_n = at[11];
    f.gemm.tf32 = tf32;
    BwdParams b;
    b.shape = t, b.workspace = at[0], b.scratch = at[1], b.x = at[2], b.w_ih = at[3], b.w_hh = at[4], b.c0 = at[8];
    b.dy = at[9], b.dx = at[12], b.dw_ih = at[13], b.dw_hh = at[14], b.db = at[15], b.dh0 = at[16], b.dc0 = at[17];
    b.gemm.tf32 = tf32;
    const cudaError_t fe = forward_impl(f, stream);
    const cudaError_t be = fe == cudaSuccess ? backward_impl(b, stream) : fe;
    const cudaError_t se = cudaStreamSynchronize(stream);
    ran = fe == cudaSuccess && be == cudaSuccess && se == cudaSuccess;
    // a refusal by cuDNN is an answer; anything else (out of memory, a CUDA error) is not
    inconclusive = !ran && (be != cudaErrorUnknown || se != cudaSuccess || !is_refusal(last_status));
    cudaFreeAsync(base, stream);
    cudaStreamSynchronize(stream);
  } else {
    (void)cudaGetLastError();
    inconclusive = true;
  }
  cudaStreamDestroy(stream);
  return ran;
}

// probe_once in every math mode the dtype has (float32: TF32 on and off), answers kept per device.
bool probe(const Shape& s) {
  using Key = std::tuple<int, int64_t, int64_t, int64_t, DType>;
  static std::mutex mutex;
  static std::vector<std::pair<Key, bool>> known;
  const Key key{s.device.device, s.batch, s.input, s.hidden, s.dtype};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [k, v] : known)
      if (k == key) return v;
  }
  // Allocations and a synchronisation of our own stream only: allowed while another stream captures.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const DeviceScope scope(s.device.device);
  cudaThreadExchangeStreamCaptureMode(&mode);
  bool inconclusive = false, ok = probe_once(s, true, inconclusive);
  if (ok && s.dtype == DType::kFloat32) ok = probe_once(s, false, inconclusive);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (!inconclusive) {
    const std::lock_guard<std::mutex> lock(mutex);
    known.emplace_back(key, ok);
  }
  return ok;
}

}  // namespace

std::size_t cudnn_fwd_workspace_bytes(const Shape& s) { return shape_ok(s) ? layout_of(s).fwd_bytes : 0; }
std::size_t cudnn_bwd_scratch_bytes(const Shape& s) { return shape_ok(s) ? layout_of(s).bwd_bytes : 0; }

bool cudnn_supports(const Shape& s) { return shape_ok(s) && probe(s); }

cudaError_t cudnn_forward(const FwdParams& p, cudaStream_t stream) {
  if (!cudnn_supports(p.shape)) return cudaErrorInvalidConfiguration;
  return forward_impl(p, stream);
}

cudaError_t cudnn_backward(const BwdParams& p, cudaStream_t stream) {
  if (!cudnn_supports(p.shape)) return cudaErrorInvalidConfiguration;
  return backward_impl(p, stream);
}

}  // namespace hfnn::kernels::lstm::detail

#else  // built without cuDNN (CMake found none): the variant takes no shape

namespace hfnn::kernels::lstm::detail {

std::size_t cudnn_fwd_workspace_bytes(const Shape&) { return 0; }
std::size_t cudnn_bwd_scratch_bytes(const Shape&) { return 0; }
bool cudnn_supports(const Shape&) { return false; }
cudaError_t cudnn_forward(const FwdParams&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t cudnn_backward(const BwdParams&, cudaStream_t) { return cudaErrorNotSupported; }

}  // namespace hfnn::kernels::lstm::detail

#endif  // HFNN_WITH_CUDNN
