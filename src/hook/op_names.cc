// Naming helpers (op_names.h).
#include "src/hook/op_names.h"

#include <library_types.h>

#include <cstdlib>
#include <string>

#include "src/common/log.h"

namespace flare::hook {

uint64_t hashBytes(const void* data, size_t n, uint64_t seed) {
  auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

const char* cudaDataTypeName(int type) {
  switch (static_cast<cudaDataType>(type)) {
    case CUDA_R_64F:
      return "f64";
    case CUDA_R_32F:
      return "f32";
    case CUDA_R_16F:
      return "f16";
    case CUDA_R_16BF:
      return "bf16";
    case CUDA_R_8F_E4M3:
      return "e4m3";
    case CUDA_R_8F_E5M2:
      return "e5m2";
    case CUDA_R_8I:
      return "i8";
    case CUDA_R_32I:
      return "i32";
    default:
      return "other";
  }
}

bool looksLikeAttention(const std::string& name) {
  for (const char* s : {"flash", "fmha", "attention", "sdpa", "Attention"}) {
    if (name.find(s) != std::string::npos) return true;
  }
  return false;
}

std::string unnamedKernel(const char* api, const std::string& tried) {
  common::logOnce(common::LogLevel::kInfo, "hook", std::string("kernel-unnamed-") + api,
                  "flare: a kernel launched through {} has no name ({}): it is recorded as "
                  "kernel@unknown (a plain kernel: an attention kernel's FLOPs, which come by "
                  "name, are not counted), and so is every other kernel no lookup names",
                  api, tried);
  return "kernel@unknown";
}

std::string lookupResult(bool present, const char* type, int code) {
  return present ? std::string(type) + " " + std::to_string(code) : std::string("absent");
}

}  // namespace flare::hook
