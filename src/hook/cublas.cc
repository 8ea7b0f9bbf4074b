// Interposed cuBLAS GEMMs: each becomes one record with its shape, dtype, layout and FLOPs
// (2·m·n·k·batch), timed on the handle's stream. The kernels cuBLAS launches inside are not
// recorded again (re-entrancy guard).
#include <cublas_api.h>
#include <cuda_fp16.h>

#include <cstring>
#include <string>

#include "src/hook/real.h"
#include "src/hook/runtime.h"
#include "src/hook/timed.h"

#define FLARE_EXPORT extern "C" __attribute__((visibility("default")))

namespace flare::hook {
namespace {

constexpr const char* kLib = "libcublas.so";

// cublas_api.h overloads these three with C++ inline wrappers: name the C signatures.
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
using GemmStridedBatchedExFn = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long int, const void*, cudaDataType, int, long long int, const void*,
    void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);
using GemmBatchedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                           int, int, int, const void*, const void* const[],
                                           cudaDataType, int, const void* const[], cudaDataType,
                                           int, const void*, void* const[], cudaDataType, int, int,
                                           cublasComputeType_t, cublasGemmAlgo_t);

struct CublasFns {
  RealFn<cublasStatus_t (*)(cublasHandle_t, cudaStream_t*)> getStream{"cublasGetStream_v2", kLib};
  RealFn<GemmExFn> gemmEx{"cublasGemmEx", kLib};
  RealFn<decltype(&cublasGemmEx_64)> gemmEx64{"cublasGemmEx_64", kLib};
  RealFn<decltype(&cublasSgemm_v2)> sgemm{"cublasSgemm_v2", kLib};
  RealFn<decltype(&cublasSgemm_v2_64)> sgemm64{"cublasSgemm_v2_64", kLib};
  RealFn<decltype(&cublasHgemm)> hgemm{"cublasHgemm", kLib};
  RealFn<decltype(&cublasHgemm_64)> hgemm64{"cublasHgemm_64", kLib};
  RealFn<GemmStridedBatchedExFn> gemmStridedBatchedEx{"cublasGemmStridedBatchedEx", kLib};
  RealFn<decltype(&cublasGemmStridedBatchedEx_64)> gemmStridedBatchedEx64{
      "cublasGemmStridedBatchedEx_64", kLib};
  RealFn<GemmBatchedExFn> gemmBatchedEx{"cublasGemmBatchedEx", kLib};
  RealFn<decltype(&cublasGemmBatchedEx_64)> gemmBatchedEx64{"cublasGemmBatchedEx_64", kLib};
};
CublasFns g_fns;

bool ok(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS;
}

struct Gemm {
  const char* api;
  cublasOperation_t ta, tb;
  int64_t m, n, k, batch;
  cudaDataType a_type, c_type;
  int64_t lda, ldb, ldc;
};

timing::OpInfo gemmInfo(const Gemm& g) {
  timing::OpInfo op;
  op.kind = timing::OpKind::kGemm;
  const int64_t key_fields[] = {g.ta,     g.tb,     g.m,   g.n,   g.k,  g.batch,
                                g.a_type, g.c_type, g.lda, g.ldb, g.ldc};
  const uint64_t key = hashBytes(key_fields, sizeof(key_fields), hashBytes(g.api, strlen(g.api)));
  op.signature_id = signatureFor(key, [&] {
    timing::Signature s;
    s.name = g.api;
    s.kind = timing::OpKind::kGemm;
    s.dtype = cudaDataTypeName(g.a_type);
    s.shape = {g.m, g.n, g.k, g.batch};
    s.layout = std::string(g.ta == CUBLAS_OP_N ? "n" : "t") + (g.tb == CUBLAS_OP_N ? "n" : "t") +
               " lda=" + std::to_string(g.lda) + " ldb=" + std::to_string(g.ldb) +
               " ldc=" + std::to_string(g.ldc) + " out=" + cudaDataTypeName(g.c_type);
    return s;
  });
  op.flops = static_cast<uint64_t>(2.0 * g.m * g.n * g.k * g.batch);
  return op;
}

cudaStream_t streamOf(cublasHandle_t h) {
  cudaStream_t s = nullptr;
  if (auto fn = g_fns.getStream.get()) fn(h, &s);
  return s;
}

template <typename Call>
cublasStatus_t timedGemm(cublasHandle_t h, const Gemm& g, Call&& call) {
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return call();  // nothing runs, or an error
  return sampledCall([h] { return streamOf(h); }, [&] { return gemmInfo(g); }, ok, call);
}

}  // namespace
}  // namespace flare::hook

using namespace flare::hook;  // NOLINT: the exported wrappers below

#define REAL(slot)              \
  auto real = g_fns.slot.get(); \
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED

FLARE_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const void* alpha, const void* A, cudaDataType at, int lda,
                                         const void* B, cudaDataType bt, int ldb, const void* beta,
                                         void* C, cudaDataType ct, int ldc,
                                         cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  REAL(gemmEx);
  return timedGemm(h, {"cublasGemmEx", ta, tb, m, n, k, 1, at, ct, lda, ldb, ldc}, [&] {
    return real(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo);
  });
}

