// Interposed cublasLtMatmul: m/n/k/batch, transposes, dtypes and leading dimensions of its
// descriptors.
//
// Shadow state, not queries: the descriptor and layout Create/Init/Set/Destroy calls are
// interposed too, and each thread keeps a small fixed table (no allocation) of the values it
// created and set, keyed by handle. PyTorch creates, sets and destroys its descriptors around
// every matmul on the calling thread; the shadow makes that pattern cost a table scan instead of
// eleven attribute queries. A handle the thread does not know (created before the hook was
// loaded, on another thread, or evicted from a full table) is read once with the Get calls and
// then shadowed. A Set or Destroy of a handle missing from the calling thread's table may concern
// another thread's entry: it bumps a process-wide generation that invalidates every shadow
// (correct, and rare outside that case).
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

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
  RealFn<decltype(&cublasLtMatmulDescCreate)> descCreate{"cublasLtMatmulDescCreate", kLib};
  RealFn<decltype(&cublasLtMatrixLayoutCreate)> layoutCreate{"cublasLtMatrixLayoutCreate", kLib};
  RealFn<decltype(&cublasLtMatmulDescInit_internal)> descInit{"cublasLtMatmulDescInit_internal",
                                                              kLib};
  RealFn<decltype(&cublasLtMatrixLayoutInit_internal)> layoutInit{
      "cublasLtMatrixLayoutInit_internal", kLib};
};
LtFns g_fns;
std::atomic<uint64_t> g_generation{1};

template <typename T>
T layoutAttr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, T def) {
  T v = def;
  size_t written = 0;
  if (g_fns.layoutGet.get()(l, a, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return def;
  return v;
}

// The values of one handle as the application set them.
struct Shadow {
  const void* handle = nullptr;
  uint64_t generation = 0;
  // descriptor: ta, tb; layout: type, rows, cols, ld, batch
  int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int32_t type = CUDA_R_16BF;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
};

// Fixed-size per-thread table with round-robin eviction; constant-initialized, so the
// thread_local needs no constructor or destructor call.
struct ShadowTable {
  static constexpr int kSlots = 48;
  Shadow slots[kSlots];
  int next_victim = 0;

  Shadow* find(const void* handle) {
    for (Shadow& s : slots)
      if (s.handle == handle) return &s;
    return nullptr;
  }
  Shadow* insert(const void* handle) {
    Shadow* s = find(handle);
    if (s == nullptr) s = find(nullptr);
    if (s == nullptr) {
      s = &slots[next_victim];
      next_victim = (next_victim + 1) % kSlots;
    }
    *s = Shadow{};
    s->handle = handle;
    s->generation = g_generation.load(std::memory_order_acquire);
    return s;
  }
  void erase(const void* handle) {
    if (Shadow* s = find(handle)) {
      s->handle = nullptr;
    } else {
      g_generation.fetch_add(1, std::memory_order_acq_rel);  // maybe another thread's
    }
  }
  // The entry for `handle` to update, or nullptr after invalidating everyone's copies.
  Shadow* forUpdate(const void* handle) {
    Shadow* s = find(handle);
    if (s == nullptr) g_generation.fetch_add(1, std::memory_order_acq_rel);
    return s;
  }
};
constinit thread_local ShadowTable t_shadows;

// A layout the calling thread just created or initialized.
void shadowLayout(const void* handle, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
  Shadow* s = t_shadows.insert(handle);
  s->type = type;
  s->rows = rows;
  s->cols = cols;
  s->ld = ld;
}

template <typename T>
bool readValue(const void* buf, size_t size, T* out) {
  if (buf == nullptr || size != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

// A shadow that is current, reading the handle with the Get calls when it is not.
const Shadow* descShadow(cublasLtMatmulDesc_t op) {
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  Shadow* s = t_shadows.find(op);
  if (s != nullptr && s->generation == gen) return s;
  if (!g_fns.descGet.get()) return nullptr;
  s = t_shadows.insert(op);
  size_t written = 0;
  g_fns.descGet.get()(op, CUBLASLT_MATMUL_DESC_TRANSA, &s->ta, sizeof(s->ta), &written);
  g_fns.descGet.get()(op, CUBLASLT_MATMUL_DESC_TRANSB, &s->tb, sizeof(s->tb), &written);
  return s;
}

const Shadow* layoutShadow(cublasLtMatrixLayout_t l) {
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  Shadow* s = t_shadows.find(l);
  if (s != nullptr && s->generation == gen) return s;
  if (!g_fns.layoutGet.get()) return nullptr;
  s = t_shadows.insert(l);
  s->type = layoutAttr<int32_t>(l, CUBLASLT_MATRIX_LAYOUT_TYPE, CUDA_R_16BF);
  s->rows = layoutAttr<uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_ROWS, 0);
  s->cols = layoutAttr<uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_COLS, 0);
  s->ld = layoutAttr<int64_t>(l, CUBLASLT_MATRIX_LAYOUT_LD, 0);
  s->batch = std::max<int32_t>(1, layoutAttr<int32_t>(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1));
  return s;
}

timing::OpInfo describe(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a_layout,
                        cublasLtMatrixLayout_t b_layout, cublasLtMatrixLayout_t d_layout) {
  timing::OpInfo info;
  info.kind = timing::OpKind::kGemm;
  const Shadow* desc = descShadow(op);
  const Shadow* a = layoutShadow(a_layout);
  const Shadow* b = layoutShadow(b_layout);
  const Shadow* d = layoutShadow(d_layout);
  if (desc == nullptr || a == nullptr || b == nullptr || d == nullptr) return info;
  const int32_t ta = desc->ta, tb = desc->tb;
  const int64_t m = static_cast<int64_t>(d->rows);
  const int64_t n = static_cast<int64_t>(d->cols);
  const int64_t k = static_cast<int64_t>(ta == CUBLAS_OP_N ? a->cols : a->rows);
  const int64_t batch = d->batch;
  const int32_t a_type = a->type, d_type = d->type;
  const int64_t lda = a->ld, ldb = b->ld, ldd = d->ld;
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
  return sampledCall(
      stream, [&] { return describe(op, ad, bd, dd); }, ok,
      [&] {
        return real(h, op, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, workspace,
                    workspace_bytes, stream);
      });
}

FLARE_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d,
                                                     cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  auto real = g_fns.descCreate.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  const cublasStatus_t status = real(d, compute, scale);
  if (status == CUBLAS_STATUS_SUCCESS && d != nullptr) t_shadows.insert(*d);
  return status;
}

FLARE_EXPORT cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t d, size_t size,
                                                            cublasComputeType_t compute,
                                                            cudaDataType_t scale) {
  auto real = g_fns.descInit.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  const cublasStatus_t status = real(d, size, compute, scale);
  if (status == CUBLAS_STATUS_SUCCESS) t_shadows.insert(d);
  return status;
}

