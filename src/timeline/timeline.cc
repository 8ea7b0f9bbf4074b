#include "src/timeline/timeline.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "src/common/mix.h"
#include "src/common/text.h"
#include "src/records/op_kind.h"
#include "src/records/spool_format.h"
#include "src/records/step_stats.h"

namespace flare::timeline {
namespace {

namespace fs = std::filesystem;
using flare::v1::OpKind;
using CollKey = std::pair<uint64_t, uint64_t>;  // (communicator, sequence number)

constexpr int64_t kLaunchSliceNs = 1'000;  // nominal width of a launch slice (see header)

// Group collectives only, not send/recv (records::isCollective counts both): a collective
// instance is matched across all members of its communicator by (communicator, sequence number)
// and linked by flow arrows; point-to-point ops have no such all-member instance.
bool isGroupCollective(const flare::v1::Signature& sig) {
  return sig.kind() == flare::v1::OP_KIND_COLLECTIVE;
}

// The API call that issued an op, as the CPU-side slice is named (Kineto's runtime events).
std::string launchName(const flare::v1::Signature& sig) {
  const std::string& lib = sig.library();
  if (lib == "cublas" || lib == "cublasLt" || lib == "nccl") return sig.name();
  switch (sig.kind()) {
    case flare::v1::OP_KIND_MEMCPY:
      return "cudaMemcpyAsync";
    case flare::v1::OP_KIND_MEMSET:
      return "cudaMemsetAsync";
    case flare::v1::OP_KIND_GRAPH:
      return "cudaGraphLaunch";
    default:
      return "cudaLaunchKernel";
  }
}

// Kineto's categories for GPU-side events.
const char* gpuCategory(const flare::v1::Signature& sig) {
  switch (sig.kind()) {
    case flare::v1::OP_KIND_MEMCPY:
      return "gpu_memcpy";
    case flare::v1::OP_KIND_MEMSET:
      return "gpu_memset";
    default:
      return "kernel";
  }
}

// Everything a rank's batches say, loaded for one rank at a time.
struct RankData {
  std::unordered_map<uint32_t, flare::v1::Signature> sigs;
  std::unordered_map<uint32_t, std::string> apis;
  std::vector<flare::v1::KernelRecord> kernels;
  std::vector<flare::v1::ApiSpan> spans;
  std::vector<flare::v1::DeepTraceRecord> deep;  // CUPTI deep-trace records
};

bool loadRank(const RankSource& src, RankData* data, std::string* error) {
  return src.for_each_batch(
      [data](const flare::v1::RecordBatch& b) {
        for (const auto& s : b.signatures()) data->sigs[s.id()] = s;
        for (const auto& a : b.api_names()) data->apis[a.id()] = a.qualified_name();
        for (const auto& k : b.kernels()) data->kernels.push_back(k);
        for (const auto& s : b.spans()) data->spans.push_back(s);
        for (const auto& d : b.deep_trace()) data->deep.push_back(d);
      },
      error);
}

// What the first pass keeps of every rank.
struct Pass1 {
  std::map<int, std::map<CollKey, int64_t>> ends;   // rank -> collective -> end time
  std::map<CollKey, std::vector<int>> members;      // collective -> ranks, ascending
  std::map<int, std::vector<int64_t>> step_starts;  // rank -> step boundaries
  int64_t base_ns = std::numeric_limits<int64_t>::max();
};

bool firstPass(const std::vector<RankSource>& sources, Pass1* p1, Summary* summary) {
  bool any = false;
  for (const RankSource& src : sources) {
    RankData data;
    std::string error;
    if (!loadRank(src, &data, &error)) {
      summary->warnings.push_back("rank " + std::to_string(src.rank) + ": " + error);
    }
    any = any || !data.kernels.empty() || !data.spans.empty();
    auto& ends = p1->ends[src.rank];
    for (const auto& k : data.kernels) {
      p1->base_ns = std::min(p1->base_ns, std::min(k.issue_ns(), k.start_ns()));
      auto sig = data.sigs.find(k.signature_id());
      if (sig == data.sigs.end() || !isGroupCollective(sig->second) || !k.has_collective())
        continue;
      const CollKey key{k.collective().comm_hash(), k.collective().seq()};
      ends[key] = k.end_ns();
      p1->members[key].push_back(src.rank);
    }
    std::vector<records::StepCall> calls;
    for (const auto& s : data.spans) {
      p1->base_ns = std::min(p1->base_ns, s.start_ns());
      auto api = data.apis.find(s.api_id());
      if (api == data.apis.end()) continue;
      const records::StepCallKind kind = records::stepCallKind(api->second);
      if (kind != records::StepCallKind::kOther) calls.push_back({s.start_ns(), kind});
    }
    for (const auto& k : data.kernels) {  // graph launches are training work
      auto sig = data.sigs.find(k.signature_id());
      if (sig != data.sigs.end() && sig->second.kind() == flare::v1::OP_KIND_GRAPH)
        calls.push_back({k.issue_ns(), records::StepCallKind::kTraining});
    }
    p1->step_starts[src.rank] = records::stepBoundaries(std::move(calls));
  }
  for (auto& [key, ranks] : p1->members) std::sort(ranks.begin(), ranks.end());
  if (p1->base_ns == std::numeric_limits<int64_t>::max()) p1->base_ns = 0;
  return any;
}

// Streams trace events into a FILE*, separating them with commas.
class EventWriter {
 public:
  explicit EventWriter(FILE* out) : out_(out) {}
  void event(const std::string& json) {
    std::fputs(first_ ? "\n" : ",\n", out_);
    std::fputs(json.c_str(), out_);
    first_ = false;
  }

