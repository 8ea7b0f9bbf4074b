// The spool file format: what the rank's writers (src/timing's SpoolSink and the exporter's
// pending spool) and every reader (flare-export, flare-timeline, flare-replay, flared's records
// API) agree on, and the reader itself.
//
// A spool file is a sequence of length-delimited flare.v1.RecordBatch messages (protobuf's
// delimited format: a varint byte count, then the message), appended with write(2):
//
//   ┌────────┬──────────────────────┬────────┬──────────────────────┬───
//   │ varint │ RecordBatch (≤ ~64K) │ varint │ RecordBatch          │ ...
//   └────────┴──────────────────────┴────────┴──────────────────────┴───
//
// A crash during a write leaves a truncated last batch, which readSpoolFile() reports (returning
// the complete batches before it). MODE_SUMMARY batches carry compact collective blocks
// (collective_blocks.h); the reader expands them, so callers see one record per collective.
//
// Threading: plain functions, callable from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flare/v1/records.pb.h"

namespace flare::records {

// A batch longer than this is not one a writer produced (they cut at ~64 KiB): the reader's
// plausibility bound against garbage length prefixes.
inline constexpr uint64_t kMaxSpoolBatchBytes = 64ull << 20;
// Records one batch may stand for once its collective blocks are expanded, likewise.
inline constexpr size_t kMaxSpoolExpandedRecords = 16u << 20;

// Appends `value` as a protobuf varint (the length prefix of the delimited format).
void appendVarint(std::string* out, uint64_t value);

// Reads a spool file. On success returns true with every batch in `out` (appended). On a
// truncated or malformed file returns false with a message in `error` (offset included);
// `out` then holds the complete batches before the bad one. An empty file is valid.
bool readSpoolFile(const std::string& path, std::vector<flare::v1::RecordBatch>* out,
                   std::string* error);

}  // namespace flare::records
