// Helpers shared by the engine tests: batches and hellos built the way a rank builds them.
#pragma once

#include <cstdint>
#include <string>

#include "flare/step.h"
#include "flare/v1/protocol.h"
#include "flare/v1/service.pb.h"

namespace flare::engine::testing {

// 2026-11-22T00:00:00Z, a plausible "now" for timestamps.
inline constexpr int64_t kNow = 1795305600LL * 1000000000LL;

inline v1::RankHello makeHello(const std::string& job, int rank, int world,
                               const std::string& token = "", int pid = 1000) {
  v1::RankHello h;
  h.set_protocol_version(v1::kProtocolVersion);
  h.set_job_id(job);
  h.set_rank(rank);
  h.set_world_size(world);
  h.set_local_rank(rank % 8);
  h.set_host("host" + std::to_string(rank / 8));
  h.set_pid(pid + rank);
  h.set_token(token);
  h.set_start_time_unix_ns(kNow);
  h.set_mode(v1::MODE_RAW);
  return h;
}

// A GEMM [1, m, n, k] bf16 signature with its FLOPs per call.
inline v1::Signature gemmSig(uint32_t id, int64_t m, int64_t n, int64_t k) {
  v1::Signature s;
  s.set_id(id);
  s.set_name("cublasGemmEx");
  s.set_kind(v1::OP_KIND_GEMM);
  s.set_dtype(v1::DTYPE_BF16);
  for (int64_t d : {int64_t{1}, m, n, k}) s.add_shape(d);
  s.set_flops_per_call(static_cast<uint64_t>(2 * m * n * k));
  s.set_library("cublas");
  return s;
}

// The step marker's signature (flare_step(): a host-side sync whose records are step
// boundaries).
inline v1::Signature stepMarkerSig(uint32_t id) {
  v1::Signature s;
  s.set_id(id);
  s.set_name(FLARE_STEP_MARKER_NAME);
  s.set_kind(v1::OP_KIND_SYNC);
  return s;
}

// A plain kernel's signature.
inline v1::Signature kernelSig(uint32_t id, const std::string& name) {
  v1::Signature s;
  s.set_id(id);
  s.set_name(name);
  s.set_kind(v1::OP_KIND_KERNEL);
  return s;
}

inline v1::Signature allReduceSig(uint32_t id, uint64_t bytes) {
  v1::Signature s;
  s.set_id(id);
  s.set_name("ncclAllReduce");
  s.set_kind(v1::OP_KIND_COLLECTIVE);
  s.set_collective(v1::COLLECTIVE_KIND_ALL_REDUCE);
  s.set_dtype(v1::DTYPE_BF16);
  s.add_shape(static_cast<int64_t>(bytes / 2));
  s.set_bytes_per_call(bytes);
  s.set_library("nccl");
  return s;
}

inline v1::KernelRecord* addKernel(v1::RecordBatch* b, uint32_t sig, int64_t start, int64_t dur,
                                   int nranks = 0) {
  v1::KernelRecord* k = b->add_kernels();
  k->set_signature_id(sig);
  k->set_stream_id(7);
  k->set_issue_ns(start - 1000);
  k->set_start_ns(start);
  k->set_end_ns(start + dur);
  if (nranks > 0) k->mutable_collective()->set_nranks(nranks);
  return k;
}

}  // namespace flare::engine::testing
