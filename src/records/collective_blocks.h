// The compact encoding of collective records (flare.v1.CollectiveBlock, records.proto) used in
// MODE_SUMMARY, and the count of the records a batch stands for.
//
// CollectiveBlockWriter appends KernelRecord-equivalent instances to the blocks of one batch
// (one block per signature, stream, device, communicator and constant fields); it is used by
// BatchBuilder on the poller thread. expandCollectiveBlocks() turns the blocks of a received or
// read batch back into KernelRecords, so that every reader (flared's ingest, the spool readers:
// flare-export, flare-timeline, flare-diagnose) sees plain records. Not thread-safe; no globals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "flare/v1/records.pb.h"

namespace flare::records {

class CollectiveBlockWriter {
 public:
  // Starts over for a new batch (forgets which block a key went to).
  void reset() { blocks_.clear(); }
  // Appends `rec` (a collective KernelRecord: signature, stream, device, times, flops, bytes,
  // collective info; no thread, span or correlation ids) to `batch`'s block for it. Returns
  // the bytes it added, about.
  size_t add(const flare::v1::KernelRecord& rec, flare::v1::RecordBatch* batch);

 private:
  struct Open {
    int index;           // in batch->collective_blocks()
    uint64_t last_seq;   // of the block's last entry
    int64_t last_issue;  // likewise
  };
  std::unordered_map<uint64_t, Open> blocks_;  // by a hash of the block's constant fields
};

// Replaces `batch`'s collective blocks by the KernelRecords they stand for (appended after the
// batch's own records). Fails, leaving the batch unchanged, when a block's columns differ in
// length (kMalformed) or the batch would hold more than `max_records` kernel records
// (kTooMany); `error` then says why.
enum class Expand { kOk, kMalformed, kTooMany };
Expand expandCollectiveBlocks(flare::v1::RecordBatch* batch, size_t max_records,
                              std::string* error);

// Kernel executions a batch stands for: its kernel records, the instances in its collective
// blocks and the executions its KernelSummary clusters count.
uint64_t recordCount(const flare::v1::RecordBatch& batch);

}  // namespace flare::records