FLARE_EXPORT cublasStatus_t cublasGemmEx_64(cublasHandle_t h, cublasOperation_t ta,
                                            cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                                            const void* alpha, const void* A, cudaDataType at,
                                            int64_t lda, const void* B, cudaDataType bt,
                                            int64_t ldb, const void* beta, void* C, cudaDataType ct,
                                            int64_t ldc, cublasComputeType_t compute,
                                            cublasGemmAlgo_t algo) {
  REAL(gemmEx64);
  return timedGemm(h, {"cublasGemmEx", ta, tb, m, n, k, 1, at, ct, lda, ldb, ldc}, [&] {
    return real(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo);
  });
}

FLARE_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta,
                                           cublasOperation_t tb, int m, int n, int k,
                                           const float* alpha, const float* A, int lda,
                                           const float* B, int ldb, const float* beta, float* C,
                                           int ldc) {
  REAL(sgemm);
  return timedGemm(h, {"cublasSgemm", ta, tb, m, n, k, 1, CUDA_R_32F, CUDA_R_32F, lda, ldb, ldc},
                   [&] { return real(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc); });
}

FLARE_EXPORT cublasStatus_t cublasSgemm_v2_64(cublasHandle_t h, cublasOperation_t ta,
                                              cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                                              const float* alpha, const float* A, int64_t lda,
                                              const float* B, int64_t ldb, const float* beta,
                                              float* C, int64_t ldc) {
  REAL(sgemm64);
  return timedGemm(h, {"cublasSgemm", ta, tb, m, n, k, 1, CUDA_R_32F, CUDA_R_32F, lda, ldb, ldc},
                   [&] { return real(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc); });
}

FLARE_EXPORT cublasStatus_t cublasHgemm(cublasHandle_t h, cublasOperation_t ta,
                                        cublasOperation_t tb, int m, int n, int k,
                                        const __half* alpha, const __half* A, int lda,
                                        const __half* B, int ldb, const __half* beta, __half* C,
                                        int ldc) {
  REAL(hgemm);
  return timedGemm(h, {"cublasHgemm", ta, tb, m, n, k, 1, CUDA_R_16F, CUDA_R_16F, lda, ldb, ldc},
                   [&] { return real(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc); });
}

FLARE_EXPORT cublasStatus_t cublasHgemm_64(cublasHandle_t h, cublasOperation_t ta,
                                           cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                                           const __half* alpha, const __half* A, int64_t lda,
                                           const __half* B, int64_t ldb, const __half* beta,
                                           __half* C, int64_t ldc) {
  REAL(hgemm64);
  return timedGemm(h, {"cublasHgemm", ta, tb, m, n, k, 1, CUDA_R_16F, CUDA_R_16F, lda, ldb, ldc},
                   [&] { return real(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc); });
}

FLARE_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType at, int lda, long long int sa, const void* B,
    cudaDataType bt, int ldb, long long int sb, const void* beta, void* C, cudaDataType ct, int ldc,
    long long int sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  REAL(gemmStridedBatchedEx);
  return timedGemm(h, {"cublasGemmStridedBatchedEx", ta, tb, m, n, k, batch, at, ct, lda, ldb, ldc},
                   [&] {
                     return real(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C,
                                 ct, ldc, sc, batch, compute, algo);
                   });
}

FLARE_EXPORT cublasStatus_t cublasGemmStridedBatchedEx_64(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void* alpha, const void* A, cudaDataType at, int64_t lda, long long int sa, const void* B,
    cudaDataType bt, int64_t ldb, long long int sb, const void* beta, void* C, cudaDataType ct,
    int64_t ldc, long long int sc, int64_t batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo) {
  REAL(gemmStridedBatchedEx64);
  return timedGemm(h, {"cublasGemmStridedBatchedEx", ta, tb, m, n, k, batch, at, ct, lda, ldb, ldc},
                   [&] {
                     return real(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C,
                                 ct, ldc, sc, batch, compute, algo);
                   });
}

FLARE_EXPORT cublasStatus_t cublasGemmBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void* alpha, const void* const A[], cudaDataType at, int lda, const void* const B[],
    cudaDataType bt, int ldb, const void* beta, void* const C[], cudaDataType ct, int ldc,
    int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  REAL(gemmBatchedEx);
  return timedGemm(h, {"cublasGemmBatchedEx", ta, tb, m, n, k, batch, at, ct, lda, ldb, ldc}, [&] {
    return real(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, batch, compute,
                algo);
  });
}

FLARE_EXPORT cublasStatus_t cublasGemmBatchedEx_64(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void* alpha, const void* const A[], cudaDataType at, int64_t lda, const void* const B[],
    cudaDataType bt, int64_t ldb, const void* beta, void* const C[], cudaDataType ct, int64_t ldc,
    int64_t batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  REAL(gemmBatchedEx64);
  return timedGemm(h, {"cublasGemmBatchedEx", ta, tb, m, n, k, batch, at, ct, lda, ldb, ldc}, [&] {
    return real(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, batch, compute,
                algo);
  });
}
