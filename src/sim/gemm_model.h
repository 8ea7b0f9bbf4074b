// The cost model of a simulated GEMM, shared by the simulated cuBLAS and cuBLASLt.
//
// duration = 2·m·n·k·batch / (peak(dtype) · efficiency) + fixed overhead, where efficiency is
// 0.75 × wave quantization (128×128 tiles over 132 SMs) × 0.5 when a leading dimension is not a
// multiple of 128 bytes (the tensor-core-unfriendly shapes Flare must flag). The clock factor of
// an underclocked rank is applied by the core when the kernel runs.
#pragma once

#include <library_types.h>

#include <cstdint>
#include <string>

namespace flare::sim {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  cudaDataType a_type = CUDA_R_16BF;
  cudaDataType c_type = CUDA_R_16BF;
};

// Bytes of one element of `t` (1 for 8-bit types).
int dataTypeBytes(cudaDataType t);
// Short name used in kernel names: "bf16", "f16", "f32", "e4m3", ...
const char* dataTypeName(cudaDataType t);
// Simulated duration in ns (before the rank's clock factor).
int64_t gemmDurationNs(const GemmShape& s);
// A kernel name shaped like cuBLAS's, e.g. "sm90_xmma_gemm_bf16bf16_bf16f32_tn_tile128x128_sim".
std::string gemmKernelName(const GemmShape& s);

// Launches the GEMM's simulated kernel on `stream` through the driver API, as cuBLAS does.
// Returns a CUresult.
int launchGemm(const GemmShape& s, void* stream);

}  // namespace flare::sim
