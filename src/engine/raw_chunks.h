// Raw kernel records as the store keeps them: packed, per rank, into chunks of consecutive
// records (both stores: sqlite_store.cc, pg_store.cc; table raw_chunks).
//
// A row per record cost ~75 bytes in SQLite (the job id, nine integers, the rowid and an index
// entry), which made the raw collective records of a summary-mode rank 12 KB per step in the
// store against ~1.2 KB on the wire. A chunk holds up to kRawChunkMaxRecords records of one rank
// whose starts lie within kRawChunkSpanNs, sorted by start and delta-encoded as varints:
// ~10–14 bytes a record. Queries read the chunks that overlap their range and decode them
// (selectRawRecords); retention decodes the chunks that reach past the raw window, folds their
// old records into one-minute window rows and keeps the rest (foldRawRecords).
//
// The blob, format 1: a byte 1; varint count; varint stream count, then the streams (varint);
// per record, in start order: sig_id, a flags varint, the stream index (when it differs from the
// previous record's), zigzag(start − previous start), zigzag(start − issue), zigzag(end − start),
// flops and bytes (when they differ from the last record of the same signature's; 0 at first),
// and zigzag(coll_seq − previous coll_seq) when coll_seq is not 0. Differences wrap modulo 2^64,
// so any int64 values round-trip. A blob that does not parse (a corrupt file) yields no
// records and is counted, never trusted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "src/engine/store.h"

namespace flare::engine {

constexpr int64_t kRawChunkSpanNs = 10LL * 1000000000LL;  // first to last start in a chunk
constexpr size_t kRawChunkMaxRecords = 4096;

struct RawChunk {
  int32_t rank = 0;
  int64_t first_start_ns = 0;  // the chunk's records start within [first, last]
  int64_t last_start_ns = 0;
  uint32_t count = 0;
  std::string blob;
};

// Groups the records by rank, sorts each rank's by start (stable) and cuts them into chunks.
std::vector<RawChunk> packRawRecords(std::vector<RawRecord> records);

// Appends the chunk's records (rank set) to *out; false, appending nothing, if the blob is
// malformed.
bool unpackRawChunk(int32_t rank, const std::string& blob, std::vector<RawRecord>* out);

// Counts a chunk that does not decode in *errors (flare_store_errors_total) and says so once.
void noteCorruptRawChunk(std::atomic<uint64_t>* errors);

// The first `limit` records by start in [since_ns, until_ns), fed chunk by chunk in order of
// their first start: what `SELECT ... WHERE start_ns >= since AND start_ns < until ORDER BY
// start_ns LIMIT limit` returned when records were rows. Ties keep the feeding order.
class RawSelection {
 public:
  RawSelection(int64_t since_ns, int64_t until_ns, size_t limit)
      : since_(since_ns), until_(until_ns), limit_(limit) {}
  // False once no later chunk (first start >= next_first_start_ns) can contribute.
  bool wants(int64_t next_first_start_ns) const;
  // Feeds one chunk; false if its blob is malformed (it contributes nothing).
  bool add(int32_t rank, const std::string& blob);
  std::vector<RawRecord> take();

 private:
  void trim();
  int64_t since_, until_;
  size_t limit_;
  bool trimmed_ = false;
  int64_t threshold_ = 0;  // the limit-th start at the last trim
  std::vector<RawRecord> kept_;
  std::vector<RawRecord> scratch_;
};

// The chunk query's lower bound on the first start: a chunk whose first start is earlier than
// since − kRawChunkSpanNs cannot hold a record at or after since.
int64_t rawChunkLowerBound(int64_t since_ns);

class RawFold;

// Retention's split of one stored chunk at `cutoff`: its records that start before it go to
// *fold, the rest to (*kept)[job] (to be packed again). False, and nothing added, if the blob
// does not decode.
bool splitRawChunk(const std::string& job, int32_t rank, const std::string& blob, int64_t cutoff,
                   RawFold* fold, std::map<std::string, std::vector<RawRecord>>* kept);

// One-minute (window_ns) window rows of raw records: count, sum, mean as p50, max as p99,
// source "raw" — the fold the stores apply to records past the raw window.
class RawFold {
 public:
  explicit RawFold(int64_t window_ns) : window_ns_(window_ns) {}
  void add(const std::string& job_id, const RawRecord& r);
  uint64_t records() const { return records_; }
  std::vector<WindowSummaryRow> rows() const;

 private:
  struct Acc {
    uint64_t count = 0;
    int64_t sum_ns = 0;
    int64_t max_ns = 0;
  };
  int64_t window_ns_;
  uint64_t records_ = 0;
  std::map<std::tuple<std::string, int32_t, uint32_t, uint64_t, int64_t>, Acc> acc_;
};

}  // namespace flare::engine
