// Interposed cublasLtMatmul: m/n/k/batch, transposes, dtypes and leading dimensions read from
// its descriptors. Reading them takes several attribute queries, so the result is cached per
// (descriptor, layouts) and thread; any change to a descriptor (the Set/Destroy calls are
// interposed too) bumps a generation that invalidates the caches.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <unordered_map>

#include "src/hook/real.h"
#include "src/hook/runtime.h"
#include "src/hook/timed.h"

#define FLARE_EXPORT extern "C" __attribute__((visibility("default")))

namespace flare::hook {
namespace {

constexpr const char* kLib = "libcublasLt.so";

struct LtFns {
  RealFn<decltype(&cublasLtMatmul)> matmul{"cublasLtMatmul", kLib};
  RealFn<decltype(&cublasLtMatmulDescGetAttribute)> descGet{"cublasLtMatmulDescGetAttribute", kLib};
  RealFn<decltype(&cublasLtMatrixLayoutGetAttribute)> layoutGet{"cublasLtMatrixLayoutGetAttribute",
                                                                kLib};
  RealFn<decltype(&cublasLtMatmulDescSetAttribute)> descSet{"cublasLtMatmulDescSetAttribute", kLib};
  RealFn<decltype(&cublasLtMatrixLayoutSetAttribute)> layoutSet{"cublasLtMatrixLayoutSetAttribute",
                                                                kLib};
  RealFn<decltype(&cublasLtMatmulDescDestroy)> descDestroy{"cublasLtMatmulDescDestroy", kLib};
  RealFn<decltype(&cublasLtMatrixLayoutDestroy)> layoutDestroy{"cublasLtMatrixLayoutDestroy", kLib};
};
LtFns g_fns;
std::atomic<uint64_t> g_generation{1};

struct Cached {
  uint64_t generation = 0;
  timing::OpInfo info;
};

template <typename T>
T layoutAttr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, T def) {
  T v = def;
  size_t written = 0;
  if (g_fns.layoutGet.get()(l, a, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return def;
  return v;
}

timing::OpInfo describe(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                        cublasLtMatrixLayout_t d) {
  timing::OpInfo info;
  info.kind = timing::OpKind::kGemm;
  if (!g_fns.descGet.get() || !g_fns.layoutGet.get()) return info;
  int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  size_t written = 0;
  g_fns.descGet.get()(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta), &written);
  g_fns.descGet.get()(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb), &written);
  const auto a_rows = layoutAttr<uint64_t>(a, CUBLASLT_MATRIX_LAYOUT_ROWS, 0);
  const auto a_cols = layoutAttr<uint64_t>(a, CUBLASLT_MATRIX_LAYOUT_COLS, 0);
  const int64_t m = static_cast<int64_t>(layoutAttr<uint64_t>(d, CUBLASLT_MATRIX_LAYOUT_ROWS, 0));
  const int64_t n = static_cast<int64_t>(layoutAttr<uint64_t>(d, CUBLASLT_MATRIX_LAYOUT_COLS, 0));
  const int64_t k = static_cast<int64_t>(ta == CUBLAS_OP_N ? a_cols : a_rows);
  const int64_t batch =
      std::max<int32_t>(1, layoutAttr<int32_t>(d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1));
  const int32_t a_type = layoutAttr<int32_t>(a, CUBLASLT_MATRIX_LAYOUT_TYPE, CUDA_R_16BF);
  const int32_t d_type = layoutAttr<int32_t>(d, CUBLASLT_MATRIX_LAYOUT_TYPE, CUDA_R_16BF);
  const int64_t lda = layoutAttr<int64_t>(a, CUBLASLT_MATRIX_LAYOUT_LD, 0);
  const int64_t ldb = layoutAttr<int64_t>(b, CUBLASLT_MATRIX_LAYOUT_LD, 0);
  const int64_t ldd = layoutAttr<int64_t>(d, CUBLASLT_MATRIX_LAYOUT_LD, 0);
  const int64_t fields[] = {ta, tb, m, n, k, batch, a_type, d_type, lda, ldb, ldd};
  info.signature_id = signatureFor(hashBytes(fields, sizeof(fields), 0x4c54), [&] {
    timing::Signature s;
    s.name = "cublasLtMatmul";
    s.kind = timing::OpKind::kGemm;
    s.dtype = cudaDataTypeName(a_type);
    s.shape = {m, n, k, batch};
    s.layout = std::string(ta == CUBLAS_OP_N ? "n" : "t") + (tb == CUBLAS_OP_N ? "n" : "t") +
               " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) +
               " ldc=" + std::to_string(ldd) + " out=" + cudaDataTypeName(d_type);
    return s;
  });
  info.flops = static_cast<uint64_t>(2.0 * m * n * k * batch);
  return info;
}

timing::OpInfo cachedDescribe(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d) {
  thread_local std::unordered_map<uint64_t, Cached> cache;
  const void* ptrs[] = {op, a, b, d};
  const uint64_t key = hashBytes(ptrs, sizeof(ptrs));
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  auto it = cache.find(key);
  if (it != cache.end() && it->second.generation == gen) return it->second.info;
  Cached c{gen, describe(op, a, b, d)};
  cache[key] = c;
  return c.info;
}

bool ok(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace flare::hook

using namespace flare::hook;  // NOLINT: the exported wrappers below

FLARE_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                           const void* alpha, const void* A,
                                           cublasLtMatrixLayout_t ad, const void* B,
                                           cublasLtMatrixLayout_t bd, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t cd, void* D,
                                           cublasLtMatrixLayout_t dd,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
  auto real = g_fns.matmul.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  return timedCall(
      stream, [&] { return cachedDescribe(op, ad, bd, dd); }, ok,
      [&] {
        return real(h, op, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, workspace,
                    workspace_bytes, stream);
      });
}

FLARE_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t size) {
  auto real = g_fns.descSet.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  return real(d, attr, buf, size);
}

FLARE_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void* buf, size_t size) {
  auto real = g_fns.layoutSet.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  return real(l, attr, buf, size);
}

FLARE_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  auto real = g_fns.descDestroy.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  g_generation.fetch_add(1, std::memory_order_acq_rel);  // the address may be reused
  return real(d);
}

FLARE_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  auto real = g_fns.layoutDestroy.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  return real(l);
}
