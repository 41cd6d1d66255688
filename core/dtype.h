// Element types of tensors as they appear in checkpoints, caches and activations.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace m3 {

enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn: no infinities, max 448
  kF8E5M2,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
};

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// safetensors header spelling ("F32", "BF16", "F8_E4M3", ...); nullopt when unknown.
std::optional<DType> dtype_from_safetensors(std::string_view name);

enum class Device : uint8_t { kCpu, kCuda };
std::string_view device_name(Device device);

}  // namespace m3
