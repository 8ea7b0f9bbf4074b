#include "src/timing/spool_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <memory>
#include <string_view>
#include <system_error>
#include <utility>

#include "src/common/log.h"

namespace flare::timing {
namespace {

constexpr char kLog[] = "timing";
constexpr size_t kRecordOverhead = 3;             // tag and length of a repeated message
constexpr uint64_t kMaxBatchBytes = 64ull << 20;  // the reader's plausibility bound

std::string safeComponent(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_";
  return out;
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool startsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

flare::v1::CollectiveKind collectiveKind(std::string_view name) {
  std::string op = lower(startsWith(name, "nccl") ? name.substr(4) : name);
  using K = flare::v1::CollectiveKind;
  if (op == "allreduce") return K::COLLECTIVE_KIND_ALL_REDUCE;
  if (op == "allgather") return K::COLLECTIVE_KIND_ALL_GATHER;
  if (op == "reducescatter") return K::COLLECTIVE_KIND_REDUCE_SCATTER;
  if (op == "broadcast" || op == "bcast") return K::COLLECTIVE_KIND_BROADCAST;
  if (op == "reduce") return K::COLLECTIVE_KIND_REDUCE;
  if (op == "send") return K::COLLECTIVE_KIND_SEND;
  if (op == "recv") return K::COLLECTIVE_KIND_RECV;
  if (op == "alltoall") return K::COLLECTIVE_KIND_ALL_TO_ALL;
  if (op == "group" || op == "groupend") return K::COLLECTIVE_KIND_GROUP;
  return K::COLLECTIVE_KIND_UNSPECIFIED;
}

// The library an API name belongs to; "" for kernel names.
std::string libraryOf(std::string_view name) {
  if (startsWith(name, "cublasLt")) return "cublasLt";
  if (startsWith(name, "cublas")) return "cublas";
  if (startsWith(name, "nccl")) return "nccl";
  if (startsWith(name, "cuda")) return "cudart";
  if (name.size() > 2 && startsWith(name, "cu") &&
      std::isupper(static_cast<unsigned char>(name[2])))
    return "driver";
  return "";
}

bool isCollective(OpKind kind) {
  return kind == OpKind::kCollective || kind == OpKind::kP2P;
}

void appendVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    *out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *out += static_cast<char>(value);
}

}  // namespace

flare::v1::OpKind toProtoKind(OpKind kind) {
  using P = flare::v1::OpKind;
  switch (kind) {
    case OpKind::kKernel:
      return P::OP_KIND_KERNEL;
    case OpKind::kGemm:
      return P::OP_KIND_GEMM;
    case OpKind::kAttention:
      return P::OP_KIND_ATTENTION;
    case OpKind::kCollective:
      return P::OP_KIND_COLLECTIVE;
    case OpKind::kP2P:
      return P::OP_KIND_P2P;
    case OpKind::kMemcpy:
      return P::OP_KIND_MEMCPY;
    case OpKind::kMemset:
      return P::OP_KIND_MEMSET;
    case OpKind::kGraph:
      return P::OP_KIND_GRAPH;
    case OpKind::kSync:
      return P::OP_KIND_SYNC;
  }
  return P::OP_KIND_UNSPECIFIED;
}

flare::v1::DType toProtoDType(const std::string& dtype) {
  using D = flare::v1::DType;
  const std::string t = lower(dtype);
  if (t == "f32" || t == "fp32" || t == "float32" || t == "float") return D::DTYPE_F32;
  if (t == "f16" || t == "fp16" || t == "float16" || t == "half") return D::DTYPE_F16;
  if (t == "bf16" || t == "bfloat16") return D::DTYPE_BF16;
  if (t == "f8e4m3" || t == "fp8_e4m3" || t == "e4m3" || t == "float8_e4m3fn")
    return D::DTYPE_F8E4M3;
  if (t == "f8e5m2" || t == "fp8_e5m2" || t == "e5m2" || t == "float8_e5m2") return D::DTYPE_F8E5M2;
  if (t == "i8" || t == "int8") return D::DTYPE_I8;
  if (t == "i32" || t == "int32") return D::DTYPE_I32;
  if (t == "f64" || t == "fp64" || t == "float64" || t == "double") return D::DTYPE_F64;
  if (t == "u8" || t == "uint8") return D::DTYPE_U8;
  if (t == "i64" || t == "int64") return D::DTYPE_I64;
  if (t == "u32" || t == "uint32") return D::DTYPE_U32;
  if (t == "u64" || t == "uint64") return D::DTYPE_U64;
  if (t == "f4e2m1" || t == "fp4" || t == "e2m1") return D::DTYPE_F4E2M1;
  if (t == "f8e8m0" || t == "e8m0") return D::DTYPE_F8E8M0;
  if (t == "c32" || t == "complex64") return D::DTYPE_C32;
  if (t == "c64" || t == "complex128") return D::DTYPE_C64;
  return D::DTYPE_UNSPECIFIED;
}

SpoolSink::SpoolSink(const std::string& dir, const std::string& job_id, int rank, int pid,
                     SpoolSinkOptions options)
    : rank_(rank), options_(std::move(options)) {
  try {
    const std::filesystem::path folder =
        std::filesystem::path(dir) / safeComponent(job_id) / std::to_string(rank);
    path_ = (folder / ("records-" + std::to_string(pid) + ".pb")).string();
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) {
      disable("creating " + folder.string(), ec.value());
      return;
    }
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) disable("opening", errno);
  } catch (...) {
    disable("setting up", ENOMEM);
  }
}