 private:
  FILE* out_;
  bool first_ = true;
};

std::string usFrom(int64_t ns, int64_t base_ns) {
  const int64_t rel = ns - base_ns;
  char buf[48];
  // Microseconds with nanosecond decimals, exact (no double rounding).
  const char* sign = rel < 0 ? "-" : "";
  const uint64_t mag = rel < 0 ? static_cast<uint64_t>(-rel) : static_cast<uint64_t>(rel);
  std::snprintf(buf, sizeof(buf), "%s%" PRIu64 ".%03" PRIu64, sign, mag / 1000, mag % 1000);
  return buf;
}

std::string durUs(int64_t ns) {
  return usFrom(std::max<int64_t>(ns, 0), 0);
}

struct Ids {
  int cpu_pid = 0;
  int gpu_pid_base = 0;
};

// A CPU-side slice before writing (sorted and fitted per thread).
struct CpuSlice {
  int64_t start = 0;
  int64_t end = 0;
  bool launch = false;
  std::string json_head;  // "name":..,"cat":..  (args appended)
  std::string args;       // the args object's members
  uint64_t flow_id = 0;   // launch slices: the ac2g flow
};

class RankWriter {
 public:
  RankWriter(EventWriter* w, const Pass1& p1, const Options& opt, const RankSource& src, Ids ids,
             int64_t offset, uint64_t* next_flow_id, Summary* summary, bool link_collectives)
      : link_collectives_(link_collectives),
        w_(w),
        p1_(p1),
        opt_(opt),
        src_(src),
        ids_(ids),
        offset_(offset),
        next_flow_id_(next_flow_id),
        summary_(summary) {}

  bool write(std::string* error);

 private:
  int64_t t(int64_t ns) const { return ns - offset_; }
  std::string ts(int64_t ns) const { return usFrom(t(ns), p1_.base_ns); }
  bool inWindow(int64_t ns) const { return ns >= window_.first && ns < window_.second; }
  int streamTid(uint64_t stream_id);
  void writeGpu(const RankData& data);
  void writeDeepTrace(const RankData& data);
  void writeCpu(const RankData& data);
  void metadata();