FLARE_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  auto real = g_fns.layoutCreate.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  const cublasStatus_t status = real(l, type, rows, cols, ld);
  if (status == CUBLAS_STATUS_SUCCESS && l != nullptr) shadowLayout(*l, type, rows, cols, ld);
  return status;
}

FLARE_EXPORT cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t l, size_t size,
                                                              cudaDataType type, uint64_t rows,
                                                              uint64_t cols, int64_t ld) {
  auto real = g_fns.layoutInit.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  const cublasStatus_t status = real(l, size, type, rows, cols, ld);
  if (status == CUBLAS_STATUS_SUCCESS) shadowLayout(l, type, rows, cols, ld);
  return status;
}

FLARE_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t size) {
  auto real = g_fns.descSet.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  const cublasStatus_t status = real(d, attr, buf, size);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB) return status;
  if (Shadow* s = t_shadows.forUpdate(d)) {
    int32_t* field = attr == CUBLASLT_MATMUL_DESC_TRANSA ? &s->ta : &s->tb;
    if (!readValue(buf, size, field)) s->handle = nullptr;  // re-read at the next matmul
  }
  return status;
}

FLARE_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void* buf, size_t size) {
  auto real = g_fns.layoutSet.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  const cublasStatus_t status = real(l, attr, buf, size);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  Shadow* s = t_shadows.forUpdate(l);
  if (s == nullptr) return status;
  bool ok_value = true;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      ok_value = readValue(buf, size, &s->type);
      break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      ok_value = readValue(buf, size, &s->rows);
      break;
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      ok_value = readValue(buf, size, &s->cols);
      break;
    case CUBLASLT_MATRIX_LAYOUT_LD:
      ok_value = readValue(buf, size, &s->ld);
      break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      ok_value = readValue(buf, size, &s->batch);
      s->batch = std::max<int32_t>(1, s->batch);
      break;
    default:
      break;
  }
  if (!ok_value) s->handle = nullptr;  // re-read at the next matmul
  return status;
}

FLARE_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  auto real = g_fns.descDestroy.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  t_shadows.erase(d);  // before the address can be reused
  return real(d);
}

FLARE_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  auto real = g_fns.layoutDestroy.get();
  if (!real) return CUBLAS_STATUS_NOT_INITIALIZED;
  t_shadows.erase(l);
  return real(l);
}
