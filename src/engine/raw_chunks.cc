#include "src/engine/raw_chunks.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "src/common/log.h"

namespace flare::engine {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

constexpr uint8_t kFormat = 1;
constexpr size_t kMinRecordBytes = 5;  // sig, flags and three times: a byte each at least

uint64_t zig(uint64_t a, uint64_t b) {  // zigzag(a − b), wrapping
  return WireFormatLite::ZigZagEncode64(static_cast<int64_t>(a - b));
}
int64_t unzig(uint64_t base, uint64_t z) {  // base + unzigzag(z), wrapping
  return static_cast<int64_t>(base + static_cast<uint64_t>(WireFormatLite::ZigZagDecode64(z)));
}

// Per-record flags: which fields follow (the others repeat: flops and bytes the last record of
// the same signature, the stream the previous record; coll_seq 0 when absent).
constexpr uint32_t kNewStream = 1, kNewFlops = 2, kNewBytes = 4, kCollSeq = 8, kAllFlags = 15;

struct SigLast {
  uint64_t flops = 0, bytes = 0;
};

std::string encode(const RawRecord* recs, size_t n) {
  std::vector<uint64_t> streams;
  std::unordered_map<uint64_t, uint32_t> stream_index;
  for (size_t i = 0; i < n; ++i) {
    if (stream_index.emplace(recs[i].stream, static_cast<uint32_t>(streams.size())).second)
      streams.push_back(recs[i].stream);
  }
  std::string blob;
  {
    StringOutputStream raw(&blob);
    CodedOutputStream out(&raw);
    out.WriteRaw(&kFormat, 1);
    out.WriteVarint64(n);
    out.WriteVarint64(streams.size());
    for (uint64_t s : streams) out.WriteVarint64(s);
    uint64_t prev_start = 0, prev_seq = 0;
    uint32_t prev_stream = 0;
    std::unordered_map<uint32_t, SigLast> last;
    for (size_t i = 0; i < n; ++i) {
      const RawRecord& r = recs[i];
      const uint32_t stream = stream_index[r.stream];
      SigLast& l = last[r.sig_id];
      const uint32_t flags =
          (stream != prev_stream ? kNewStream : 0) | (r.flops != l.flops ? kNewFlops : 0) |
          (r.bytes != l.bytes ? kNewBytes : 0) | (r.coll_seq != 0 ? kCollSeq : 0);
      const auto start = static_cast<uint64_t>(r.start_ns);
      out.WriteVarint64(r.sig_id);
      out.WriteVarint32(flags);
      if (flags & kNewStream) out.WriteVarint32(stream);
      out.WriteVarint64(zig(start, prev_start));
      out.WriteVarint64(zig(start, static_cast<uint64_t>(r.issue_ns)));
      out.WriteVarint64(zig(static_cast<uint64_t>(r.end_ns), start));
      if (flags & kNewFlops) out.WriteVarint64(r.flops);
      if (flags & kNewBytes) out.WriteVarint64(r.bytes);
      if (flags & kCollSeq) {
        out.WriteVarint64(zig(r.coll_seq, prev_seq));
        prev_seq = r.coll_seq;
      }
      l = SigLast{r.flops, r.bytes};
      prev_stream = stream;
      prev_start = start;
    }
  }
  return blob;
}

}  // namespace

std::vector<RawChunk> packRawRecords(std::vector<RawRecord> records) {
  std::stable_sort(records.begin(), records.end(), [](const RawRecord& a, const RawRecord& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.start_ns < b.start_ns;
  });
  std::vector<RawChunk> out;
  for (size_t at = 0; at < records.size();) {
    size_t end = at + 1;
    while (end < records.size() && end - at < kRawChunkMaxRecords &&
           records[end].rank == records[at].rank &&
           static_cast<uint64_t>(records[end].start_ns) -
                   static_cast<uint64_t>(records[at].start_ns) <=
               static_cast<uint64_t>(kRawChunkSpanNs)) {
      ++end;
    }
    RawChunk c;
    c.rank = records[at].rank;
    c.first_start_ns = records[at].start_ns;
    c.last_start_ns = records[end - 1].start_ns;
    c.count = static_cast<uint32_t>(end - at);
    c.blob = encode(&records[at], end - at);
    out.push_back(std::move(c));
    at = end;
  }
  return out;
}

bool unpackRawChunk(int32_t rank, const std::string& blob, std::vector<RawRecord>* out) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(blob.data()), static_cast<int>(blob.size()));
  uint8_t format = 0;
  uint64_t n = 0, nstreams = 0;
  if (!in.ReadRaw(&format, 1) || format != kFormat || !in.ReadVarint64(&n) ||
      !in.ReadVarint64(&nstreams) || n > blob.size() / kMinRecordBytes || nstreams > blob.size()) {
    return false;
  }
  std::vector<uint64_t> streams(nstreams);
  for (uint64_t& s : streams) {
    if (!in.ReadVarint64(&s)) return false;
  }
  const size_t before = out->size();
  out->reserve(before + n);
  auto fail = [&] {
    out->resize(before);
    return false;
  };
  uint64_t prev_start = 0, prev_seq = 0, stream = 0;
  std::unordered_map<uint32_t, SigLast> last;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t sig = 0, dstart = 0, dissue = 0, dur = 0;
    uint32_t flags = 0;
    if (!in.ReadVarint64(&sig) || !in.ReadVarint32(&flags) || (flags & ~kAllFlags) != 0 ||
        sig > std::numeric_limits<uint32_t>::max() ||
        ((flags & kNewStream) && !in.ReadVarint64(&stream)) || stream >= nstreams ||
        !in.ReadVarint64(&dstart) || !in.ReadVarint64(&dissue) || !in.ReadVarint64(&dur)) {
      return fail();
    }
    SigLast& l = last[static_cast<uint32_t>(sig)];
    uint64_t dseq = 0;
    if (((flags & kNewFlops) && !in.ReadVarint64(&l.flops)) ||
        ((flags & kNewBytes) && !in.ReadVarint64(&l.bytes)) ||
        ((flags & kCollSeq) && !in.ReadVarint64(&dseq))) {
      return fail();
    }
    RawRecord r;
    r.rank = rank;
    r.sig_id = static_cast<uint32_t>(sig);
    r.stream = streams[stream];
    r.start_ns = unzig(prev_start, dstart);
    const auto start = static_cast<uint64_t>(r.start_ns);
    r.issue_ns = static_cast<int64_t>(start - static_cast<uint64_t>(unzig(0, dissue)));
    r.end_ns = unzig(start, dur);
    r.flops = l.flops;
    r.bytes = l.bytes;
    if (flags & kCollSeq) {
      r.coll_seq = static_cast<uint64_t>(unzig(prev_seq, dseq));
      prev_seq = r.coll_seq;
    }
    prev_start = start;
    out->push_back(r);
  }
  if (in.CurrentPosition() != static_cast<int>(blob.size())) {
    out->resize(before);
    return false;
  }
  return true;
}

