#include "core/dtype.h"

namespace m3 {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF64: return "F64";
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (DType d : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                  DType::kF8E5M2, DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU8,
                  DType::kBool}) {
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

std::string_view device_name(Device device) {
  return device == Device::kCpu ? "cpu" : "cuda";
}

}  // namespace m3
