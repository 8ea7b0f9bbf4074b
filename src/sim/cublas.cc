// The simulated cuBLAS (libcublas.so.13): handles, streams, and the GEMM family. GEMMs do not
// compute; they enqueue a kernel whose duration comes from gemm_model. Signatures come from
// the real <cublas_api.h>.
#include <cublas_api.h>
#include <cuda_fp16.h>

#include "src/sim/gemm_model.h"

#define SIM_API extern "C" __attribute__((visibility("default")))

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
};

namespace {
using flare::sim::GemmShape;

cublasStatus_t run(cublasHandle_t h, GemmShape s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (s.m < 0 || s.n < 0 || s.k < 0 || s.batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (s.m == 0 || s.n == 0 || s.batch == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to do
  if (s.k == 0) s.k = 1;  // C = beta*C still runs a kernel
  int r = flare::sim::launchGemm(s, h->stream);
  return r == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

GemmShape shape(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                cudaDataType a, cudaDataType c, int64_t batch) {
  GemmShape s;
  s.m = m;
  s.n = n;
  s.k = k;
  s.batch = batch;
  s.trans_a = ta != CUBLAS_OP_N;
  s.trans_b = tb != CUBLAS_OP_N;
  s.a_type = a;
  s.c_type = c;
  return s;
}
}  // namespace

SIM_API cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version) {
  if (!version) return CUBLAS_STATUS_INVALID_VALUE;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* ws, size_t bytes) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

SIM_API cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

SIM_API const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown error";
  }
}

SIM_API cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                      int m, int n, int k, const float* alpha, const float* A,
                                      int lda, const float* B, int ldb, const float* beta,
                                      float* C, int ldc) {
  return run(h, shape(ta, tb, m, n, k, CUDA_R_32F, CUDA_R_32F, 1));
}

SIM_API cublasStatus_t cublasSgemm_v2_64(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                                         const float* alpha, const float* A, int64_t lda,
                                         const float* B, int64_t ldb, const float* beta, float* C,
                                         int64_t ldc) {
  return run(h, shape(ta, tb, m, n, k, CUDA_R_32F, CUDA_R_32F, 1));
}

SIM_API cublasStatus_t cublasHgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const __half* alpha, const __half* A,
                                   int lda, const __half* B, int ldb, const __half* beta,
                                   __half* C, int ldc) {
  return run(h, shape(ta, tb, m, n, k, CUDA_R_16F, CUDA_R_16F, 1));
}

SIM_API cublasStatus_t cublasHgemm_64(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                      int64_t m, int64_t n, int64_t k, const __half* alpha,
                                      const __half* A, int64_t lda, const __half* B, int64_t ldb,
                                      const __half* beta, __half* C, int64_t ldc) {
  return run(h, shape(ta, tb, m, n, k, CUDA_R_16F, CUDA_R_16F, 1));
}

SIM_API cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                    int m, int n, int k, const void* alpha, const void* A,
                                    cudaDataType at, int lda, const void* B, cudaDataType bt,
                                    int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                                    cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return run(h, shape(ta, tb, m, n, k, at, ct, 1));
}

SIM_API cublasStatus_t cublasGemmEx_64(cublasHandle_t h, cublasOperation_t ta,
                                       cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                                       const void* alpha, const void* A, cudaDataType at,
                                       int64_t lda, const void* B, cudaDataType bt, int64_t ldb,
                                       const void* beta, void* C, cudaDataType ct, int64_t ldc,
                                       cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return run(h, shape(ta, tb, m, n, k, at, ct, 1));
}

SIM_API cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                           cublasOperation_t tb, int m, int n, int k,
                                           const void* alpha, const void* const A[],
                                           cudaDataType at, int lda, const void* const B[],
                                           cudaDataType bt, int ldb, const void* beta,
                                           void* const C[], cudaDataType ct, int ldc, int batch,
                                           cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return run(h, shape(ta, tb, m, n, k, at, ct, batch));
}

SIM_API cublasStatus_t cublasGemmBatchedEx_64(cublasHandle_t h, cublasOperation_t ta,
                                              cublasOperation_t tb, int64_t m, int64_t n,
                                              int64_t k, const void* alpha, const void* const A[],
                                              cudaDataType at, int64_t lda, const void* const B[],
                                              cudaDataType bt, int64_t ldb, const void* beta,
                                              void* const C[], cudaDataType ct, int64_t ldc,
                                              int64_t batch, cublasComputeType_t compute,
                                              cublasGemmAlgo_t algo) {
  return run(h, shape(ta, tb, m, n, k, at, ct, batch));
}

SIM_API cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType at, int lda, long long int sa, const void* B,
    cudaDataType bt, int ldb, long long int sb, const void* beta, void* C, cudaDataType ct,
    int ldc, long long int sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return run(h, shape(ta, tb, m, n, k, at, ct, batch));
}

SIM_API cublasStatus_t cublasGemmStridedBatchedEx_64(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void* alpha, const void* A, cudaDataType at, int64_t lda, long long int sa,
    const void* B, cudaDataType bt, int64_t ldb, long long int sb, const void* beta, void* C,
    cudaDataType ct, int64_t ldc, long long int sc, int64_t batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo) {
  return run(h, shape(ta, tb, m, n, k, at, ct, batch));
}
