#include "tools/replay/replay_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "flare/step.h"

namespace flare::replay {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

bool isCompute(flare::v1::OpKind k) {
  return k == flare::v1::OP_KIND_GEMM || k == flare::v1::OP_KIND_ATTENTION ||
         k == flare::v1::OP_KIND_KERNEL || k == flare::v1::OP_KIND_GRAPH ||
         k == flare::v1::OP_KIND_CUSTOM;
}

uint64_t mix(uint64_t a, uint64_t b) {
  // splitmix64 of a combined value: distinct groups of one communicator get distinct hashes.
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The grid layout of the fixture's communicators (replay_plan.h): per recorded hash, the
// replayed size and stride.
struct CommLayout {
  int size = 1;
  int stride = 1;
};

std::map<uint64_t, CommLayout> layoutComms(const std::map<uint64_t, int>& recorded, int ranks) {
  std::vector<std::pair<int, uint64_t>> order;
  for (const auto& [hash, n] : recorded) order.push_back({n, hash});
  std::sort(order.begin(), order.end());
  // Grid dimensions, smallest first; a communicator as large as two or more smaller dimensions
  // together is job-wide (it spans every replayed rank).
  std::vector<bool> job_wide(order.size(), false);
  int product = 1, dims = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (dims >= 2 && order[i].first == product) {
      job_wide[i] = true;
      continue;
    }
    product *= order[i].first;
    ++dims;
  }
  size_t outermost = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    if (!job_wide[i]) outermost = i;
  }
  std::map<uint64_t, CommLayout> out;
  int stride = 1;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& [n, hash] = order[i];
    CommLayout l;
    if (job_wide[i]) {
      l.size = ranks;
    } else if (ranks / stride >= 2) {
      // The outermost dimension (data parallel) grows with the replayed job; the inner ones
      // keep their recorded size.
      l.size = i == outermost ? ranks / stride : std::max(1, std::min(n, ranks / stride));
      l.stride = stride;
      stride *= l.size;
    } else {  // no room for another dimension: contiguous ranks
      l.size = std::max(1, std::min(n, ranks));
    }
    out[hash] = l;
  }
  return out;
}

CommSlot slotOf(uint64_t hash, const std::map<uint64_t, CommLayout>& layout, int rank) {
  auto it = layout.find(hash);
  if (hash == 0 || it == layout.end()) return {};
  const CommLayout& l = it->second;
  const int block = l.size * l.stride;
  // Ranks past the last complete group (N not a multiple) form a smaller group of their own.
  const int rank_in_comm = (rank / l.stride) % l.size;
  const int base = rank - rank_in_comm * l.stride;
  return {mix(hash, static_cast<uint64_t>(base) * 1315423911ULL + static_cast<uint64_t>(block)),
          l.size, rank_in_comm};
}

// Members of `rank`'s group of communicator `hash`.
std::vector<int> membersOf(uint64_t hash, const std::map<uint64_t, CommLayout>& layout, int rank,
                           int ranks) {
  const CommLayout& l = layout.at(hash);
  const int rank_in_comm = (rank / l.stride) % l.size;
  const int base = rank - rank_in_comm * l.stride;
  std::vector<int> out;
  for (int i = 0; i < l.size; ++i) {
    const int m = base + i * l.stride;
    if (m < ranks) out.push_back(m);
  }
  return out;
}

// Where a record lives in the fixture.
struct Ref {
  uint32_t batch = 0;
  uint32_t index = 0;
};

enum class EvType : int {
  kEnd = 0,  // at equal times: ends first (an op starting when another ends sees its delay)
  kStall = 1,
  kHang = 2,
  kIssue = 3,
  kStart = 4,
  kPoint = 5,    // span/step-marker times: sample the delay
  kEndZero = 6,  // the end of a zero-length op: after its own start
};

struct Event {
  int64_t t = 0;
  EvType type = EvType::kPoint;
  uint32_t item = 0;  // kernel index (start/end) or point index
  bool operator<(const Event& o) const {
    return std::tie(t, type, item) < std::tie(o.t, o.type, o.item);
  }
};

}  // namespace

