// The simulated cuBLASLt (libcublasLt.so.13): handles, matmul and layout descriptors with their
// attributes, heuristics, and cublasLtMatmul. Descriptors live inside the caller-visible opaque
// structs of the real header (cublasLtMatmulDescOpaque_t etc.), as the real library's do.
#include <cublasLt.h>

#include <cstring>
#include <new>

#include "src/sim/gemm_model.h"

#define SIM_API extern "C" __attribute__((visibility("default")))

struct cublasLtContext {
  int unused = 0;
};

namespace {

struct MatmulDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t trans_a;
  int32_t trans_b;
  uint32_t epilogue;
};
static_assert(sizeof(MatmulDesc) <= sizeof(cublasLtMatmulDescOpaque_t));

struct Layout {
  cudaDataType type;
  uint64_t rows;
  uint64_t cols;
  int64_t ld;
  int32_t batch;
  int64_t stride;
  int32_t order;
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));

MatmulDesc* desc(cublasLtMatmulDesc_t d) { return reinterpret_cast<MatmulDesc*>(d->data); }
Layout* layout(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l->data); }

// Copies `size` bytes between an attribute and the caller's buffer, checking the size.
template <typename T>
cublasStatus_t setAttr(T& field, const void* buf, size_t size) {
  if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
template <typename T>
cublasStatus_t getAttr(const T& field, void* buf, size_t size, size_t* written) {
  if (written) *written = sizeof(T);
  if (size == 0 && !buf) return CUBLAS_STATUS_SUCCESS;  // size query
  if (!buf || size < sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &field, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

SIM_API cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

SIM_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* out,
                                                cublasComputeType_t compute,
                                                cudaDataType_t scale) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  auto* d = new cublasLtMatmulDescOpaque_t();
  *desc(d) = MatmulDesc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT};
  *out = d;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                      cublasLtMatmulDescAttributes_t attr,
                                                      const void* buf, size_t size) {
  if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
  MatmulDesc* m = desc(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return setAttr(m->compute, buf, size);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return setAttr(m->scale, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSA: return setAttr(m->trans_a, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return setAttr(m->trans_b, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return setAttr(m->epilogue, buf, size);
    default: return buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;  // accepted, unused
  }
}

SIM_API cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d,
                                                      cublasLtMatmulDescAttributes_t attr,
                                                      void* buf, size_t size, size_t* written) {
  if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
  const MatmulDesc* m = desc(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return getAttr(m->compute, buf, size, written);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return getAttr(m->scale, buf, size, written);
    case CUBLASLT_MATMUL_DESC_TRANSA: return getAttr(m->trans_a, buf, size, written);
    case CUBLASLT_MATMUL_DESC_TRANSB: return getAttr(m->trans_b, buf, size, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return getAttr(m->epilogue, buf, size, written);
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

SIM_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* out, cudaDataType type,
                                                  uint64_t rows, uint64_t cols, int64_t ld) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  auto* l = new cublasLtMatrixLayoutOpaque_t();
  *layout(l) = Layout{type, rows, cols, ld, 1, 0, CUBLASLT_ORDER_COL};
  *out = l;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                        cublasLtMatrixLayoutAttribute_t attr,
                                                        const void* buf, size_t size) {
  if (!l) return CUBLAS_STATUS_NOT_INITIALIZED;
  Layout* x = layout(l);
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return setAttr(x->type, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return setAttr(x->order, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return setAttr(x->rows, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return setAttr(x->cols, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_LD: return setAttr(x->ld, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return setAttr(x->batch, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return setAttr(x->stride, buf, size);
    default: return buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  }
}

SIM_API cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t l,
                                                        cublasLtMatrixLayoutAttribute_t attr,
                                                        void* buf, size_t size, size_t* written) {
  if (!l) return CUBLAS_STATUS_NOT_INITIALIZED;
  const Layout* x = layout(l);
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return getAttr(x->type, buf, size, written);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return getAttr(x->order, buf, size, written);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return getAttr(x->rows, buf, size, written);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return getAttr(x->cols, buf, size, written);
    case CUBLASLT_MATRIX_LAYOUT_LD: return getAttr(x->ld, buf, size, written);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return getAttr(x->batch, buf, size, written);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return getAttr(x->stride, buf, size, written);
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

SIM_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t size) {
  return pref && buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

SIM_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!op || !a || !b || !c || !d || requested <= 0 || !results || !returned) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::memset(&results[0], 0, sizeof(results[0]));
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                      const void* alpha, const void* A, cublasLtMatrixLayout_t ad,
                                      const void* B, cublasLtMatrixLayout_t bd, const void* beta,
                                      const void* C, cublasLtMatrixLayout_t cd, void* D,
                                      cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t* algo,
                                      void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!op || !ad || !bd || !cd || !dd) return CUBLAS_STATUS_INVALID_VALUE;
  const MatmulDesc* m = desc(op);
  const Layout* la = layout(ad);
  const Layout* ld = layout(dd);
  flare::sim::GemmShape s;
  s.trans_a = m->trans_a != CUBLAS_OP_N;
  s.trans_b = m->trans_b != CUBLAS_OP_N;
  s.m = static_cast<int64_t>(ld->rows);
  s.n = static_cast<int64_t>(ld->cols);
  s.k = static_cast<int64_t>(s.trans_a ? la->rows : la->cols);
  s.batch = ld->batch > 0 ? ld->batch : 1;
  s.a_type = la->type;
  s.c_type = ld->type;
  if (s.m == 0 || s.n == 0) return CUBLAS_STATUS_SUCCESS;
  int r = flare::sim::launchGemm(s, stream);
  return r == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
