// The local spool: a Sink that appends the Tracer's output to a file as flare.v1.RecordBatch
// messages, and the reader for such files.
//
// File: DIR/<job>/<rank>/records-<pid>.pb, a sequence of length-delimited RecordBatch messages
// (protobuf's delimited format: a varint byte count, then the message), appended with write(2):
//
//   ┌────────┬──────────────────────┬────────┬──────────────────────┬───
//   │ varint │ RecordBatch (≤ ~64K) │ varint │ RecordBatch          │ ...
//   └────────┴──────────────────────┴────────┴──────────────────────┴───
//
// Each batch carries the signatures first seen since the previous batch (a signature is
// written once, in the batch that holds the first op using it or an earlier one), the kernel
// records, the cumulative drop counters and batch_seq (1, 2, ... without gaps). Times are
// converted from CLOCK_MONOTONIC to Unix-epoch nanoseconds with a ClockMap sampled when each
// batch is opened. A batch is cut at about batch_bytes or at flush(). A crash loses at most the
// open batch; a crash during a write leaves a truncated last batch, which readSpoolFile()
// reports (returning the complete batches before it).
//
// Failure: if the directory cannot be created or a write fails (disk full, permissions), the
// sink logs one warning, closes the file and drops everything after (dropped records are
// counted). It never throws and never blocks on anything but write(2).
//
// Threading: the Sink methods are called on the Tracer's poller thread only; the accessors are
// safe from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "flare/v1/records.pb.h"
#include "src/common/clock.h"
#include "src/timing/timing.h"

namespace flare::timing {

struct SpoolSinkOptions {
  size_t batch_bytes = 64 * 1024;  // a batch is written once its records reach about this size
  // Monotonic → epoch map, taken each time a batch is opened. Default: ClockMap::sample().
  std::function<common::ClockMap()> clock_map;
};

class SpoolSink final : public Sink {
 public:
  // `job_id` is made safe as one path component (anything but [A-Za-z0-9._-] becomes '_').
  // Creates the directories and opens (appends to) the file; on failure the sink is disabled.
  SpoolSink(const std::string& dir, const std::string& job_id, int rank, int pid,
            SpoolSinkOptions options = {});
  ~SpoolSink() override;  // writes the open batch
  SpoolSink(const SpoolSink&) = delete;
  SpoolSink& operator=(const SpoolSink&) = delete;

  void onSignature(uint32_t id, const Signature& sig) override;
  void onOps(std::span<const CompletedOp> ops) override;
  void onDrops(const DropCounters& totals) override;
  void flush() override;

  const std::string& path() const { return path_; }
  bool disabled() const { return disabled_.load(std::memory_order_acquire); }
  uint64_t batchesWritten() const { return written_.load(std::memory_order_relaxed); }
  // Kernel records not written because the sink failed or was disabled.
  uint64_t recordsDropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  void openBatch();
  void closeBatch();
  void disable(const std::string& what, int err);
  bool writeAll(const std::string& bytes);

  const int rank_;
  std::string path_;
  SpoolSinkOptions options_;
  int fd_ = -1;
  std::atomic<bool> disabled_{false};
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> dropped_{0};

  flare::v1::RecordBatch batch_;
  size_t batch_size_ = 0;  // estimate of batch_'s encoded size
  bool batch_open_ = false;
  uint64_t batch_seq_ = 0;
  common::ClockMap clock_map_;
  DropCounters drops_;
  bool drops_dirty_ = false;
  std::unordered_map<uint32_t, uint64_t> collective_counts_;  // signature id → count (shape[0])
};

// Reads a spool file. On success returns true with every batch in `out` (appended). On a
// truncated or malformed file returns false with a message in `error` (offset included);
// `out` then holds the complete batches before the bad one. An empty file is valid.
bool readSpoolFile(const std::string& path, std::vector<flare::v1::RecordBatch>* out,
                   std::string* error);

// The wire enum of an OpKind and of a dtype string ("bf16", "fp16", "float32", ...).
flare::v1::OpKind toProtoKind(OpKind kind);
flare::v1::DType toProtoDType(const std::string& dtype);

}  // namespace flare::timing