void noteCorruptRawChunk(std::atomic<uint64_t>* errors) {
  errors->fetch_add(1, std::memory_order_relaxed);
  common::logOnce(common::LogLevel::kError, "engine", "corrupt-raw-chunk",
                  "store: a raw_chunks row does not decode (a damaged database file?); its "
                  "records are skipped (flare_store_errors_total)");
}

int64_t rawChunkLowerBound(int64_t since_ns) {
  return since_ns < std::numeric_limits<int64_t>::min() + kRawChunkSpanNs
             ? std::numeric_limits<int64_t>::min()
             : since_ns - kRawChunkSpanNs;
}

bool RawSelection::wants(int64_t next_first_start_ns) const {
  if (limit_ == 0 || next_first_start_ns >= until_) return false;
  // threshold_ only falls as records are added, so a stale one still bounds the answer: a
  // chunk starting at or after it can add nothing that the selection keeps (ties go to the
  // records fed first).
  return !trimmed_ || next_first_start_ns < threshold_;
}

bool RawSelection::add(int32_t rank, const std::string& blob) {
  scratch_.clear();
  if (!unpackRawChunk(rank, blob, &scratch_)) return false;
  for (const RawRecord& r : scratch_) {
    if (r.start_ns >= since_ && r.start_ns < until_) kept_.push_back(r);
  }
  // The first trim sets the threshold; later ones run at 1.5 times the limit (each removes at
  // least half a limit's records: amortized O(1) a record, at most 1.5 limits held).
  if (kept_.size() >= (trimmed_ ? limit_ + limit_ / 2 + 1 : limit_)) trim();
  return true;
}

void RawSelection::trim() {
  if (limit_ == 0 || kept_.size() < limit_) return;
  std::vector<int64_t> starts;
  starts.reserve(kept_.size());
  for (const RawRecord& r : kept_) starts.push_back(r.start_ns);
  std::nth_element(starts.begin(), starts.begin() + static_cast<ptrdiff_t>(limit_ - 1),
                   starts.end());
  const int64_t t = starts[limit_ - 1];
  size_t at_t = limit_;  // room for records starting exactly at t, in feeding order
  for (const RawRecord& r : kept_) at_t -= r.start_ns < t ? 1 : 0;
  size_t w = 0;
  for (const RawRecord& r : kept_) {
    if (r.start_ns < t || (r.start_ns == t && at_t > 0)) {
      if (r.start_ns == t) --at_t;
      kept_[w++] = r;
    }
  }
  kept_.resize(w);
  threshold_ = t;
  trimmed_ = true;
}

std::vector<RawRecord> RawSelection::take() {
  trim();
  std::stable_sort(kept_.begin(), kept_.end(),
                   [](const RawRecord& a, const RawRecord& b) { return a.start_ns < b.start_ns; });
  return std::move(kept_);
}

bool splitRawChunk(const std::string& job, int32_t rank, const std::string& blob, int64_t cutoff,
                   RawFold* fold, std::map<std::string, std::vector<RawRecord>>* kept) {
  std::vector<RawRecord> recs;
  if (!unpackRawChunk(rank, blob, &recs)) return false;
  for (const RawRecord& r : recs) {
    if (r.start_ns < cutoff) {
      fold->add(job, r);
    } else {
      (*kept)[job].push_back(r);
    }
  }
  return true;
}

void RawFold::add(const std::string& job_id, const RawRecord& r) {
  const int64_t w = r.start_ns / window_ns_ * window_ns_;
  Acc& a = acc_[{job_id, r.rank, r.sig_id, r.stream, w}];
  const int64_t d = r.end_ns - r.start_ns;
  a.max_ns = a.count == 0 ? d : std::max(a.max_ns, d);
  ++a.count;
  a.sum_ns += d;
  ++records_;
}

std::vector<WindowSummaryRow> RawFold::rows() const {
  std::vector<WindowSummaryRow> out;
  out.reserve(acc_.size());
  for (const auto& [key, a] : acc_) {
    const auto& [job, rank, sig, stream, w] = key;
    WindowSummaryRow r;
    r.job_id = job;
    r.rank = rank;
    r.sig_id = sig;
    r.stream = stream;
    r.window_start_ns = w;
    r.window_end_ns = w + window_ns_;
    r.count = a.count;
    r.sum_ns = a.sum_ns;
    r.p50_ns = a.sum_ns / static_cast<int64_t>(a.count);
    r.p99_ns = a.max_ns;
    r.source = "raw";
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace flare::engine