  const bool link_collectives_;  // per-rank files cannot hold links to other ranks
  EventWriter* w_;
  const Pass1& p1_;
  const Options& opt_;
  const RankSource& src_;
  Ids ids_;
  int64_t offset_;
  uint64_t* next_flow_id_;
  Summary* summary_;
  std::pair<int64_t, int64_t> window_{std::numeric_limits<int64_t>::min(),
                                      std::numeric_limits<int64_t>::max()};
  std::map<uint64_t, int> stream_tids_;       // stream id -> small tid
  std::set<int> devices_;                     // GPU devices seen
  std::set<std::pair<int, int>> gpu_tracks_;  // (device, tid)
  std::set<uint64_t> threads_;
  std::map<uint64_t, std::vector<CpuSlice>> cpu_;  // thread -> slices
  // Traced GPU ops per device (start, end, track tid, correlation): deep-trace records are
  // matched to the traced op whose interval contains theirs.
  struct TracedSpan {
    int64_t start, end;
    int tid;
    uint64_t correlation;
  };
  std::map<int, std::vector<TracedSpan>> traced_;
  std::set<uint64_t> cupti_streams_;  // stream ids of unmatched CUPTI streams (kCuptiStream bit)
};

// Stream-id bit of the tracks made for CUPTI streams no traced op maps to.
constexpr uint64_t kCuptiStream = uint64_t{1} << 63;

int RankWriter::streamTid(uint64_t stream_id) {
  auto it = stream_tids_.find(stream_id);
  if (it != stream_tids_.end()) return it->second;
  // Kineto numbers streams with small integers; 0 stays the legacy default stream.
  const int tid = stream_id == 0 ? 0 : static_cast<int>(stream_tids_.size()) + 1;
  stream_tids_[stream_id] = tid;
  return tid;
}

bool RankWriter::write(std::string* error) {
  if (opt_.steps) {
    auto it = p1_.step_starts.find(src_.rank);
    const std::vector<int64_t> empty;
    const auto& starts = it == p1_.step_starts.end() ? empty : it->second;
    const auto [first, last] = *opt_.steps;
    if (starts.size() <= first) {
      summary_->warnings.push_back("rank " + std::to_string(src_.rank) + ": no step " +
                                   std::to_string(first) + " (it recorded " +
                                   std::to_string(starts.size()) + " steps)");
      return true;
    }
    window_.first = starts[first];
    if (last + 1 < starts.size()) window_.second = starts[last + 1];
  }
  RankData data;
  std::string load_error;
  if (!loadRank(src_, &data, &load_error)) {
    summary_->warnings.push_back("rank " + std::to_string(src_.rank) + ": " + load_error);
  }
  (void)error;
  writeGpu(data);
  writeDeepTrace(data);
  writeCpu(data);
  metadata();
  return true;
}

void RankWriter::writeGpu(const RankData& data) {
  // Per GPU track, ops sorted by start; overlaps from clock-map steps between batches (a few
  // ns) are clipped so that slices on one track nest, as Perfetto requires.
  struct Op {
    const flare::v1::KernelRecord* rec;
    const flare::v1::Signature* sig;
  };
  std::map<std::pair<int, int>, std::vector<Op>> tracks;
  const flare::v1::Signature unknown;
  for (const auto& k : data.kernels) {
    auto sig_it = data.sigs.find(k.signature_id());
    const flare::v1::Signature* sig = sig_it == data.sigs.end() ? &unknown : &sig_it->second;
    if (sig_it == data.sigs.end()) {
      summary_->warnings.push_back("rank " + std::to_string(src_.rank) +
                                   ": record with unknown signature " +
                                   std::to_string(k.signature_id()));
    }
    if (sig->kind() == flare::v1::OP_KIND_SYNC) {
      if (!inWindow(k.start_ns())) continue;
      CpuSlice s;
      s.start = k.start_ns();
      s.end = std::max(k.end_ns(), k.start_ns());
      s.json_head = "\"name\":" + common::jsonQuote(sig->name()) + ",\"cat\":\"cuda_runtime\"";
      s.args = "\"kind\":\"sync\"";
      cpu_[k.thread_id()].push_back(std::move(s));
      continue;
    }
    if (!inWindow(k.issue_ns())) continue;
    devices_.insert(k.device());
    tracks[{k.device(), streamTid(k.stream_id())}].push_back(Op{&k, sig});
  }
  for (auto& [track, ops] : tracks) {
    std::sort(ops.begin(), ops.end(),
              [](const Op& a, const Op& b) { return a.rec->start_ns() < b.rec->start_ns(); });
    gpu_tracks_.insert(track);
    int64_t prev_end = std::numeric_limits<int64_t>::min();
    for (const Op& op : ops) {
      const auto& k = *op.rec;
      const auto& sig = *op.sig;
      int64_t start = std::max(k.start_ns(), prev_end);
      const int64_t end = std::max(k.end_ns(), start);
      prev_end = end;
      const int pid = ids_.gpu_pid_base + track.first;
      const int64_t dur = end - start;
      const uint64_t flow = (*next_flow_id_)++;
      const uint64_t correlation = k.correlation_id() != 0 ? k.correlation_id() : flow;
      traced_[track.first].push_back(TracedSpan{start, end, track.second, correlation});
      std::string args = "\"device\":" + std::to_string(k.device()) +
                         ",\"stream\":" + std::to_string(track.second) +
                         ",\"correlation\":" + std::to_string(correlation) + ",\"kind\":\"" +
                         common::enumLabel(OpKind_Name(sig.kind()), "OP_KIND_") + "\"" +
                         ",\"issue latency us\":" + durUs(k.issue_latency_ns());
      if (sig.shape_size() > 0) {
        args += ",\"shape\":[";
        for (int i = 0; i < sig.shape_size(); ++i)
          args += (i ? "," : "") + std::to_string(sig.shape(i));
        args += "]";
      }
      if (sig.dtype() != flare::v1::DTYPE_UNSPECIFIED)
        args += ",\"dtype\":\"" + common::enumLabel(DType_Name(sig.dtype()), "DTYPE_") + "\"";
      if (!sig.layout().empty()) args += ",\"layout\":" + common::jsonQuote(sig.layout());
      const uint64_t flops = k.flops() ? k.flops() : sig.flops_per_call();
      if (flops > 0) {
        args += ",\"flops\":" + std::to_string(flops);
        if (dur > 0) {
          char buf[32];
          std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(flops) / dur / 1e3);
          args += ",\"TFLOPS\":" + std::string(buf);
        }
      }
      const uint64_t bytes = k.bytes() ? k.bytes() : sig.bytes_per_call();
      if (bytes > 0) args += ",\"bytes\":" + std::to_string(bytes);
      if (k.has_collective()) {
        const auto& c = k.collective();
        char hash[24];
        std::snprintf(hash, sizeof(hash), "%016" PRIx64, c.comm_hash());
        args += ",\"comm\":\"" + std::string(hash) + "\",\"seq\":" + std::to_string(c.seq()) +
                ",\"nranks\":" + std::to_string(c.nranks());
        if (bytes > 0 && dur > 0) {
          const double algbw = static_cast<double>(bytes) / dur;  // GB/s
          char buf[64];
          std::snprintf(buf, sizeof(buf), ",\"algbw GB/s\":%.3f,\"busbw GB/s\":%.3f", algbw,
                        algbw * records::busBandwidthFactor(sig.collective(), c.nranks()));
          args += buf;
        }
      }
      w_->event("{\"ph\":\"X\",\"cat\":\"" + std::string(gpuCategory(sig)) +
                "\",\"name\":" + common::jsonQuote(sig.name().empty() ? "unknown" : sig.name()) +
                ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(track.second) +
                ",\"ts\":" + ts(start) + ",\"dur\":" + durUs(dur) + ",\"args\":{" + args + "}}");
      ++summary_->gpu_events;
      // ac2g: the launch slice on the issuing thread → this op.
      CpuSlice launch;
      launch.start = k.issue_ns();
      launch.end = k.issue_ns() + kLaunchSliceNs;  // fitted in writeCpu
      launch.launch = true;
      launch.json_head =
          "\"name\":" + common::jsonQuote(launchName(sig)) + ",\"cat\":\"cuda_runtime\"";
      // Like Kineto's runtime events: no device/stream args (HTA takes an event with a stream
      // for a GPU event).
      launch.args = "\"correlation\":" + std::to_string(correlation);
      launch.flow_id = flow;
      cpu_[k.thread_id()].push_back(std::move(launch));
      w_->event("{\"ph\":\"f\",\"bp\":\"e\",\"id\":" + std::to_string(flow) +
                ",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"pid\":" + std::to_string(pid) +
                ",\"tid\":" + std::to_string(track.second) + ",\"ts\":" + ts(start) + "}");
      ++summary_->launch_flows;
      // Collective flows: from the previous member rank's instance to this one.
      if (link_collectives_ && k.has_collective() && isGroupCollective(sig)) {
        const CollKey key{k.collective().comm_hash(), k.collective().seq()};
        auto m = p1_.members.find(key);
        if (m != p1_.members.end()) {
          const auto& ranks = m->second;
          const auto pos = std::lower_bound(ranks.begin(), ranks.end(), src_.rank) - ranks.begin();
          // Flow ids of collective links: bit 52 set (above the ac2g counter), 40 bits of the
          // collective's hash, 11 bits of the link's position; below 2^53 for JSON readers.
          const uint64_t base = (common::splitMix64(key.first ^ common::splitMix64(key.second)) &
                                 ((uint64_t{1} << 40) - 1))
                                << 11;
          const uint64_t id_prefix = uint64_t{1} << 52;
          if (pos > 0) {
            w_->event(
                "{\"ph\":\"f\",\"bp\":\"e\",\"id\":" +
                std::to_string(id_prefix | (base + ((pos - 1) & 2047))) +
                ",\"cat\":\"collective\",\"name\":\"collective\",\"pid\":" + std::to_string(pid) +
                ",\"tid\":" + std::to_string(track.second) + ",\"ts\":" + ts(start) + "}");
          }
          if (pos + 1 < static_cast<long>(ranks.size())) {
            w_->event(
                "{\"ph\":\"s\",\"id\":" + std::to_string(id_prefix | (base + (pos & 2047))) +
                ",\"cat\":\"collective\",\"name\":\"collective\",\"pid\":" + std::to_string(pid) +
                ",\"tid\":" + std::to_string(track.second) + ",\"ts\":" + ts(start) + "}");
            ++summary_->collective_flows;
          }
        }
      }
    }
  }
}

// Deep-trace (CUPTI) records on the GPU stream tracks, category "deep_trace". CUPTI numbers
// streams its own way: a CUPTI stream takes the track of the traced ops its records fall inside
// (a record inside a traced op's interval on the same device is that op's kernel: its args get
// the launch's correlation, "flare correlation"); a CUPTI stream no traced op maps to gets a
// track of its own ("stream N (CUPTI)").
void RankWriter::writeDeepTrace(const RankData& data) {
  if (data.deep.empty()) return;
  for (auto& [device, spans] : traced_) {
    std::sort(spans.begin(), spans.end(),
              [](const TracedSpan& a, const TracedSpan& b) { return a.start < b.start; });
  }
  // CUPTI's times and the traced ops' (CUDA events mapped to the host clock) differ by the
  // mapping's error: about a microsecond on an idle machine, but until a reference whose
  // host-side bracket is under kTightReferenceNs (src/timing/tracer_impl.h) is taken, the tracer
  // maps with a looser one, so on a loaded host every traced op of a device may be tens of µs
  // late (19 µs in a CI run: longer than most kernels). Per device, the records are moved onto the
  // traced ops' clock by the offset that lines up the most record ends with traced ends (a kernel's
  // end event completes with it): every difference within ±kMaxShiftNs between a record's end and a
  // traced end is a candidate, and the densest kMatchNs-wide cluster of them wins. (The median
  // difference to the nearest traced end locked onto a neighbouring op as soon as the error
  // passed half an op's length, and the records then partially overlapped the traced ops.) A
  // workload that repeats exactly (identical layers) has clusters one period apart nearly as
  // dense as the true one: of the clusters within 90% of the densest, the one nearest zero.
  constexpr int64_t kMaxShiftNs = 200'000;
  constexpr int64_t kMatchNs = 2'000;
  constexpr size_t kShiftSamples = 4096;  // records per device the offset is estimated from
  std::vector<flare::v1::DeepTraceRecord> deep_recs = data.deep;
  std::map<int, std::vector<const flare::v1::DeepTraceRecord*>> by_device;
  for (const auto& d : deep_recs) by_device[d.device()].push_back(&d);
  std::map<int, int64_t> shift;
  for (const auto& [device, recs] : by_device) {
    auto it = traced_.find(device);
    if (it == traced_.end()) continue;
    const auto& spans = it->second;
    const size_t stride = (recs.size() + kShiftSamples - 1) / kShiftSamples;
    std::vector<int64_t> diffs;
    for (size_t i = 0; i < recs.size(); i += stride) {
      const int64_t end = recs[i]->end_ns();
      auto pos = std::upper_bound(spans.begin(), spans.end(), end + kMaxShiftNs,
                                  [](int64_t v, const TracedSpan& s) { return v < s.start; });
      for (int n = 0; pos != spans.begin() && n < 256; ++n) {
        --pos;
        if (pos->start < end - 4 * kMaxShiftNs) break;
        const int64_t diff = pos->end - end;
        if (std::llabs(diff) <= kMaxShiftNs) diffs.push_back(diff);
      }
    }
    if (diffs.empty()) continue;
    std::sort(diffs.begin(), diffs.end());
    std::vector<std::pair<size_t, size_t>> clusters;  // [first, last) of each window
    size_t densest = 0;
    for (size_t i = 0, j = 0; i < diffs.size(); ++i) {
      while (j < diffs.size() && diffs[j] - diffs[i] <= kMatchNs) ++j;
      clusters.emplace_back(i, j);
      densest = std::max(densest, j - i);
    }
    int64_t best = 0;
    bool found = false;
    for (const auto& [first, last] : clusters) {
      if (10 * (last - first) < 9 * densest) continue;
      const int64_t median = diffs[first + (last - first) / 2];
      if (!found || std::llabs(median) < std::llabs(best)) best = median;
      found = true;
    }
    shift[device] = best;
  }
  for (auto& d : deep_recs) {
    auto it = shift.find(d.device());
    if (it == shift.end()) continue;
    d.set_start_ns(d.start_ns() + it->second);
    d.set_end_ns(d.end_ns() + it->second);
  }
  // The traced op a record ran inside: the one it overlaps most, by at least half its length
  // (the two clocks differ by the GPU→host mapping's error, a few µs; a kernel may touch the
  // events around it exactly).
  auto container = [this](const flare::v1::DeepTraceRecord& d) -> const TracedSpan* {
    auto it = traced_.find(d.device());
    if (it == traced_.end()) return nullptr;
    const auto& spans = it->second;
    constexpr int64_t kSlackNs = 50'000;
    auto pos = std::upper_bound(spans.begin(), spans.end(), d.end_ns() + kSlackNs,
                                [](int64_t v, const TracedSpan& s) { return v < s.start; });
    const TracedSpan* best = nullptr;
    int64_t best_overlap = 0;
    const int64_t len = std::max<int64_t>(d.end_ns() - d.start_ns(), 1);
    for (int n = 0; pos != spans.begin() && n < 64; ++n) {
      --pos;
      const int64_t overlap = std::min(pos->end, d.end_ns()) - std::max(pos->start, d.start_ns());
      if (overlap > best_overlap) {
        best_overlap = overlap;
        best = &*pos;
      }
      if (pos->end < d.start_ns() - kSlackNs && n > 8) break;
    }
    return best != nullptr && 2 * best_overlap >= len ? best : nullptr;
  };
  // CUPTI stream → track, by the most frequent track of its matched records.
  std::map<std::pair<int, uint32_t>, std::map<int, int>> votes;
  for (const auto& d : deep_recs) {
    if (const TracedSpan* s = container(d)) votes[{d.device(), d.stream()}][s->tid]++;
  }
  std::map<std::pair<int, uint32_t>, int> track_of;
  for (const auto& [key, counts] : votes) {
    track_of[key] =
        std::max_element(counts.begin(), counts.end(), [](const auto& a, const auto& b) {
          return a.second < b.second;
        })->first;
  }
  std::map<std::pair<int, int>, std::vector<const flare::v1::DeepTraceRecord*>> tracks;
  for (const auto& d : deep_recs) {
    if (!inWindow(d.start_ns())) continue;
    auto it = track_of.find({d.device(), d.stream()});
    int tid = 0;
    if (it != track_of.end()) {
      tid = it->second;
    } else {
      cupti_streams_.insert(kCuptiStream | d.stream());
      tid = streamTid(kCuptiStream | d.stream());
    }
    devices_.insert(d.device());
    tracks[{d.device(), tid}].push_back(&d);
  }
  // The traced ops of each track, in order and disjoint (writeGpu clipped them).
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> traced_on;
  for (const auto& [device, spans] : traced_) {
    for (const auto& s : spans) traced_on[{device, s.tid}].emplace_back(s.start, s.end);
  }
  for (auto& [track, recs] : tracks) {
    std::sort(recs.begin(), recs.end(),
              [](const auto* a, const auto* b) { return a->start_ns() < b->start_ns(); });
    gpu_tracks_.insert(track);
    const auto on = traced_on.find(track);
    int64_t prev_end = std::numeric_limits<int64_t>::min();
    for (const auto* d : recs) {
      // Inside the traced op it ran in, when that op is on this track (so that slices nest).
      const TracedSpan* in = container(*d);
      int64_t start = d->start_ns(), end = d->end_ns();
      if (in != nullptr && in->tid == track.second) {
        start = std::clamp(start, in->start, in->end);
        end = std::clamp(end, in->start, in->end);
      }
      start = std::max(start, prev_end);
      end = std::max(end, start);
      // Whatever the match found, the slice nests with the track's traced ops: it ends inside
      // the op its start falls in, or before the next op when it starts between two.
      if (on != traced_on.end()) {
        const auto& ops = on->second;
        auto next = std::upper_bound(ops.begin(), ops.end(), start,
                                     [](int64_t v, const auto& op) { return v < op.first; });
        if (next != ops.begin() && start < std::prev(next)->second) {
          end = std::min(end, std::prev(next)->second);
        } else if (next != ops.end()) {
          end = std::min(end, next->first);
        }
      }
      prev_end = end;
      const char* kind = d->kind() == flare::v1::DeepTraceRecord::KIND_MEMCPY   ? "memcpy"
                         : d->kind() == flare::v1::DeepTraceRecord::KIND_MEMSET ? "memset"
                                                                                : "kernel";
      std::string args = "\"device\":" + std::to_string(d->device()) +
                         ",\"stream\":" + std::to_string(track.second) +
                         ",\"cupti stream\":" + std::to_string(d->stream()) +
                         ",\"cupti correlation\":" + std::to_string(d->correlation_id()) +
                         ",\"kind\":\"" + kind +
                         "\",\"deep trace\":" + std::to_string(d->capture_id()) +
                         ",\"step index\":" + std::to_string(d->step_index());
      if (d->bytes() > 0) args += ",\"bytes\":" + std::to_string(d->bytes());
      if (in != nullptr) args += ",\"flare correlation\":" + std::to_string(in->correlation);
      w_->event("{\"ph\":\"X\",\"cat\":\"deep_trace\",\"name\":" +
                common::jsonQuote(d->name().empty() ? "unknown" : d->name()) +
                ",\"pid\":" + std::to_string(ids_.gpu_pid_base + track.first) +
                ",\"tid\":" + std::to_string(track.second) + ",\"ts\":" + ts(start) +
                ",\"dur\":" + durUs(end - start) + ",\"args\":{" + args + "}}");
      ++summary_->gpu_events;
      ++summary_->deep_trace_events;
    }
  }
}

void RankWriter::writeCpu(const RankData& data) {
  for (const auto& s : data.spans) {
    if (!inWindow(s.start_ns())) continue;
    CpuSlice slice;
    slice.start = s.start_ns();
    slice.end = std::max(s.end_ns(), s.start_ns());
    auto api = data.apis.find(s.api_id());
    const std::string name =
        api == data.apis.end() ? "api " + std::to_string(s.api_id()) : api->second;
    slice.json_head = "\"name\":" + common::jsonQuote(name) + ",\"cat\":\"python_function\"";
    slice.args = "\"span id\":" + std::to_string(s.id()) +
                 ",\"parent span id\":" + std::to_string(s.parent_span_id());
    if (s.has_gc()) {
      slice.args += ",\"gc generation\":" + std::to_string(s.gc().generation()) +
                    ",\"gc collected\":" + std::to_string(s.gc().collected()) +
                    ",\"gc uncollectable\":" + std::to_string(s.gc().uncollectable());
    }
    cpu_[s.thread_id()].push_back(std::move(slice));
  }
  for (auto& [thread, slices] : cpu_) {
    threads_.insert(thread);
    // Longer first at equal starts, so that enclosing slices come before what they enclose.
    std::sort(slices.begin(), slices.end(), [](const CpuSlice& a, const CpuSlice& b) {
      if (a.start != b.start) return a.start < b.start;
      if (a.launch != b.launch) return !a.launch;
      return a.end > b.end;
    });
    // Fit each launch slice inside its enclosing slice and before the next slice starts; clip
    // any other partial overlap (clock steps between batches) to keep the track nested.
    std::vector<int64_t> open_ends;
    for (size_t i = 0; i < slices.size(); ++i) {
      CpuSlice& s = slices[i];
      while (!open_ends.empty() && open_ends.back() <= s.start) open_ends.pop_back();
      int64_t limit = open_ends.empty() ? std::numeric_limits<int64_t>::max() : open_ends.back();
      if (s.launch && i + 1 < slices.size()) limit = std::min(limit, slices[i + 1].start);
      s.end = std::max(s.start, std::min(s.end, limit));
      open_ends.push_back(s.end);
    }
    for (const CpuSlice& s : slices) {
      w_->event("{\"ph\":\"X\"," + s.json_head + ",\"pid\":" + std::to_string(ids_.cpu_pid) +
                ",\"tid\":" + std::to_string(thread) + ",\"ts\":" + ts(s.start) +
                ",\"dur\":" + durUs(s.end - s.start) + ",\"args\":{" + s.args + "}}");
      ++summary_->cpu_events;
      if (s.launch) {
        w_->event("{\"ph\":\"s\",\"id\":" + std::to_string(s.flow_id) +
                  ",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"pid\":" + std::to_string(ids_.cpu_pid) +
                  ",\"tid\":" + std::to_string(thread) + ",\"ts\":" + ts(s.start) + "}");
      }
    }
  }
}

void RankWriter::metadata() {
  auto meta = [this](const std::string& what, int pid, const std::string* tid,
                     const std::string& args) {
    w_->event("{\"ph\":\"M\",\"name\":\"" + what + "\",\"pid\":" + std::to_string(pid) +
              (tid ? ",\"tid\":" + *tid : std::string()) + ",\"args\":{" + args + "}}");
  };
  const std::string rank = std::to_string(src_.rank);
  meta("process_name", ids_.cpu_pid, nullptr,
       "\"name\":" + common::jsonQuote("rank " + rank + " (pid " + std::to_string(src_.pid) + ")"));
  meta("process_labels", ids_.cpu_pid, nullptr, "\"labels\":" + common::jsonQuote("CPU"));
  meta("process_sort_index", ids_.cpu_pid, nullptr,
       "\"sort_index\":" + std::to_string(ids_.cpu_pid));
  for (uint64_t thread : threads_) {
    const std::string tid = std::to_string(thread);
    meta("thread_name", ids_.cpu_pid, &tid, "\"name\":" + common::jsonQuote("thread " + tid));
  }
  for (int device : devices_) {
    const int pid = ids_.gpu_pid_base + device;
    meta("process_name", pid, nullptr,
         "\"name\":" + common::jsonQuote("rank " + rank + " GPU " + std::to_string(device)));
    meta("process_labels", pid, nullptr,
         "\"labels\":" + common::jsonQuote("GPU " + std::to_string(device)));
    meta("process_sort_index", pid, nullptr, "\"sort_index\":" + std::to_string(pid));
  }
  for (const auto& [stream_id, tid] : stream_tids_) {
    for (int device : devices_) {
      if (!gpu_tracks_.count({device, tid})) continue;
      const std::string t = std::to_string(tid);
      char hex[24];
      std::snprintf(hex, sizeof(hex), "%" PRIx64, stream_id);
      const std::string name =
          cupti_streams_.count(stream_id)
              ? "stream " + t + " (CUPTI " + std::to_string(stream_id & ~kCuptiStream) + ")"
              : "stream " + t + " (0x" + hex + ")";
      meta("thread_name", ids_.gpu_pid_base + device, &t, "\"name\":" + common::jsonQuote(name));
    }
  }
}

bool writeDoc(const std::vector<RankSource>& sources, const Options& options, FILE* out,
              const Pass1& p1, const std::map<int, int64_t>& offsets, bool kineto_ids,
              Summary* summary, std::string* error) {
  const int world = options.world_size > 0 ? options.world_size : static_cast<int>(sources.size());
  // Spaced as Kineto writes it: HTA finds the rank with the pattern `"rank":\s+(\d+)`.
  std::string dist = "{\"backend\": " + common::jsonQuote(options.backend) +
                     ", \"world_size\": " + std::to_string(world);
  if (sources.size() == 1) dist += ", \"rank\": " + std::to_string(sources[0].rank);
  dist += "}";
  std::fprintf(out,
               "{\"schemaVersion\":1,\"displayTimeUnit\":\"ms\",\"baseTimeNanoseconds\":%" PRId64
               ",\n\"distributedInfo\": %s,\n\"traceEvents\":[",
               p1.base_ns, dist.c_str());
  EventWriter w(out);
  uint64_t next_flow = 1;
  for (const RankSource& src : sources) {
    Ids ids;
    if (kineto_ids) {
      ids.cpu_pid = src.pid > 0 ? src.pid : 1000 * (src.rank + 1);
      ids.gpu_pid_base = 0;
    } else {
      ids.cpu_pid = 1000 * (src.rank + 1);
      ids.gpu_pid_base = 1000 * (src.rank + 1) + 100;
    }
    auto off = offsets.find(src.rank);
    RankWriter rw(&w, p1, options, src, ids, off == offsets.end() ? 0 : off->second, &next_flow,
                  summary, !kineto_ids);
    if (!rw.write(error)) return false;
  }
  std::string offs;
  for (const auto& [rank, ns] : offsets) {
    offs += (offs.empty() ? "" : ",") + std::string("\"") + std::to_string(rank) +
            "\":" + std::to_string(ns);
  }
  std::fprintf(out, "\n],\"flare\":{\"clockOffsetsNs\":{%s}}}\n", offs.c_str());
  if (std::ferror(out)) {
    *error = "write error";
    return false;
  }
  return true;
}

}  // namespace

