// The simulated cuBLAS/cuBLASLt: GEMM kernels take the time of the cost model, computed here
// independently from the formula in gemm_model.h.
#include <gtest/gtest.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <thread>

#include "src/sim/testing/sim_kernels.h"

namespace {

// These tests check the cost model's own durations: no command gap between back-to-back
// commands unless the environment sets one (the simulator's default is the H200's 1.3 us;
// tests/python/test_event_gap.py checks the gap). Set before the first CUDA call loads the
// simulator's settings.
[[maybe_unused]] const bool kNoCommandGap = (setenv("FLARE_SIM_COMMAND_GAP_US", "0", 0), true);

// Expected duration (ms) of a GEMM: 3 µs + 2mnk·b / (peak · 0.75 · wave efficiency · align).
double expectedMs(double m, double n, double k, double batch, int elt_bytes, double peak_tflops) {
  double tiles = std::ceil(m / 128) * std::ceil(n / 128) * batch;
  double waves = std::ceil(tiles / 132);
  double eff = 0.75 * tiles / (waves * 132);
  auto aligned = [&](double d) { return std::fmod(d * elt_bytes, 128) == 0; };
  if (!aligned(m) || !aligned(n) || !aligned(k)) eff *= 0.5;
  return 1e3 * (3e-6 + 2 * m * n * k * batch / (peak_tflops * 1e12 * eff));
}

// GEMMs are queued behind a busy kernel, so event times show their durations only; the busy
// kernel itself waits behind a gate (a host function that returns once the test has queued the
// whole measurement), so no host delay can let the stream run dry before the GEMM is queued (a
// host preempted for longer than the busy kernel, under a CPU hog, added 15 µs once).
constexpr double kLaunchLatencyMs = 0.0;

flare::sim::testing::SimKernel& busyKernel() {
  static flare::sim::testing::SimKernel k;
  static bool once =
      (flare::sim::testing::registerKernel(k, "_Z4busyy", FLARE_SIM_COST_NANOS), true);
  (void)once;
  return k;
}

void waitForGate(void* open) {
  while (!static_cast<std::atomic<bool>*>(open)->load()) std::this_thread::yield();
}

class SimBlas : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    cudaEventCreate(&start_);
    cudaEventCreate(&end_);
  }
  void TearDown() override { cudaStreamDestroy(stream_); }
  float timed(const std::function<void()>& fn) {
    std::atomic<bool> open{false};
    cudaLaunchHostFunc(stream_, waitForGate, &open);
    flare::sim::testing::launch(busyKernel(), 3'000'000, stream_);
    cudaEventRecord(start_, stream_);
    fn();
    cudaEventRecord(end_, stream_);
    open = true;
    EXPECT_EQ(cudaEventSynchronize(end_), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, end_);
    return ms;
  }
  cudaStream_t stream_;
  cudaEvent_t start_, end_;
};

TEST_F(SimBlas, GemmExTakesTheModelDuration) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, stream_), CUBLAS_STATUS_SUCCESS);
  float alpha = 1, beta = 0;
  float ms = timed([&] {
    EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 4096, 4096, 4096, &alpha, nullptr,
                           CUDA_R_16BF, 4096, nullptr, CUDA_R_16BF, 4096, &beta, nullptr,
                           CUDA_R_16BF, 4096, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
  });
  double want = expectedMs(4096, 4096, 4096, 1, 2, 400) + kLaunchLatencyMs;
  EXPECT_NEAR(ms, want, want * 0.001);
  cublasDestroy(h);
}

TEST_F(SimBlas, UnalignedDimensionIsSlower) {
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetStream(h, stream_);
  float alpha = 1, beta = 0;
  auto run = [&](int k) {
    return timed([&] {
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8192, 8192, k, &alpha, nullptr, CUDA_R_16F, 8192,
                   nullptr, CUDA_R_16F, k, &beta, nullptr, CUDA_R_16F, 8192, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    });
  };
  float aligned = run(4096), unaligned = run(4095);
  EXPECT_GT(unaligned / aligned, 1.9);
  EXPECT_NEAR(unaligned, expectedMs(8192, 8192, 4095, 1, 2, 400) + kLaunchLatencyMs, 0.005);
  cublasDestroy(h);
}

TEST_F(SimBlas, StridedBatchedAndSgemm) {
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetStream(h, stream_);
  float alpha = 1, beta = 0;
  float ms = timed([&] {
    EXPECT_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, 2048, 2048, 128, &alpha,
                                         nullptr, CUDA_R_16BF, 2048, 0, nullptr, CUDA_R_16BF, 2048,
                                         0, &beta, nullptr, CUDA_R_16BF, 2048, 0, 32,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
  });
  EXPECT_NEAR(ms, expectedMs(2048, 2048, 128, 32, 2, 400) + kLaunchLatencyMs, 0.001);
  float sgemm = timed([&] {
    EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1024, 1024, 1024, &alpha, nullptr, 1024,
                          nullptr, 1024, &beta, nullptr, 1024),
              CUBLAS_STATUS_SUCCESS);
  });
  EXPECT_NEAR(sgemm, expectedMs(1024, 1024, 1024, 1, 4, 400 * 0.5) + kLaunchLatencyMs, 0.001);
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 4, 4, &alpha, nullptr, CUDA_R_16F, 4,
                         nullptr, CUDA_R_16F, 4, &beta, nullptr, CUDA_R_16F, 4, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasDestroy(h);
}

TEST_F(SimBlas, LtMatmulReadsShapeFromDescriptors) {
  cublasLtHandle_t lt;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t op;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  cublasOperation_t t = CUBLAS_OP_T;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
            CUBLAS_STATUS_SUCCESS);
  int32_t got = 0;
  size_t written = 0;
  ASSERT_EQ(
      cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &got, sizeof(got), &written),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, CUBLAS_OP_T);
  EXPECT_EQ(written, sizeof(int32_t));
  // D (m x n) = op(A) (m x k) * B (k x n), A stored transposed as k x m.
  const uint64_t m = 6144, n = 4096, k = 2048;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, m, k);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k);
  cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, m, n, m);
  int32_t batch = 2;
  for (auto l : {a, b, c}) {
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                               sizeof(batch)),
              CUBLAS_STATUS_SUCCESS);
  }
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, 3),
            CUBLAS_STATUS_INVALID_VALUE);
  float alpha = 1, beta = 0;
  float ms = timed([&] {
    EXPECT_EQ(cublasLtMatmul(lt, op, &alpha, nullptr, a, nullptr, b, &beta, nullptr, c, nullptr, c,
                             nullptr, nullptr, 0, stream_),
              CUBLAS_STATUS_SUCCESS);
  });
  EXPECT_NEAR(ms, expectedMs(m, n, k, 2, 2, 400) + kLaunchLatencyMs, 0.001);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
}

}  // namespace