bool makePlan(const std::vector<flare::v1::RecordBatch>& batches, const PlanOptions& options,
              Plan* plan, std::string* error) {
  const int n = options.ranks;
  const Perturbation& p = options.perturb;
  if (n < 1) {
    *error = "--ranks must be at least 1";
    return false;
  }
  for (int r : {p.slow_gpu_rank, p.slow_link_rank, p.stall_rank, p.hang_rank}) {
    if (r >= n) {
      *error =
          "a perturbed rank (" + std::to_string(r) + ") is not below --ranks " + std::to_string(n);
      return false;
    }
  }
  // Tables, kernels, communicators, step boundaries.
  std::map<uint32_t, flare::v1::Signature> sigs;
  std::map<uint32_t, std::string> apis;
  std::vector<Ref> kernels;
  std::map<uint64_t, int> comms;  // recorded hash -> nranks
  std::vector<int64_t> marker_starts, loader_starts, sync_marker_starts;
  int64_t t0 = kNever, tend = std::numeric_limits<int64_t>::min();
  auto seen = [&](int64_t t) {
    if (t <= 0) return;
    t0 = std::min(t0, t);
    tend = std::max(tend, t);
  };
  for (uint32_t b = 0; b < batches.size(); ++b) {
    const auto& batch = batches[b];
    for (const auto& s : batch.signatures()) sigs[s.id()] = s;
    for (const auto& a : batch.api_names()) apis[a.id()] = a.qualified_name();
    for (uint32_t i = 0; i < static_cast<uint32_t>(batch.kernels_size()); ++i) {
      const auto& k = batch.kernels(static_cast<int>(i));
      kernels.push_back({b, i});
      seen(k.issue_ns());
      seen(k.start_ns());
      seen(k.end_ns());
      if (k.has_collective() && k.collective().comm_hash() != 0 && k.collective().nranks() > 1)
        comms[k.collective().comm_hash()] = k.collective().nranks();
      auto sig = sigs.find(k.signature_id());
      if (sig != sigs.end() && sig->second.name() == FLARE_STEP_MARKER_NAME)
        sync_marker_starts.push_back(k.start_ns());
    }
    for (const auto& sp : batch.spans()) {
      seen(sp.start_ns());
      seen(sp.end_ns());
      auto a = apis.find(sp.api_id());
      if (a != apis.end() && a->second.ends_with("__next__"))
        loader_starts.push_back(sp.start_ns());
    }
    for (const auto& st : batch.steps()) {
      seen(st.start_ns());
      seen(st.end_ns());
      marker_starts.push_back(st.start_ns());
    }
  }
  if (kernels.empty()) {
    *error = "the fixture holds no kernel records (a raw-mode spool is needed)";
    return false;
  }
  // Step boundaries, as flared takes them: step markers, else the DataLoader's `__next__`.
  std::vector<int64_t> bounds = !marker_starts.empty()        ? marker_starts
                                : !sync_marker_starts.empty() ? sync_marker_starts
                                                              : loader_starts;
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  plan->t0_ns = t0;
  plan->tend_ns = tend;
  plan->boundaries_ns = bounds;
  plan->steps = bounds.size() > 1 ? bounds.size() - 1 : 0;
  if (p.hang_rank >= 0 && (p.hang_step < 0 || static_cast<size_t>(p.hang_step) >= plan->steps)) {
    *error = "--hang step " + std::to_string(p.hang_step) + " is not one of the fixture's " +
             std::to_string(plan->steps) + " steps";
    return false;
  }
  if (p.stall_rank >= 0 && plan->steps == 0) {
    *error = "--stall needs step boundaries in the fixture (none found)";
    return false;
  }
  const auto layout = layoutComms(comms, n);

  // Events on the fixture's clock.
  std::vector<int64_t> points;  // span and step times whose delay is sampled
  std::vector<Event> events;
  for (uint32_t i = 0; i < kernels.size(); ++i) {
    const auto& k = batches[kernels[i].batch].kernels(static_cast<int>(kernels[i].index));
    events.push_back({k.issue_ns(), EvType::kIssue, i});
    events.push_back({k.start_ns(), EvType::kStart, i});
    events.push_back(k.end_ns() > k.start_ns() ? Event{k.end_ns(), EvType::kEnd, i}
                                               : Event{k.start_ns(), EvType::kEndZero, i});
  }
  auto point = [&](int64_t t) {
    events.push_back({t, EvType::kPoint, static_cast<uint32_t>(points.size())});
    points.push_back(t);
  };
  for (const auto& batch : batches) {
    for (const auto& sp : batch.spans()) {
      point(sp.start_ns());
      point(sp.end_ns());
    }
    for (const auto& st : batch.steps()) {
      point(st.start_ns());
      point(st.end_ns());
    }
    point(batch.created_ns());
  }
  // The quickest launch of the fixture: the issue latency of a GPU op that found its stream
  // idle.
  int64_t min_launch_ns = kNever;
  for (const Ref& ref : kernels) {
    const auto& k = batches[ref.batch].kernels(static_cast<int>(ref.index));
    auto sig = sigs.find(k.signature_id());
    if ((sig == sigs.end() || sig->second.kind() != flare::v1::OP_KIND_SYNC) &&
        k.start_ns() >= k.issue_ns())
      min_launch_ns = std::min(min_launch_ns, k.start_ns() - k.issue_ns());
  }
  if (min_launch_ns == kNever) min_launch_ns = 0;

  // The middle of each step's issuing (the median issue time of the GPU ops issued in the
  // step): where a GC pause or a stray synchronization holds the host, and where a rank that
  // hangs in its own code stops. Not the middle of the step's time, where the host usually waits
  // for the GPU anyway.
  std::vector<int64_t> issuing_midpoints(plan->steps, kNever);
  {
    std::vector<int64_t> issues;
    for (uint32_t i = 0; i < kernels.size(); ++i) {
      const auto& k = batches[kernels[i].batch].kernels(static_cast<int>(kernels[i].index));
      auto sig = sigs.find(k.signature_id());
      if (sig == sigs.end() || sig->second.kind() != flare::v1::OP_KIND_SYNC)
        issues.push_back(k.issue_ns());
    }
    std::sort(issues.begin(), issues.end());
    for (size_t i = 0; i < plan->steps; ++i) {
      const auto a = std::lower_bound(issues.begin(), issues.end(), bounds[i]);
      const auto b = std::lower_bound(issues.begin(), issues.end(), bounds[i + 1]);
      issuing_midpoints[i] =
          a != b ? *(a + (b - a) / 2) : bounds[i] + (bounds[i + 1] - bounds[i]) / 2;
    }
  }
  if (p.stall_rank >= 0 && p.stall_ns > 0) {
    for (int64_t t : issuing_midpoints) events.push_back({t, EvType::kStall, 0});
  }
  if (p.hang_rank >= 0) {
    events.push_back({issuing_midpoints[static_cast<size_t>(p.hang_step)], EvType::kHang, 0});
  }
  std::sort(events.begin(), events.end());

  // Walk the events for every rank at once. Two delays per rank: the host's (H: issue times,
  // spans, markers) and the GPU's (G: what its streams' work is late by). An op issued with host
  // delay h starts max(G, h - its queueing slack) late; a GPU op leaves G at least its own end's
  // delay; a blocking synchronization returns when the GPU is done, and H is then its return's
  // delay.
  // Hang: `stopped` is when a rank's host stops issuing (the hung rank: mid-step; a peer: when
  // it enters a collective a stopped rank never issues), `stuck` when its GPU stops running
  // (a peer: that collective; the hung rank's GPU drains what was issued before).
  std::vector<int64_t> host(n, 0), gpu(n, 0), stopped(n, kNever), stuck(n, kNever);
  std::vector<std::string> waiting(n);
  // [rank][kernel]: shifted issue, start, end; the host delay at its issue; kept?
  struct Timed {
    int64_t issue = 0, start = 0, end = 0;
    int64_t host_at_issue = -1;  // -1: not issued yet
    bool kept = false;
  };
  std::vector<std::vector<Timed>> timed(n, std::vector<Timed>(kernels.size()));
  std::vector<std::vector<int64_t>> point_shift(n, std::vector<int64_t>(points.size(), 0));
  // Per rank, per replayed communicator: (last issued, last completed) seq (1-based), op name,
  // slot.
  struct Progress {
    uint64_t issued = 0, completed = 0;
    std::string op;
    CommSlot slot;
  };
  std::vector<std::map<uint64_t, Progress>> progress(n);
  auto kernelAt = [&](uint32_t i) -> const flare::v1::KernelRecord& {
    return batches[kernels[i].batch].kernels(static_cast<int>(kernels[i].index));
  };
  auto kindOf = [&](const flare::v1::KernelRecord& k) {
    auto it = sigs.find(k.signature_id());
    return it == sigs.end() ? flare::v1::OP_KIND_UNSPECIFIED : it->second.kind();
  };
  auto nameOf = [&](const flare::v1::KernelRecord& k) {
    auto it = sigs.find(k.signature_id());
    return it == sigs.end() ? std::string("?") : it->second.name();
  };
  auto isComm = [&](const flare::v1::KernelRecord& k) {
    return k.has_collective() && layout.count(k.collective().comm_hash()) > 0;
  };

  for (const Event& e : events) {
    switch (e.type) {
      case EvType::kStall:
        if (stopped[p.stall_rank] > e.t) host[p.stall_rank] += p.stall_ns;
        break;
      case EvType::kHang:
        stopped[p.hang_rank] = std::min(stopped[p.hang_rank], e.t);
        break;
      case EvType::kPoint:
        for (int r = 0; r < n; ++r) point_shift[r][e.item] = host[r];
        break;
      case EvType::kIssue:
        for (int r = 0; r < n; ++r) timed[r][e.item].host_at_issue = host[r];
        break;
      case EvType::kStart: {
        const auto& k = kernelAt(e.item);
        const bool comm = isComm(k);
        const bool sync = kindOf(k) == flare::v1::OP_KIND_SYNC;
        // A collective some member never issues (it stopped before) never completes.
        std::vector<char> group_stopped(n, 0);
        if (comm) {
          for (int r = 0; r < n; ++r) {
            for (int m : membersOf(k.collective().comm_hash(), layout, r, n))
              if (stopped[m] <= k.issue_ns()) group_stopped[r] = 1;
          }
        }
        for (int r = 0; r < n; ++r) {
          if (stopped[r] <= k.issue_ns() || stuck[r] <= e.t) continue;  // never issued or run
          Timed& t = timed[r][e.item];
          const int64_t h = t.host_at_issue >= 0 ? t.host_at_issue : host[r];
          t.issue = k.issue_ns() + h;
          // A host span runs on the host's clock. A GPU op starts when the GPU is free (G) and
          // once issued: a late issue delays it only by what its queue did not absorb (the
          // time it waited in the queue beyond the quickest launch of the fixture), so after a
          // long host stall the GPU has run dry and the latency collapses, as on a real GPU.
          const int64_t slack = std::max<int64_t>(0, k.start_ns() - k.issue_ns() - min_launch_ns);
          t.start = k.start_ns() + (sync ? host[r] : std::max(gpu[r], h - slack));
          t.kept = true;
          if (comm) {
            const CommSlot slot = slotOf(k.collective().comm_hash(), layout, r);
            Progress& pr = progress[r][slot.hash];
            pr.slot = slot;
            pr.issued = std::max(pr.issued, k.collective().seq() + 1);
            pr.op = nameOf(k);
            if (group_stopped[r]) {  // waits forever for a stopped member
              t.kept = false;
              stopped[r] = std::min(stopped[r], e.t);
              stuck[r] = e.t;
              waiting[r] = nameOf(k);
            }
          }
        }
        break;
      }
      case EvType::kEnd:
      case EvType::kEndZero: {
        const auto& k = kernelAt(e.item);
        const int64_t dur = std::max<int64_t>(0, k.end_ns() - k.start_ns());
        if (isComm(k)) {
          // Every member ends at the recorded end plus the latest arrival's delay (its delay
          // when it started the collective: what its other streams do meanwhile does not hold
          // up a running kernel), stretched when the slow link is in the communicator.
          std::vector<int64_t> end_of(n, 0);
          for (int r = 0; r < n; ++r) {
            if (!timed[r][e.item].kept) continue;
            int64_t late = 0;
            bool slow = false;
            for (int m : membersOf(k.collective().comm_hash(), layout, r, n)) {
              if (timed[m][e.item].kept)
                late = std::max(late, timed[m][e.item].start - k.start_ns());
              slow = slow || m == p.slow_link_rank;
            }
            const int64_t extra =
                slow ? static_cast<int64_t>(static_cast<double>(dur) * (p.link_factor - 1.0) + 0.5)
                     : 0;
            end_of[r] = k.end_ns() + late + extra;
          }
          for (int r = 0; r < n; ++r) {
            Timed& t = timed[r][e.item];
            if (!t.kept) continue;
            t.end = std::max(end_of[r], t.start);
            gpu[r] = std::max(gpu[r], t.end - k.end_ns());
            const CommSlot slot = slotOf(k.collective().comm_hash(), layout, r);
            Progress& pr = progress[r][slot.hash];
            pr.completed = std::max(pr.completed, k.collective().seq() + 1);
          }
          break;
        }
        const auto kind = kindOf(k);
        const bool blocking =
            kind == flare::v1::OP_KIND_SYNC && nameOf(k).find("Synchronize") != std::string::npos;
        for (int r = 0; r < n; ++r) {
          Timed& t = timed[r][e.item];
          if (!t.kept) continue;
          if (kind == flare::v1::OP_KIND_SYNC && stopped[r] <= e.t) {
            t.kept = false;  // the host is stopped: a host call in progress does not return
            continue;
          }
          if (kind == flare::v1::OP_KIND_SYNC) {
            // A blocking synchronization returns when the GPU work it waits for is done (at
            // once when the host comes late and the GPU is done already).
            t.end = blocking ? std::max(t.start, k.end_ns() + gpu[r]) : t.start + dur;
            // After it the host is as late as the sync's return: later than before when the
            // GPU was, earlier when the host had come late to a wait it now shortens.
            if (blocking) host[r] = t.end - k.end_ns();
            continue;
          }
          int64_t d = dur;
          if (r == p.slow_gpu_rank && isCompute(kind))
            d = static_cast<int64_t>(static_cast<double>(dur) * p.gpu_factor + 0.5);
          t.end = t.start + d;
          gpu[r] = std::max(gpu[r], t.end - k.end_ns());
        }
        break;
      }
    }
  }

  // The batches of every rank.
  plan->ranks.assign(n, RankPlan{});
  std::unordered_map<uint64_t, uint32_t> kernel_index;  // (batch << 32 | index) -> kernel
  for (uint32_t i = 0; i < kernels.size(); ++i)
    kernel_index[(static_cast<uint64_t>(kernels[i].batch) << 32) | kernels[i].index] = i;
  for (int r = 0; r < n; ++r) {
    RankPlan& rp = plan->ranks[r];
    rp.stopped_at_ns = stopped[r];
    rp.waiting_in = waiting[r];
    uint32_t next_point = 0;
    uint64_t seq = 0;
    int64_t last_due = std::numeric_limits<int64_t>::min();
    for (uint32_t b = 0; b < batches.size(); ++b) {
      const auto& in = batches[b];
      flare::v1::RecordBatch out;
      out.set_rank(r);
      *out.mutable_signatures() = in.signatures();
      *out.mutable_api_names() = in.api_names();
      int64_t newest = std::numeric_limits<int64_t>::min();
      size_t records = 0;
      for (uint32_t i = 0; i < static_cast<uint32_t>(in.kernels_size()); ++i) {
        const uint32_t ki = kernel_index[(static_cast<uint64_t>(b) << 32) | i];
        const Timed& t = timed[r][ki];
        if (!t.kept) continue;
        const auto& k = in.kernels(static_cast<int>(i));
        flare::v1::KernelRecord* o = out.add_kernels();
        *o = k;
        o->set_issue_ns(t.issue);
        o->set_start_ns(t.start);
        o->set_end_ns(t.end);
        o->set_issue_latency_ns(t.start - t.issue);
        if (k.has_collective() && layout.count(k.collective().comm_hash())) {
          const CommSlot slot = slotOf(k.collective().comm_hash(), layout, r);
          auto* c = o->mutable_collective();
          const int old_rank = c->rank_in_comm();
          c->set_comm_hash(slot.hash);
          c->set_nranks(slot.nranks);
          c->set_rank_in_comm(slot.rank_in_comm);
          if (c->has_peer() && slot.nranks > 0) {
            c->set_peer(((slot.rank_in_comm + c->peer() - old_rank) % slot.nranks + slot.nranks) %
                        slot.nranks);
          }
        }
        newest = std::max(newest, t.end);
        ++records;
      }
      // Spans and step markers: their points were registered in this order above.
      for (const auto& sp : in.spans()) {
        const int64_t s = sp.start_ns() + point_shift[r][next_point++];
        const int64_t e = sp.end_ns() + point_shift[r][next_point++];
        if (sp.end_ns() >= stopped[r]) continue;
        flare::v1::ApiSpan* o = out.add_spans();
        *o = sp;
        o->set_start_ns(s);
        o->set_end_ns(std::max(s, e));
        newest = std::max(newest, o->end_ns());
        ++records;
      }
      for (const auto& st : in.steps()) {
        const int64_t s = st.start_ns() + point_shift[r][next_point++];
        const int64_t e = st.end_ns() + point_shift[r][next_point++];
        if (st.start_ns() >= stopped[r]) continue;
        flare::v1::StepMarker* o = out.add_steps();
        *o = st;
        o->set_start_ns(s);
        if (st.end_ns() != 0) o->set_end_ns(std::max(s, e));
        newest = std::max(newest, s);
        ++records;
      }
      const int64_t created = in.created_ns() + point_shift[r][next_point++];
      if (in.has_device()) {
        *out.mutable_device() = in.device();
        // One GPU per replayed rank: the recorded UUID and bus id, made distinct per rank.
        auto* d = out.mutable_device();
        if (!d->uuid().empty()) d->set_uuid(d->uuid() + "-r" + std::to_string(r));
      }
      if (in.has_drops()) *out.mutable_drops() = in.drops();
      // A stopped rank sends nothing that is only news of its later life.
      if (records == 0 && in.created_ns() >= stopped[r]) continue;
      out.set_batch_seq(++seq);
      out.set_created_ns(std::max(created, newest));
      last_due = std::max(last_due, out.created_ns());
      rp.due_ns.push_back(last_due);
      rp.batches.push_back(std::move(out));
    }
    for (const auto& [hash, pr] : progress[r]) {
      flare::v1::CollectiveProgress cp;
      char name[32];
      std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(hash));
      cp.set_communicator(name);
      cp.set_last_issued_seq(pr.issued);
      cp.set_last_completed_seq(pr.completed);
      cp.set_last_issued_op(pr.op);
      cp.set_comm_rank(pr.slot.rank_in_comm);
      cp.set_nranks(pr.slot.nranks);
      rp.progress.push_back(std::move(cp));
    }
  }
  return true;
}

