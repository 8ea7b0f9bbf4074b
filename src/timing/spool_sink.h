// The local spool: a Sink that appends the Tracer's output to a file as flare.v1.RecordBatch
// messages. The file format and its reader (readSpoolFile) are src/records/spool_format.h.
//
// File: DIR/<job>/<rank>/records-<pid>.pb, a sequence of length-delimited RecordBatch messages
// (spool_format.h), appended with write(2). The batches come from a BatchBuilder
// (batch_builder.h: tables before records, epoch times, cumulative drop counters, batch_seq
// 1, 2, ... without gaps), cut at about batch_bytes or at flush(). A crash loses at most the
// open batch; a crash during a write leaves a truncated last batch, which
// records::readSpoolFile() reports (returning the complete batches before it).
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
#include "src/timing/batch_builder.h"
#include "src/timing/timing.h"

namespace flare::timing {

struct SpoolSinkOptions {
  size_t batch_bytes = 64 * 1024;  // a batch is written once its records reach about this size
  // Monotonic → epoch map, taken each time a batch is opened. Default: ClockMap::sample().
  std::function<common::ClockMap()> clock_map;
  // MODE_SUMMARY: compute ops are written as KernelSummary messages (batch_builder.h).
  bool summary = false;
  int64_t summary_window_ns = 1'000'000'000;
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
  void finish() override;
  void onWatermark(int64_t issued_before_ns) override { builder_.setWatermark(issued_before_ns); }
  void onApiName(uint32_t id, const std::string& qualified_name) override;
  void onSpans(std::span<const CompletedSpan> spans) override;
  void onGraphLaunches(std::span<const int64_t> issue_ns) override;
  void onDeepTrace(std::span<const DeepTraceRecord> records) override;
  void onDevice(const DeviceDescription& device) override;

  const std::string& path() const { return path_; }
  bool disabled() const { return disabled_.load(std::memory_order_acquire); }
  uint64_t batchesWritten() const { return written_.load(std::memory_order_relaxed); }
  // Kernel records not written because the sink failed or was disabled.
  uint64_t recordsDropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  void write(const flare::v1::RecordBatch& batch);  // the builder's emit
  void disable(const std::string& what, int err);
  bool writeAll(const std::string& bytes);

  BatchBuilder builder_;
  std::string path_;
  int fd_ = -1;
  std::atomic<bool> disabled_{false};
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace flare::timing
