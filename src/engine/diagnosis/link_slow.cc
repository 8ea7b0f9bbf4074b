// Detector link_slow: a slow network link. Communicators doing the same collective of the same
// size over as many ranks are peers; one whose bus bandwidth, measured from the last arrival
// (the shortest member's kernel, so waiting is not counted), is below its peers' by more than
// link_min_effect and than link_spread_sigmas times the spread of the job's healthy communicators
// is slow. Its members that are also in a healthy communicator are victims; the others are the
// culprits. A communicator with no peer is compared with healthy history or the baseline run
// when there is one: all its members are named, the link among them not localised
// (docs/metrics.md).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "src/common/rank_list.h"
#include "src/engine/diagnosis/detector.h"
#include "src/engine/diagnosis/history.h"
#include "src/engine/diagnosis/job_metrics.h"
#include "src/engine/diagnosis/own_change.h"
#include "src/records/op_kind.h"

namespace flare::engine {
namespace {

using namespace signals;

struct Instance {
  std::vector<std::pair<int, const Op*>> members;
};

void detectSlowLink(const JobModel& job, const DiagnoseOptions& opt, std::vector<Diagnosis>* out,
                    const DetectorView* view) {
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
    // From the last arrival to the completion: the shortest member's own kernel (every member
    // ends together, so the last to arrive waited for no one). Each duration is on one rank's
    // clock: the ranks' clock offsets (up to ~20 µs after the tracer's mapping) cancel, where
    // max(end) - max(start) mixed two ranks' clocks and read a small collective 10-20% slow.
    int64_t shortest = INT64_MAX;
    for (const auto& [rank, op] : inst.members) shortest = std::min(shortest, op->duration());
    const double t = static_cast<double>(shortest);
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
  // Every compared communicator's busbw against its peers' (the median of the others); the slow
  // ones.
  struct Compared {
    double busbw = 0, reference = 0;
    double ratio() const { return reference > 0 ? busbw / reference : 1.0; }
  };
  std::map<uint64_t, Compared> compared;  // comm -> its worst ratio over its signatures
  // How much the job's communicators differ when healthy: the robust relative spread
  // (1.4826·MAD ÷ median) of the busbw of each peer group of at least 4 communicators, the
  // largest. A fabric whose healthy communicators differ raises the thresholds with it.
  double spread = 0;
  for (const auto& [gkey, members] : groups) {
    if (members.size() < 2) continue;
    std::vector<double> values;
    for (const auto& [comm, bw] : members) values.push_back(bw);
    if (values.size() >= 4) {
      const double m = median(values);
      if (m > 0) spread = std::max(spread, robustSigma(values) / m);
    }
    for (size_t i = 0; i < members.size(); ++i) {
      std::vector<double> others;
      for (size_t j = 0; j < members.size(); ++j)
        if (j != i) others.push_back(members[j].second);
      const double reference = median(others);
      const auto& [comm, bw] = members[i];
      auto [it, added] = compared.try_emplace(comm, Compared{bw, reference});
      if (!added && bw / reference < it->second.ratio()) it->second = {bw, reference};
    }
  }
  // Communicators with no peer, against healthy history (flared) or the baseline run
  // (flare-diagnose --baseline): per collective signature that only this communicator runs (the
  // history keeps one figure per signature, not per communicator), the job busbw (job_metrics.h:
  // the figure the history holds) against the lowest of the healthy runs' (the baseline's).
  const History* history = view != nullptr ? view->history() : nullptr;
  const JobModel* baseline = view != nullptr ? view->baseline() : nullptr;
  struct AgainstHistory {
    std::pair<uint64_t, uint32_t> key;  // communicator, signature
    double busbw = 0, reference = 0;
    uint32_t runs = 0;  // healthy runs that measured it (1: the baseline)
  };
  std::vector<AgainstHistory> history_slow;
  std::set<uint64_t> history_compared, history_shared;  // shared: its signature on others too
  if (history != nullptr || baseline != nullptr) {
    std::map<uint32_t, int> comms_of_sig;
    for (const auto& [key, cs] : comms) ++comms_of_sig[key.second];
    const std::map<std::string, SignatureBusbw> job_bw = signatureBusbw(job);
    const std::map<std::string, SignatureBusbw> base_bw =
        history == nullptr && opt.link_baseline_busbw.empty()
            ? signatureBusbw(*baseline)
            : std::map<std::string, SignatureBusbw>{};
    for (const auto& [key, cs] : comms) {
      if (compared.count(key.first) || static_cast<int>(cs.busbw.size()) < opt.min_samples)
        continue;
      if (comms_of_sig[key.second] != 1) {
        history_shared.insert(key.first);
        continue;
      }
      const std::string sig_key = signatureKey(job.signatures()[key.second]);
      AgainstHistory a{key};
      if (history != nullptr) {
        auto h = history->signatures.find(sig_key);
        if (h == history->signatures.end() || h->second.busbw_runs == 0) continue;
        a.reference = h->second.busbw_low_gbps;
        a.runs = h->second.busbw_runs;
      } else if (!opt.link_baseline_busbw.empty()) {  // several baseline runs: the slowest
        auto b = opt.link_baseline_busbw.find(sig_key);
        if (b == opt.link_baseline_busbw.end()) continue;
        a.reference = b->second.first;
        a.runs = b->second.second;
      } else {
        auto b = base_bw.find(sig_key);
        if (b == base_bw.end() || static_cast<int>(b->second.instances) < opt.min_samples) continue;
        a.reference = b->second.gbps;
        a.runs = 1;
      }
      auto j = job_bw.find(sig_key);
      if (a.reference <= 0 || j == job_bw.end() || j->second.gbps <= 0) continue;
      a.busbw = j->second.gbps;
      history_compared.insert(key.first);
      if (a.busbw < (1.0 - opt.link_history_min_effect) * a.reference) history_slow.push_back(a);
    }
  }
  // What was not compared: say so, with what was measured (a pure data-parallel job runs every
  // collective on one communicator; a job-wide all-reduce beside TP and DP groups has no peer
  // either). A slow link among such a communicator's ranks is not localised.
  if (view != nullptr) {
    std::set<uint64_t> all, alone;
    std::string what;
    size_t listed = 0;
    for (const auto& [key, cs] : comms) {
      all.insert(key.first);
      if (compared.count(key.first) || history_compared.count(key.first) ||
          !by_comm.count(key.first))
        continue;
      if (!alone.insert(key.first).second) continue;
      if (listed++ == 3) {
        what += ", ...";
        continue;
      }
      common::RankSet ranks;
      for (int r : cs.ranks) ranks.add(r, r);
      what += std::string(what.empty() ? "" : ", ") + "ranks " + ranks.toString() + ": " +
              job.signatures()[cs.sig].name() + " of " + fmtNum(cs.bytes / (1 << 20), "MiB") +
              " at " + fmtNum(median(cs.busbw), "GB/s busbw");
    }
    if (comms.empty()) {
      view->note("no complete collective instance (every member's record) in the window");
    } else if (by_comm.empty()) {
      view->note(std::to_string(all.size()) + " communicator" + (all.size() == 1 ? "" : "s") +
                 ", none with " + std::to_string(opt.min_samples) + " complete instances yet");
    } else if (!alone.empty()) {
      const size_t others = compared.size() + history_compared.size();
      const bool shared = std::any_of(alone.begin(), alone.end(),
                                      [&](uint64_t c) { return history_shared.count(c) > 0; });
      const std::string reference =
          history == nullptr && baseline == nullptr
              ? "; or mark a healthy run of this job as history: flare baseline add"
          : shared ? std::string("; its collective runs on other communicators too, so the ") +
                         (history != nullptr ? "healthy history's" : "baseline run's") +
                         " figure for it is not its own"
          : history != nullptr ? "; the healthy history has no figure for its collective"
                               : "; the baseline run has no figure for its collective";
      view->note(
          std::to_string(alone.size()) + " communicator" + (alone.size() == 1 ? "" : "s") + " (" +
          what +
          ") with no peer doing the same collective of the same size over as "
          "many ranks" +
          (others > 0 ? " (" + std::to_string(others) + " others compared)" : std::string()) +
          ": a slow link among its ranks cannot be told from the fabric's own speed "
          "(compare the busbw with what the fabric should reach" +
          reference + ")");
    }
  }
  auto commHash = [](uint64_t comm) {
    char hash[24];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(comm));
    return std::string(hash);
  };
  // One diagnosis per slow communicator (a data-parallel job's gradient buckets are several
  // signatures on one communicator), its evidence per signature, the worst in the summary.
  std::map<uint64_t, std::vector<const AgainstHistory*>> slow_by_comm;
  for (const AgainstHistory& a : history_slow) slow_by_comm[a.key.first].push_back(&a);
  for (const auto& [comm, list] : slow_by_comm) {
    const CommStats& first = comms.at(list.front()->key);
    const std::vector<int> ranks(first.ranks.begin(), first.ranks.end());
    common::RankSet members;  // "0-1023", not every rank of a large data-parallel job
    for (int r : ranks) members.add(r, r);
    auto against = [&](const AgainstHistory& a) {
      if (history != nullptr) {
        return "healthy history (" +
               (a.runs > 1 ? "the slowest of " + std::to_string(a.runs) + " runs"
                           : std::string("1 run")) +
               ")";
      }
      return a.runs > 1 ? "the slowest of " + std::to_string(a.runs) + " baseline runs"
                        : std::string("the baseline run");
    };
    auto what = [&](const AgainstHistory& a) {
      const CommStats& cs = comms.at(a.key);
      return job.signatures()[cs.sig].name() + " of " + fmtNum(cs.bytes / (1 << 20), "MiB");
    };
    Diagnosis d;
    d.kind = "link_slow";
    d.team = Team::kOperations;
    d.cause = "network";
    d.ranks = ranks;
    const AgainstHistory* worst = list.front();
    for (const AgainstHistory* a : list) {
      if (a->busbw / a->reference < worst->busbw / worst->reference) worst = a;
      d.evidence.push_back({"busbw",
                            what(*a) + " on communicator " + commHash(comm) + " (ranks " +
                                members.toString() + "): job busbw " + fmtNum(a->busbw, "GB/s") +
                                " vs " + fmtNum(a->reference, "GB/s") + " in " + against(*a) +
                                " (slow: more than " + fmtPct(opt.link_history_min_effect) +
                                " below)",
                            a->busbw, a->reference});
    }
    d.severity = 1.0 - worst->busbw / worst->reference;
    d.summary =
        "ranks " + members.toString() + ": slow network link — bus bandwidth of " + what(*worst) +
        " " + fmtPct(d.severity) + " below " + against(*worst) +
        (list.size() > 1 ? ", and " + std::to_string(list.size() - 1) + " more of its collective" +
                               (list.size() > 2 ? "s" : "") + " too"
                         : std::string()) +
        "; their only communicator for it has no peer, so the data cannot tell whose "
        "link (check the ranks' NICs: port rate, error counters)";
    out->push_back(std::move(d));
  }
  const double slow_effect = std::max(opt.link_min_effect, opt.link_spread_sigmas * spread);
  std::map<uint64_t, Compared> slow;
  for (const auto& [comm, c] : compared) {
    if (c.ratio() < 1.0 - slow_effect) slow[comm] = c;
  }
  if (slow.empty()) return;
  // Culprit versus victims (docs/metrics.md, "link_slow"): a slow link slows every communicator
  // its rank is in; a bystander shares one slow communicator with it and is in others that run
  // at their peers' speed. So, per slow communicator, a member is cleared (a victim) when one of
  // its other compared communicators is healthy: within link_clear_margin of its peers. The
  // members not cleared are the culprits: in slow communicators only, or in others that are
  // slower too (a mild slow-down can leave the culprit's second communicator just above the
  // threshold; it is still not healthy). When no member of a slow communicator can be cleared,
  // or every member can, the data cannot separate them: all its members are named, as the
  // link(s) between them.
  const double clear_ratio = 1.0 - std::max(opt.link_clear_margin, opt.link_clear_sigmas * spread);
  std::map<int, std::vector<uint64_t>> comms_of;
  for (const auto& [comm, c] : compared) {
    for (int rank : by_comm[comm]->ranks) comms_of[rank].push_back(comm);
  }
  std::set<int> culprit_set, involved;
  bool separated = true;
  for (const auto& [comm, c] : slow) {
    std::vector<int> kept;
    for (int rank : by_comm[comm]->ranks) {
      involved.insert(rank);
      bool cleared = false;
      for (uint64_t other : comms_of[rank]) {
        if (other != comm && !slow.count(other) && compared[other].ratio() >= clear_ratio)
          cleared = true;
      }
      if (!cleared) kept.push_back(rank);
    }
    if (kept.empty() || kept.size() == by_comm[comm]->ranks.size()) {
      separated = false;
      culprit_set.insert(by_comm[comm]->ranks.begin(), by_comm[comm]->ranks.end());
    } else {
      culprit_set.insert(kept.begin(), kept.end());
    }
  }
  std::vector<int> culprits(culprit_set.begin(), culprit_set.end());
  Diagnosis d;
  d.kind = "link_slow";
  d.team = Team::kOperations;
  d.cause = "network";
  d.ranks = culprits;
  // What "slow" meant here, for the reader: the floor, or the job's own spread.
  char sigmas[16];
  std::snprintf(sigmas, sizeof(sigmas), "%g", opt.link_spread_sigmas);
  const std::string threshold =
      " (slow: more than " + fmtPct(slow_effect) + " below" +
      (slow_effect > opt.link_min_effect ? std::string(": ") + sigmas + "× the " + fmtPct(spread) +
                                               " spread of the job's healthy communicators"
                                         : std::string()) +
      ")";
  auto busbwEvidence = [&](uint64_t comm, const Compared& v, const char* note) {
    const CommStats& cs = *by_comm[comm];
    const auto& sig = job.signatures()[cs.sig];
    std::vector<int> ranks(cs.ranks.begin(), cs.ranks.end());
    d.evidence.push_back(
        {"busbw",
         sig.name() + " of " + fmtNum(cs.bytes / (1 << 20), "MiB") + " on communicator " +
             commHash(comm) + " (ranks " + rankList(ranks) + "): busbw " + fmtNum(v.busbw, "GB/s") +
             " vs " + fmtNum(v.reference, "GB/s") + " on peer communicators" + note + threshold,
         v.busbw, v.reference});
  };
  double worst = 0;
  for (const auto& [comm, v] : slow) {
    busbwEvidence(comm, v, "");
    worst = std::max(worst, 1.0 - v.ratio());
  }
  // The culprits' other communicators that are slower than their peers without passing the
  // threshold: why they were not cleared.
  for (const auto& [comm, v] : compared) {
    if (slow.count(comm) || v.ratio() >= clear_ratio) continue;
    const std::set<int>& ranks = by_comm[comm]->ranks;
    if (std::any_of(ranks.begin(), ranks.end(), [&](int r) { return culprit_set.count(r); })) {
      busbwEvidence(comm, v, " (below its peers, under the threshold: not cleared)");
      involved.insert(ranks.begin(), ranks.end());
    }
  }
  for (int rank : involved) {
    if (!culprit_set.count(rank)) d.victims.push_back(rank);
  }
  d.severity = worst;
  const std::string who =
      "rank" + std::string(culprits.size() > 1 ? "s " : " ") + rankList(culprits);
  if (separated) {
    d.summary = who + ": slow network link — bus bandwidth " + fmtPct(worst) +
                " below peer communicators on every communicator " +
                (culprits.size() > 1 ? "they share" : "it is in");
  } else if (culprits.size() == 2) {
    d.summary = "the link between ranks " + std::to_string(culprits[0]) + " and " +
                std::to_string(culprits[1]) + ": slow network link — bus bandwidth " +
                fmtPct(worst) +
                " below peer communicators; the data cannot tell which end (no other "
                "communicator separates them)";
  } else {
    d.summary = who + ": slow network link — bus bandwidth " + fmtPct(worst) +
                " below peer communicators; the data cannot tell which of them (no other "
                "communicator separates them)";
  }
  if (!d.victims.empty()) {
    d.summary += "; rank" + std::string(d.victims.size() > 1 ? "s " : " ") + rankList(d.victims) +
                 " only share a slow communicator with " + (culprits.size() > 1 ? "them" : "it") +
                 " (victims, not at fault)";
  }
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
    detectSlowLink(view.job(), view.options(), &out, &view);
    measureAgainstOwnSteps(view.whole(), view.options(), &out);  // after a fail-slow
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeLinkSlowDetector() {
  return std::make_unique<LinkSlowDetector>();
}

}  // namespace flare::engine
