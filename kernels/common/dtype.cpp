#include "kernels/common/dtype.h"

namespace hfnn::kernels {

std::size_t dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    if (dtype_name(d) == name) return d;
  return std::nullopt;
}

}  // namespace hfnn::kernels

#include <bit>
#include <cmath>
#include <cstdint>

namespace hfnn::kernels {
namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_half(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to inf
  if (a < std::ldexp(1.0f, -14)) {           // subnormal half: multiples of 2^-24, nearest-even
    const float scaled = a * std::ldexp(1.0f, 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: keep 10 mantissa bits, round to nearest even on the 13 dropped.
  uint32_t abits = std::bit_cast<uint32_t>(a);
  const uint32_t lsb = (abits >> 13) & 1u;
  abits += 0xfffu + lsb;
  const uint32_t exp = (abits >> 23) - 112;
  return sign | static_cast<uint16_t>((exp << 10) | ((abits >> 13) & 0x3ffu));
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

float host_load(const void* data, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(data)[i];
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

void host_store(void* data, DType dtype, std::size_t i, float value) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(data)[i] = value; break;
    case DType::kFloat16: static_cast<uint16_t*>(data)[i] = float_to_half(value); break;
    case DType::kBFloat16: static_cast<uint16_t*>(data)[i] = float_to_bf16(value); break;
  }
}

}  // namespace hfnn::kernels