std::vector<int64_t> stepStarts(const std::vector<flare::v1::RecordBatch>& batches) {
  std::unordered_map<uint32_t, std::string> apis;
  std::unordered_map<uint32_t, flare::v1::OpKind> kinds;
  std::vector<records::StepCall> calls;
  for (const auto& b : batches) {
    for (const auto& a : b.api_names()) apis[a.id()] = a.qualified_name();
    for (const auto& s : b.signatures()) kinds[s.id()] = s.kind();
    for (const auto& s : b.spans()) {
      auto it = apis.find(s.api_id());
      if (it == apis.end()) continue;
      const records::StepCallKind kind = records::stepCallKind(it->second);
      if (kind != records::StepCallKind::kOther) calls.push_back({s.start_ns(), kind});
    }
    for (const auto& k : b.kernels()) {  // graph launches are training work
      auto it = kinds.find(k.signature_id());
      if (it != kinds.end() && it->second == flare::v1::OP_KIND_GRAPH)
        calls.push_back({k.issue_ns(), records::StepCallKind::kTraining});
    }
  }
  return records::stepBoundaries(std::move(calls));
}

std::map<int, int64_t> alignClocks(const std::map<int, std::map<CollKey, int64_t>>& ends) {
  std::map<int, int64_t> offsets;
  if (ends.empty()) return offsets;
  // Breadth-first from the lowest rank: each newly aligned rank takes the median difference
  // of its collective end times to an aligned rank it shares collectives with.
  std::vector<int> frontier{ends.begin()->first};
  offsets[ends.begin()->first] = 0;
  while (!frontier.empty()) {
    std::vector<int> next;
    for (int ref : frontier) {
      const auto& ref_ends = ends.at(ref);
      for (const auto& [rank, rank_ends] : ends) {
        if (offsets.count(rank)) continue;
        std::vector<int64_t> diffs;
        for (const auto& [key, end] : rank_ends) {
          auto it = ref_ends.find(key);
          if (it != ref_ends.end()) diffs.push_back(end - it->second);
        }
        if (diffs.empty()) continue;
        std::nth_element(diffs.begin(), diffs.begin() + diffs.size() / 2, diffs.end());
        offsets[rank] = offsets[ref] + diffs[diffs.size() / 2];
        next.push_back(rank);
      }
    }
    frontier = std::move(next);
  }
  for (const auto& [rank, unused] : ends) offsets.emplace(rank, 0);  // nothing shared
  return offsets;
}

