// Element types the kernels take. Torch-free: the binding layer maps torch's dtypes onto these.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace hfnn::kernels {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

std::size_t dtype_size(DType dtype);
// The name torch prints for the dtype without its "torch." prefix ("float32", "bfloat16", ...).
std::string_view dtype_name(DType dtype);
// The inverse of dtype_name(); nullopt for a dtype the kernels do not take ("float64").
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace hfnn::kernels

namespace hfnn::kernels {

// Host-side element access for references and tests: element i of an array of `dtype`, as float,
// and the reverse with round-to-nearest-even (what the GPU's conversions do).
float host_load(const void* data, DType dtype, std::size_t i);
void host_store(void* data, DType dtype, std::size_t i, float value);

}  // namespace hfnn::kernels