void shiftTimes(flare::v1::RecordBatch* b, int64_t off) {
  auto shift = [off](int64_t t) { return t == 0 ? t : t + off; };
  for (auto& k : *b->mutable_kernels()) {
    k.set_issue_ns(shift(k.issue_ns()));
    k.set_start_ns(shift(k.start_ns()));
    k.set_end_ns(shift(k.end_ns()));
  }
  for (auto& s : *b->mutable_spans()) {
    s.set_start_ns(shift(s.start_ns()));
    s.set_end_ns(shift(s.end_ns()));
  }
  for (auto& s : *b->mutable_steps()) {
    s.set_start_ns(shift(s.start_ns()));
    s.set_end_ns(shift(s.end_ns()));
  }
  for (auto& s : *b->mutable_step_stats()) {
    s.set_start_ns(shift(s.start_ns()));
    s.set_end_ns(shift(s.end_ns()));
  }
  for (auto& s : *b->mutable_summaries()) {
    s.set_window_start_ns(shift(s.window_start_ns()));
    s.set_window_end_ns(shift(s.window_end_ns()));
  }
  for (auto& c : *b->mutable_collective_blocks()) c.set_base_issue_ns(shift(c.base_issue_ns()));
  for (auto& d : *b->mutable_deep_trace()) {
    d.set_start_ns(shift(d.start_ns()));
    d.set_end_ns(shift(d.end_ns()));
  }
  b->set_created_ns(shift(b->created_ns()));
}

}  // namespace flare::replay