bool writeCombined(const std::vector<RankSource>& sources, const Options& options, FILE* out,
                   Summary* summary, std::string* error) {
  if (sources.empty()) {
    *error = "no ranks to export";
    return false;
  }
  Pass1 p1;
  if (!firstPass(sources, &p1, summary)) {
    *error = "no records in the input";
    return false;
  }
  if (options.steps) {
    bool any = false;
    for (const auto& [rank, starts] : p1.step_starts)
      any = any || starts.size() > options.steps->first;
    if (!any) {
      *error = "no rank recorded step " + std::to_string(options.steps->first) +
               " (steps come from the DataLoader's __next__ spans; trace it with "
               "TRACED_PYTHON_API or drop --steps)";
      return false;
    }
  }
  const auto offsets = options.align_clocks ? alignClocks(p1.ends) : std::map<int, int64_t>{};
  summary->clock_offsets_ns = offsets;
  return writeDoc(sources, options, out, p1, offsets, false, summary, error);
}

bool writePerRank(const std::vector<RankSource>& sources, const Options& options,
                  const std::function<std::string(int rank)>& path_for_rank, Summary* summary,
                  std::string* error) {
  if (sources.empty()) {
    *error = "no ranks to export";
    return false;
  }
  Pass1 p1;
  if (!firstPass(sources, &p1, summary)) {
    *error = "no records in the input";
    return false;
  }
  const auto offsets = options.align_clocks ? alignClocks(p1.ends) : std::map<int, int64_t>{};
  summary->clock_offsets_ns = offsets;
  Options per = options;
  if (per.world_size == 0) per.world_size = static_cast<int>(sources.size());
  for (const RankSource& src : sources) {
    const std::string path = path_for_rank(src.rank);
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "we"), &std::fclose);
    if (!f) {
      *error = path + ": " + std::strerror(errno);
      return false;
    }
    if (!writeDoc({src}, per, f.get(), p1, offsets, true, summary, error)) {
      *error = path + ": " + *error;
      return false;
    }
  }
  return true;
}

