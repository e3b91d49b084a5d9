// What the GPU tests share: why they skip, and device memory that frees itself. CUDA builds only.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace hfnn::test {

// Why GPU tests cannot run here ("" where they can).
inline std::string no_gpu_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device";
  return {};
}

struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) {
    if (n) cudaMalloc(&ptr, n);
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void poison() const { cudaMemset(ptr, 0xff, bytes); }  // NaN in every float format
  std::vector<unsigned char> bytes_back() const {
    std::vector<unsigned char> h(bytes);
    cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
};

}  // namespace hfnn::test
