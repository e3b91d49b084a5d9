// torch's dtypes as the kernels' (kernels/common/dtype.h), for the op files.
#pragma once
#include <c10/core/ScalarType.h>

#include <optional>

#include "kernels/common/dtype.h"

namespace hfnn {

// nullopt for a dtype no kernel takes (float64, integers): those calls run torch's kernels.
inline std::optional<kernels::DType> kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kernels::DType::kFloat32;
    case at::kHalf: return kernels::DType::kFloat16;
    case at::kBFloat16: return kernels::DType::kBFloat16;
    default: return std::nullopt;
  }
}

}  // namespace hfnn