bool spoolSources(const std::string& dir, const std::string& job, const std::vector<int>& ranks,
                  std::vector<RankSource>* out, std::string* error) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    *error = dir + " is not a directory";
    return false;
  }
  // DIR/<job>/<rank>/records-<pid>.pb; DIR may also be one job's folder.
  std::map<std::string, std::map<int, std::vector<fs::path>>> jobs;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->path().extension() != ".pb") continue;
    const fs::path& p = it->path();
    const std::string rank_dir = p.parent_path().filename().string();
    char* end = nullptr;
    const long rank = std::strtol(rank_dir.c_str(), &end, 10);
    if (rank_dir.empty() || *end != '\0' || rank < 0) continue;
    jobs[p.parent_path().parent_path().filename().string()][static_cast<int>(rank)].push_back(p);
  }
  if (jobs.empty()) {
    *error = "no spool files (<job>/<rank>/records-<pid>.pb) under " + dir;
    return false;
  }
  std::string chosen = job;
  if (chosen.empty()) {
    if (jobs.size() > 1) {
      *error = "several jobs under " + dir + " (";
      for (const auto& [name, unused] : jobs) *error += name + " ";
      error->back() = ')';
      *error += "; choose one with --job";
      return false;
    }
    chosen = jobs.begin()->first;
  }
  auto j = jobs.find(chosen);
  if (j == jobs.end()) {
    *error = "no job " + chosen + " under " + dir;
    return false;
  }
  for (auto& [rank, files] : j->second) {
    if (!ranks.empty() && std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) continue;
    std::sort(files.begin(), files.end());
    RankSource src;
    src.rank = rank;
    const std::string stem = files.front().stem().string();  // records-<pid>
    src.pid = std::atoi(stem.substr(stem.find('-') + 1).c_str());
    src.for_each_batch = [files](const std::function<void(const flare::v1::RecordBatch&)>& fn,
                                 std::string* err) {
      bool ok = true;
      for (const auto& f : files) {
        std::vector<flare::v1::RecordBatch> batches;
        std::string e;
        if (!records::readSpoolFile(f.string(), &batches, &e)) {
          *err = e;
          ok = false;
        }
        for (const auto& b : batches) fn(b);
      }
      return ok;
    };
    out->push_back(std::move(src));
  }
  if (out->empty()) {
    *error = "none of the selected ranks is in job " + chosen;
    return false;
  }
  return true;
}

}  // namespace flare::timeline
