// Detector link_slow: a slow network link. Communicators doing the same collective of the same
// size over as many ranks are peers; one whose bus bandwidth, measured from the last arrival
// (so waiting is not counted), is link_min_effect below its peers' is slow, and the culprit is
// the rank in every slow communicator and in no healthy one (docs/metrics.md).

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/records/op_kind.h"

namespace flare::engine {
namespace {

using namespace signals;

struct Instance {
  std::vector<std::pair<int, const Op*>> members;
};

void detectSlowLink(const JobModel& job, const DiagnoseOptions& opt, std::vector<Diagnosis>* out) {
  std::map<std::pair<uint64_t, uint64_t>, Instance> instances;
  for (const auto& [rank, r] : job.ranks()) {
    for (const Op& op : r.ops) {
      if (job.signatures()[op.sig].kind() != flare::v1::OP_KIND_COLLECTIVE || op.comm == 0)
        continue;
      instances[{op.comm, op.seq}].members.push_back({rank, &op});
    }
  }
  // Per communicator and signature: busbw of complete instances, from the last arrival.
  struct CommStats {
    std::vector<double> busbw;
    std::set<int> ranks;
    uint32_t sig = 0;
    double bytes = 0;
  };
  std::map<std::pair<uint64_t, uint32_t>, CommStats> comms;
  for (const auto& [key, inst] : instances) {
    const Op* first = inst.members.front().second;
    if (first->nranks <= 1 || static_cast<int>(inst.members.size()) != first->nranks) continue;
    int64_t last_start = INT64_MIN, last_end = INT64_MIN;
    for (const auto& [rank, op] : inst.members) {
      last_start = std::max(last_start, op->start);
      last_end = std::max(last_end, op->end);
    }
    const double t = static_cast<double>(last_end - last_start);
    if (t <= 0 || first->bytes == 0) continue;
    const auto& sig = job.signatures()[first->sig];
    CommStats& cs = comms[{key.first, first->sig}];
    cs.busbw.push_back(static_cast<double>(first->bytes) / t *
                       records::busBandwidthFactor(sig.collective(), first->nranks));  // GB/s
    for (const auto& [rank, op] : inst.members) cs.ranks.insert(rank);
    cs.sig = first->sig;
    cs.bytes = static_cast<double>(first->bytes);
  }
  // Peer groups: communicators doing the same collective of the same size over as many ranks.
  std::map<std::tuple<int, size_t, uint64_t>, std::vector<std::pair<uint64_t, double>>> groups;
  std::map<uint64_t, const CommStats*> by_comm;
  for (const auto& [key, cs] : comms) {
    if (static_cast<int>(cs.busbw.size()) < opt.min_samples) continue;
    const auto& sig = job.signatures()[cs.sig];
    groups[{sig.collective(), cs.ranks.size(), static_cast<uint64_t>(cs.bytes)}].push_back(
        {key.first, median(cs.busbw)});
    by_comm[key.first] = &cs;
  }
  std::map<uint64_t, std::pair<double, double>> slow;  // comm -> (busbw, reference)
  std::set<uint64_t> evaluated;
  for (const auto& [gkey, members] : groups) {
    if (members.size() < 2) continue;
    std::vector<double> values;
    for (const auto& [comm, bw] : members) values.push_back(bw);
    const double reference =
        members.size() >= 3 ? median(values) : *std::max_element(values.begin(), values.end());
    for (const auto& [comm, bw] : members) {
      evaluated.insert(comm);
      if (bw < reference * (1.0 - opt.link_min_effect)) {
        auto& s = slow[comm];
        if (s.second == 0 || bw / reference < s.first / s.second) s = {bw, reference};
      }
    }
  }
  if (slow.empty()) return;
  // The culprit is in every slow communicator and in no healthy one that was compared.
  std::map<int, int> slow_count, healthy_count;
  for (uint64_t comm : evaluated) {
    for (int rank : by_comm[comm]->ranks) (slow.count(comm) ? slow_count : healthy_count)[rank]++;
  }
  std::vector<int> culprits;
  for (const auto& [rank, n] : slow_count) {
    if (n == static_cast<int>(slow.size()) && healthy_count[rank] == 0) culprits.push_back(rank);
  }
  if (culprits.empty()) {  // e.g. one slow communicator: name its members (the link between them)
    std::set<int> members;
    for (const auto& [comm, unused] : slow) {
      for (int rank : by_comm[comm]->ranks) members.insert(rank);
    }
    culprits.assign(members.begin(), members.end());
  }
  Diagnosis d;
  d.kind = "link_slow";
  d.team = Team::kOperations;
  d.cause = "network";
  d.ranks = culprits;
  double worst = 0;
  for (const auto& [comm, v] : slow) {
    const CommStats& cs = *by_comm[comm];
    const auto& sig = job.signatures()[cs.sig];
    std::vector<int> ranks(cs.ranks.begin(), cs.ranks.end());
    char hash[24];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(comm));
    d.evidence.push_back({"busbw",
                          sig.name() + " of " + fmtNum(cs.bytes / (1 << 20), "MiB") +
                              " on communicator " + hash + " (ranks " + rankList(ranks) +
                              "): busbw " + fmtNum(v.first, "GB/s") + " vs " +
                              fmtNum(v.second, "GB/s") + " on peer communicators",
                          v.first, v.second});
    worst = std::max(worst, 1.0 - v.first / v.second);
  }
  d.severity = worst;
  d.summary = "rank" + std::string(culprits.size() > 1 ? "s " : " ") + rankList(culprits) +
              ": slow network link — bus bandwidth " + fmtPct(worst) +
              " below peer communicators on every communicator " +
              (culprits.size() > 1 ? "they share" : "it is in");
  out->push_back(std::move(d));
}

class LinkSlowDetector final : public Detector {
 public:
  std::string_view name() const override { return "link_slow"; }
  std::vector<std::string_view> kinds() const override { return {"link_slow"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kCulprit;
    n.cites_window = true;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out;
    detectSlowLink(view.job(), view.options(), &out);
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeLinkSlowDetector() {
  return std::make_unique<LinkSlowDetector>();
}

}  // namespace flare::engine