SpoolSink::~SpoolSink() {
  flush();
  if (fd_ >= 0) ::close(fd_);
}

void SpoolSink::disable(const std::string& what, int err) {
  if (disabled_.exchange(true, std::memory_order_acq_rel)) return;
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  FLARE_LOG_WARN(kLog, "spool {}: {} failed: {}; records are no longer written to the spool", path_,
                 what, std::system_category().message(err));
}

void SpoolSink::openBatch() {
  batch_.Clear();
  batch_size_ = 0;
  clock_map_ = options_.clock_map ? options_.clock_map() : common::ClockMap::sample();
  batch_open_ = true;
}

void SpoolSink::onSignature(uint32_t id, const Signature& sig) {
  if (disabled()) return;
  try {
    if (!batch_open_) openBatch();
    flare::v1::Signature* out = batch_.add_signatures();
    out->set_id(id);
    out->set_name(sig.name);
    out->set_kind(toProtoKind(sig.kind));
    out->set_dtype(toProtoDType(sig.dtype));
    for (int64_t dim : sig.shape) out->add_shape(dim);
    out->set_layout(sig.layout);
    if (isCollective(sig.kind)) {
      out->set_collective(collectiveKind(sig.name));
      if (!sig.shape.empty()) collective_counts_[id] = static_cast<uint64_t>(sig.shape[0]);
    }
    out->set_library(libraryOf(sig.name));
    batch_size_ += out->ByteSizeLong() + kRecordOverhead;
    if (batch_size_ >= options_.batch_bytes) closeBatch();
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onOps(std::span<const CompletedOp> ops) {
  if (disabled()) {
    dropped_.fetch_add(ops.size(), std::memory_order_relaxed);
    return;
  }
  try {
    for (const CompletedOp& op : ops) {
      if (!batch_open_) openBatch();
      flare::v1::KernelRecord* rec = batch_.add_kernels();
      rec->set_signature_id(op.info.signature_id);
      rec->set_stream_id(op.stream_id);
      rec->set_device(op.device);
      rec->set_issue_ns(clock_map_.fromMonotonic(op.issue_ns));
      rec->set_start_ns(clock_map_.fromMonotonic(op.start_ns));
      rec->set_end_ns(clock_map_.fromMonotonic(op.end_ns));
      rec->set_issue_latency_ns(op.start_ns - op.issue_ns);
      rec->set_flops(op.info.flops);
      rec->set_bytes(op.info.bytes);
      if (isCollective(op.info.kind)) {
        flare::v1::CollectiveInfo* coll = rec->mutable_collective();
        coll->set_comm_hash(op.info.comm_hash);
        coll->set_seq(op.info.seq);
        coll->set_nranks(static_cast<int32_t>(op.info.nranks));
        if (op.info.peer >= 0) coll->set_peer(op.info.peer);
        auto count = collective_counts_.find(op.info.signature_id);
        if (count != collective_counts_.end()) coll->set_count(count->second);
      }
      rec->set_thread_id(op.thread_id);
      batch_size_ += rec->ByteSizeLong() + kRecordOverhead;
      if (batch_size_ >= options_.batch_bytes) {
        closeBatch();
        if (disabled()) return;
      }
    }
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onDrops(const DropCounters& totals) {
  drops_ = totals;
  drops_dirty_ = true;
}

void SpoolSink::flush() {
  if (disabled()) return;
  try {
    const bool has_records =
        batch_open_ && (batch_.signatures_size() > 0 || batch_.kernels_size() > 0);
    if (!has_records && !drops_dirty_) return;
    if (!batch_open_) openBatch();
    closeBatch();
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::closeBatch() {
  batch_open_ = false;
  batch_.set_rank(rank_);
  batch_.set_batch_seq(++batch_seq_);
  flare::v1::DropCounters* drops = batch_.mutable_drops();
  drops->set_ring_full(drops_.ring_full);
  drops->set_events_exhausted(drops_.events_exhausted);
  drops->set_event_errors(drops_.event_errors);
  drops->set_capturing(drops_.capturing);
  drops->set_unfinished(drops_.unfinished);
  drops->set_log_once_suppressed(common::logCounters().once_suppressed);
  batch_.set_created_ns(common::realtimeNs());
  const uint64_t kernels = static_cast<uint64_t>(batch_.kernels_size());
  std::string bytes;
  const size_t size = batch_.ByteSizeLong();
  bytes.reserve(size + 10);
  appendVarint(&bytes, size);
  if (!batch_.AppendToString(&bytes)) {
    disable("encoding", EINVAL);
    dropped_.fetch_add(kernels, std::memory_order_relaxed);
    return;
  }
  batch_.Clear();
  batch_size_ = 0;
  if (!writeAll(bytes)) {
    disable("writing", errno);
    dropped_.fetch_add(kernels, std::memory_order_relaxed);
    return;
  }
  drops_dirty_ = false;
  written_.fetch_add(1, std::memory_order_relaxed);
}

bool SpoolSink::writeAll(const std::string& bytes) {
  if (fd_ < 0) {
    errno = EBADF;
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool readSpoolFile(const std::string& path, std::vector<flare::v1::RecordBatch>* out,
                   std::string* error) {
  auto fail = [error](std::string message) {
    if (error != nullptr) *error = std::move(message);
    return false;
  };
  try {
    std::unique_ptr<FILE, int (*)(FILE*)> file(fopen(path.c_str(), "rbe"), &fclose);
    if (!file) {
      return fail(fmt::format("{}: {}", path, std::system_category().message(errno)));
    }
    std::string buffer;
    uint64_t offset = 0;
    for (;;) {
      int c = fgetc(file.get());
      if (c == EOF) {
        if (ferror(file.get()))
          return fail(fmt::format("{}: read error at offset {}", path, offset));
        return true;
      }
      uint64_t length = 0;
      int prefix_bytes = 0;
      for (int shift = 0;; shift += 7) {
        ++prefix_bytes;
        length |= static_cast<uint64_t>(c & 0x7f) << shift;
        if ((c & 0x80) == 0) break;
        if (prefix_bytes == 10) {
          return fail(fmt::format("{}: malformed length prefix at offset {}", path, offset));
        }
        c = fgetc(file.get());
        if (c == EOF) {
          return fail(fmt::format("{}: truncated length prefix at offset {}", path, offset));
        }
      }
      if (length > kMaxBatchBytes) {
        return fail(fmt::format("{}: implausible batch length {} at offset {} (garbage?)", path,
                                length, offset));
      }
      buffer.resize(length);
      const size_t got = length == 0 ? 0 : fread(buffer.data(), 1, length, file.get());
      if (got != length) {
        return fail(fmt::format("{}: truncated batch at offset {}: {} of {} bytes", path, offset,
                                got, length));
      }
      flare::v1::RecordBatch batch;
      if (!batch.ParseFromString(buffer)) {
        return fail(fmt::format("{}: malformed batch at offset {}", path, offset));
      }
      out->push_back(std::move(batch));
      offset += static_cast<uint64_t>(prefix_bytes) + length;
    }
  } catch (...) {
    return fail(fmt::format("{}: out of memory while reading", path));
  }
}

}  // namespace flare::timing
