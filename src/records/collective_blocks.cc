#include "src/records/collective_blocks.h"

namespace flare::records {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

uint64_t blockKey(const flare::v1::KernelRecord& r) {
  const flare::v1::CollectiveInfo& c = r.collective();
  uint64_t h = mix(0, r.signature_id());
  h = mix(h, r.stream_id());
  h = mix(h, static_cast<uint32_t>(r.device()));
  h = mix(h, c.comm_hash());
  h = mix(h, static_cast<uint32_t>(c.nranks()));
  h = mix(h, static_cast<uint32_t>(c.rank_in_comm()));
  h = mix(h, c.count());
  h = mix(h, c.has_peer() ? static_cast<uint32_t>(c.peer()) + 1ULL : 0);
  h = mix(h, c.has_root() ? static_cast<uint32_t>(c.root()) + 1ULL : 0);
  h = mix(h, static_cast<uint64_t>(c.op()));
  h = mix(h, r.flops());
  return mix(h, r.bytes());
}

bool sameBlock(const flare::v1::CollectiveBlock& b, const flare::v1::KernelRecord& r) {
  const flare::v1::CollectiveInfo& c = r.collective();
  const flare::v1::CollectiveInfo& i = b.info();
  return b.signature_id() == r.signature_id() && b.stream_id() == r.stream_id() &&
         b.device() == r.device() && b.flops() == r.flops() && b.bytes() == r.bytes() &&
         i.comm_hash() == c.comm_hash() && i.nranks() == c.nranks() &&
         i.rank_in_comm() == c.rank_in_comm() && i.count() == c.count() && i.op() == c.op() &&
         i.has_peer() == c.has_peer() && i.peer() == c.peer() && i.has_root() == c.has_root() &&
         i.root() == c.root();
}

size_t varintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
size_t sintBytes(int64_t v) {
  return varintBytes((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

}  // namespace

size_t CollectiveBlockWriter::add(const flare::v1::KernelRecord& rec,
                                  flare::v1::RecordBatch* batch) {
  const uint64_t key = blockKey(rec);
  auto it = blocks_.find(key);
  size_t added = 0;
  if (it == blocks_.end() || !sameBlock(batch->collective_blocks(it->second.index), rec)) {
    flare::v1::CollectiveBlock* b = batch->add_collective_blocks();
    b->set_signature_id(rec.signature_id());
    b->set_stream_id(rec.stream_id());
    b->set_device(rec.device());
    *b->mutable_info() = rec.collective();
    b->mutable_info()->clear_seq();
    b->set_flops(rec.flops());
    b->set_bytes(rec.bytes());
    b->set_base_seq(rec.collective().seq());
    b->set_base_issue_ns(rec.issue_ns());
    // A hash collision with a different block simply starts another block.
    it = blocks_
             .insert_or_assign(key, Open{batch->collective_blocks_size() - 1,
                                         rec.collective().seq(), rec.issue_ns()})
             .first;
    added += b->ByteSizeLong();
  }
  Open& o = it->second;
  flare::v1::CollectiveBlock* b = batch->mutable_collective_blocks(o.index);
  const int64_t seq_delta =
      static_cast<int64_t>(rec.collective().seq()) - static_cast<int64_t>(o.last_seq);
  const int64_t issue_delta = rec.issue_ns() - o.last_issue;
  const int64_t latency = rec.start_ns() - rec.issue_ns();
  const int64_t duration = rec.end_ns() - rec.start_ns();
  b->add_seq_delta(seq_delta);
  b->add_issue_delta_ns(issue_delta);
  b->add_issue_latency_ns(latency);
  b->add_duration_ns(duration);
  o.last_seq = rec.collective().seq();
  o.last_issue = rec.issue_ns();
  return added + sintBytes(seq_delta) + sintBytes(issue_delta) + sintBytes(latency) +
         sintBytes(duration);
}

Expand expandCollectiveBlocks(flare::v1::RecordBatch* batch, size_t max_records,
                              std::string* error) {
  if (batch->collective_blocks_size() == 0) return Expand::kOk;
  size_t total = static_cast<size_t>(batch->kernels_size());
  for (const flare::v1::CollectiveBlock& b : batch->collective_blocks()) {
    const int n = b.seq_delta_size();
    if (b.issue_delta_ns_size() != n || b.issue_latency_ns_size() != n ||
        b.duration_ns_size() != n) {
      *error = "collective block of signature " + std::to_string(b.signature_id()) +
               ": columns of different lengths";
      return Expand::kMalformed;
    }
    total += static_cast<size_t>(n);
    if (total > max_records) {
      *error = "collective blocks expand to more than " + std::to_string(max_records) + " records";
      return Expand::kTooMany;
    }
  }
  batch->mutable_kernels()->Reserve(static_cast<int>(total));
  for (const flare::v1::CollectiveBlock& b : batch->collective_blocks()) {
    // Unsigned arithmetic: hostile deltas wrap instead of overflowing (the validator then
    // rejects the absurd times).
    uint64_t seq = b.base_seq();
    uint64_t issue = static_cast<uint64_t>(b.base_issue_ns());
    for (int i = 0; i < b.seq_delta_size(); ++i) {
      seq += static_cast<uint64_t>(b.seq_delta(i));
      issue += static_cast<uint64_t>(b.issue_delta_ns(i));
      const uint64_t start = issue + static_cast<uint64_t>(b.issue_latency_ns(i));
      const uint64_t end = start + static_cast<uint64_t>(b.duration_ns(i));
      flare::v1::KernelRecord* k = batch->add_kernels();
      k->set_signature_id(b.signature_id());
      k->set_stream_id(b.stream_id());
      k->set_device(b.device());
      k->set_issue_ns(static_cast<int64_t>(issue));
      k->set_start_ns(static_cast<int64_t>(start));
      k->set_end_ns(static_cast<int64_t>(end));
      k->set_issue_latency_ns(b.issue_latency_ns(i));
      k->set_flops(b.flops());
      k->set_bytes(b.bytes());
      *k->mutable_collective() = b.info();
      k->mutable_collective()->set_seq(seq);
    }
  }
  batch->clear_collective_blocks();
  return Expand::kOk;
}

uint64_t recordCount(const flare::v1::RecordBatch& batch) {
  uint64_t n = static_cast<uint64_t>(batch.kernels_size());
  for (const auto& b : batch.collective_blocks()) n += static_cast<uint64_t>(b.seq_delta_size());
  for (const auto& s : batch.summaries())
    for (const auto& c : s.clusters()) n += c.count();
  return n;
}

}  // namespace flare::records
