// Batch validation (ingest_validate.h): the rules, one place; Ingest::batch applies what passes.
#include "src/engine/ingest_validate.h"

#include <cmath>
#include <span>
#include <utility>

#include "src/records/step_stats.h"
#include "src/stats/sketch.h"

namespace flare::engine {
namespace {

constexpr size_t kMaxNameBytes = 4096;
constexpr size_t kMaxShapeDims = 16;
constexpr size_t kMaxClusters = 64;
constexpr size_t kMaxStepCauses = records::StepStats::kMaxHostCauses;
constexpr size_t kMaxSketchBytes = 16 * 1024;  // a serialized issue-latency sketch

// A serialized LatencySketch from a StepStats: decodes, within size, at most `max_count` values
// (exactly `max_count` when `exact`).
bool validStepSketch(const std::string& bytes, uint64_t max_count, bool exact) {
  if (bytes.size() > kMaxSketchBytes) return false;
  const auto count = stats::LatencySketch::validCount(
      std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  return count && (exact ? *count == max_count : *count <= max_count);
}

// Removes the elements at `bad` (ascending indices) from `field`, keeping the others' order.
template <typename Field>
void eraseIndices(Field* field, const std::vector<int>& bad) {
  if (bad.empty()) return;
  int w = 0;
  size_t j = 0;
  for (int i = 0; i < field->size(); ++i) {
    if (j < bad.size() && bad[j] == i) {
      ++j;
      continue;
    }
    if (w != i) field->SwapElements(w, i);
    ++w;
  }
  field->DeleteSubrange(w, field->size() - w);
}

bool badTime(const TimeLimits& t, int64_t start, int64_t end) {
  return start < t.min_ns || start > t.max_ns || end < start || end - start > t.max_duration_ns;
}

}  // namespace

void BatchFilter::drop(std::vector<int>* list, int index, Reason r, std::string error) {
  if (list != nullptr) list->push_back(index);
  const auto i = static_cast<size_t>(r);
  if (by_reason[i]++ == 0) first_error[i] = std::move(error);
  if (first == Reason::kCount) first = r;
  ++dropped;
}

std::string stepStatsError(const v1::StepStats& st, const TimeLimits& limits, Reason* reason) {
  if (badTime(limits, st.start_ns(), st.end_ns()) || st.end_ns() == st.start_ns()) {
    *reason = Reason::kBadTimestamp;
    return "step statistics: start " + std::to_string(st.start_ns()) + ", end " +
           std::to_string(st.end_ns()) + " out of range";
  }
  *reason = Reason::kBadRecord;
  const int64_t len = st.end_ns() - st.start_ns();
  auto check = [len](const char* field, int64_t v) -> std::string {
    if (v >= 0 && v <= len) return {};
    return std::string("step statistics: ") + field + " " + std::to_string(v) +
           " ns outside its step of " + std::to_string(len) + " ns";
  };
  for (auto [field, v] :
       {std::pair{"gpu_busy_ns", st.gpu_busy_ns()}, std::pair{"inter_ns", st.inter_ns()},
        std::pair{"minority_ns", st.minority_ns()}}) {
    if (std::string e = check(field, v); !e.empty()) return e;
  }
  if (st.has_run_queue_wait_ns()) {
    if (std::string e = check("run_queue_wait_ns", st.run_queue_wait_ns()); !e.empty()) return e;
  }
  if (st.gpu_ops() > (1ULL << 40) || !std::isfinite(st.issue_latency_sum_ns()) ||
      !std::isfinite(st.issue_offset_sum_ns())) {
    return "step statistics: gpu_ops or an issue-latency sum out of range";
  }
  // Sampled kernels: the weights of the step's ops, at least one each, below 2^16 each.
  if (st.gpu_ops_estimated() != 0 &&
      (st.gpu_ops_estimated() < st.gpu_ops() || st.gpu_ops_estimated() > (st.gpu_ops() << 16))) {
    return "step statistics: gpu_ops_estimated out of range";
  }
  if (static_cast<size_t>(st.causes_size()) > kMaxStepCauses) {
    return "step statistics: more than " + std::to_string(kMaxStepCauses) + " host causes";
  }
  if (!validStepSketch(st.issue_latency(), st.gpu_ops(), true)) {
    return "step statistics: an issue-latency sketch that does not decode to the step's " +
           std::to_string(st.gpu_ops()) + " ops";
  }
  for (const v1::HostCause& c : st.causes()) {
    if (c.name().empty() || c.name().size() > records::StepStats::kMaxCauseNameBytes ||
        !validStepSketch(c.issue_latency(), st.gpu_ops(), false)) {
      return "step statistics: a host cause without a name or with a bad sketch";
    }
  }
  return {};
}

BatchFilter findInvalidItems(const v1::RecordBatch& b, const BatchLimits& limits,
                             const std::unordered_map<uint32_t, uint32_t>& known_sigs,
                             const std::unordered_set<uint32_t>& known_apis) {
  BatchFilter f;
  const TimeLimits& time = limits.time;
  std::unordered_set<uint32_t> new_sigs;  // the valid signature ids the batch adds
  size_t fresh = 0;                       // signatures the daemon does not have yet for this stream
  for (int i = 0; i < b.signatures_size(); ++i) {
    const v1::Signature& sig = b.signatures(i);
    if (sig.id() == 0 || sig.name().empty() || sig.name().size() > kMaxNameBytes ||
        sig.shape_size() > static_cast<int>(kMaxShapeDims) ||
        sig.layout().size() > kMaxShortString || sig.library().size() > kMaxShortString) {
      f.drop(&f.sigs, i, Reason::kBadSignature,
             "signature " + std::to_string(sig.id()) +
                 ": id 0, empty or oversized name, or too many shape dims");
      continue;
    }
    if (!known_sigs.contains(sig.id()) && !new_sigs.contains(sig.id()) &&
        known_sigs.size() + ++fresh > limits.max_signatures_per_rank) {
      f.drop(&f.sigs, i, Reason::kTooManySignatures,
             "more than --max-signatures-per-rank signatures");
      continue;
    }
    new_sigs.insert(sig.id());
  }
  std::unordered_set<uint32_t> new_apis;
  for (int i = 0; i < b.api_names_size(); ++i) {
    const v1::ApiName& a = b.api_names(i);
    if (a.id() == 0 || a.qualified_name().size() > kMaxShortString) {
      f.drop(&f.apis, i, Reason::kBadSignature, "api name with id 0 or too long");
      continue;
    }
    new_apis.insert(a.id());
  }
  auto known = [&](uint32_t id) { return known_sigs.contains(id) || new_sigs.contains(id); };
  for (int i = 0; i < b.kernels_size(); ++i) {
    const v1::KernelRecord& k = b.kernels(i);
    if (!known(k.signature_id())) {
      f.drop(&f.kernels, i, Reason::kUnknownSignature,
             "kernel record names unknown signature " + std::to_string(k.signature_id()));
    } else if (badTime(time, k.start_ns(), k.end_ns()) ||
               (k.issue_ns() != 0 && (k.issue_ns() < time.min_ns || k.issue_ns() > time.max_ns))) {
      f.drop(&f.kernels, i, Reason::kBadTimestamp,
             "kernel record times out of range (start " + std::to_string(k.start_ns()) + ", end " +
                 std::to_string(k.end_ns()) + ")");
    } else if (k.has_collective() &&
               (k.collective().nranks() < 0 ||
                static_cast<size_t>(k.collective().nranks()) > limits.max_ranks_per_job)) {
      f.drop(&f.kernels, i, Reason::kBadRecord, "collective nranks out of range");
    } else if (k.weight() > 65535) {  // a gap of 1-in-N sampling is below 2N <= 2048
      f.drop(&f.kernels, i, Reason::kBadRecord, "kernel record weight out of range");
    }
  }
  for (int i = 0; i < b.summaries_size(); ++i) {
    const v1::KernelSummary& sm = b.summaries(i);
    if (!known(sm.signature_id())) {
      f.drop(&f.summaries, i, Reason::kUnknownSignature,
             "summary names unknown signature " + std::to_string(sm.signature_id()));
      continue;
    }
    if (badTime(time, sm.window_start_ns(), sm.window_end_ns())) {
      f.drop(&f.summaries, i, Reason::kBadTimestamp, "summary window out of range");
      continue;
    }
    if (sm.clusters_size() > static_cast<int>(kMaxClusters)) {
      f.drop(&f.summaries, i, Reason::kBadRecord, "too many clusters in a summary");
      continue;
    }
    for (const auto& c : sm.clusters()) {
      if (c.p50_ns() < 0 || c.p99_ns() < 0 || c.sum_ns() < 0 ||
          c.p50_ns() > limits.time.max_duration_ns || c.p99_ns() > limits.time.max_duration_ns ||
          c.count() > (1ULL << 40)) {
        f.drop(&f.summaries, i, Reason::kBadRecord, "summary cluster out of range");
        break;
      }
    }
  }
  for (int i = 0; i < b.spans_size(); ++i) {
    const v1::ApiSpan& sp = b.spans(i);
    if (!known_apis.contains(sp.api_id()) && !new_apis.contains(sp.api_id())) {
      f.drop(&f.spans, i, Reason::kUnknownSignature,
             "span names unknown api id " + std::to_string(sp.api_id()));
    } else if (badTime(time, sp.start_ns(), sp.end_ns())) {
      f.drop(&f.spans, i, Reason::kBadTimestamp, "span times out of range");
    }
  }
  for (int i = 0; i < b.steps_size(); ++i) {
    const v1::StepMarker& st = b.steps(i);
    if (badTime(time, st.start_ns(), st.end_ns())) {
      f.drop(&f.steps, i, Reason::kBadTimestamp, "step times out of range");
    }
  }
  for (int i = 0; i < b.step_stats_size(); ++i) {
    Reason r = Reason::kCount;
    std::string e = stepStatsError(b.step_stats(i), time, &r);
    if (!e.empty()) f.drop(&f.step_stats, i, r, std::move(e));
  }
  for (int i = 0; i < b.run_queue_size(); ++i) {
    const v1::RunQueueReading& q = b.run_queue(i);
    if (q.time_ns() < time.min_ns || q.time_ns() > time.max_ns) {
      f.drop(&f.run_queue, i, Reason::kBadTimestamp, "run-queue reading time out of range");
    } else if (q.waited_ns() < 0 || q.waited_ns() > q.time_ns()) {  // cumulative since start
      f.drop(&f.run_queue, i, Reason::kBadRecord, "run-queue wait out of range");
    }
  }
  if (b.created_ns() != 0 && (b.created_ns() < time.min_ns || b.created_ns() > time.max_ns)) {
    f.created = true;
    f.drop(nullptr, 0, Reason::kBadTimestamp, "batch created_ns out of range");
  }
  return f;
}

v1::RecordBatch withoutInvalidItems(const v1::RecordBatch& b, const BatchFilter& f) {
  v1::RecordBatch clean = b;
  eraseIndices(clean.mutable_signatures(), f.sigs);
  eraseIndices(clean.mutable_api_names(), f.apis);
  eraseIndices(clean.mutable_kernels(), f.kernels);
  eraseIndices(clean.mutable_summaries(), f.summaries);
  eraseIndices(clean.mutable_spans(), f.spans);
  eraseIndices(clean.mutable_steps(), f.steps);
  eraseIndices(clean.mutable_step_stats(), f.step_stats);
  eraseIndices(clean.mutable_run_queue(), f.run_queue);
  if (f.created) clean.set_created_ns(0);
  return clean;
}

}  // namespace flare::engine
