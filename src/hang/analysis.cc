#include "src/hang/analysis.h"

#include <algorithm>
#include <array>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace flare::hang {
namespace {

using flare::v1::NativeFrame;
using flare::v1::PythonFrame;
using flare::v1::ThreadStack;

constexpr FrameClass kComm = FrameClass::kCommunication;
constexpr FrameClass kNeutral = FrameClass::kNeutral;
constexpr FrameSide kPy = FrameSide::kPython;
constexpr FrameSide kNat = FrameSide::kNative;
constexpr MatchKind kPrefix = MatchKind::kPrefix;
constexpr MatchKind kContains = MatchKind::kContains;

// Order matters only within a side: the first matching rule decides a frame's class.
constexpr std::array<FrameRule, 35> kFrameRules = {{
    // Python: torch.distributed and c10d are communication; waits of the standard library are
    // neutral (the frame that called them decides).
    {kPy, kContains, "file", "torch/distributed/", kComm},
    {kPy, kContains, "file", "c10d", kComm},
    {kPy, kContains, "file", "deepspeed/comm/", kComm},
    {kPy, kContains, "file", "megatron/core/parallel_state", kComm},
    {kPy, kPrefix, "function", "all_reduce", kComm},
    {kPy, kPrefix, "function", "all_gather", kComm},
    {kPy, kPrefix, "function", "reduce_scatter", kComm},
    {kPy, kPrefix, "function", "all_to_all", kComm},
    {kPy, kPrefix, "function", "nccl", kComm},
    {kPy, kContains, "file", "threading.py", kNeutral},
    {kPy, kContains, "file", "/ctypes/", kNeutral},
    {kPy, kContains, "file", "torch/cuda/__init__.py", kNeutral},  // torch.cuda.synchronize
    // Native: NCCL (public names, pnccl*, kernels) and PyTorch's NCCL process group.
    {kNat, kPrefix, "symbol", "nccl", kComm},
    {kNat, kPrefix, "symbol", "pnccl", kComm},
    {kNat, kContains, "symbol", "c10d::", kComm},
    {kNat, kContains, "symbol", "ProcessGroupNCCL", kComm},
    {kNat, kContains, "module", "libnccl", kComm},
    // Native waits: CUDA synchronization (on any stream: the stream alone does not say whether
    // it carries NCCL work), libc/futex/pthread waits, the Python interpreter loop.
    {kNat, kPrefix, "symbol", "cudaStreamSynchronize", kNeutral},
    {kNat, kPrefix, "symbol", "cudaDeviceSynchronize", kNeutral},
    {kNat, kPrefix, "symbol", "cudaEventSynchronize", kNeutral},
    {kNat, kPrefix, "symbol", "cudaMemcpy", kNeutral},
    {kNat, kPrefix, "symbol", "cuStreamSynchronize", kNeutral},
    {kNat, kPrefix, "symbol", "cuCtxSynchronize", kNeutral},
    {kNat, kPrefix, "symbol", "cuEventSynchronize", kNeutral},
    {kNat, kPrefix, "symbol", "pthread_", kNeutral},
    {kNat, kContains, "symbol", "futex", kNeutral},
    {kNat, kPrefix, "symbol", "__GI_", kNeutral},
    {kNat, kPrefix, "symbol", "syscall", kNeutral},
    {kNat, kContains, "symbol", "nanosleep", kNeutral},
    {kNat, kPrefix, "symbol", "_Py", kNeutral},
    {kNat, kPrefix, "symbol", "Py", kNeutral},
    {kNat, kContains, "module", "libpython", kNeutral},
    {kNat, kContains, "module", "libc.so", kNeutral},
    {kNat, kContains, "module", "libcuda", kNeutral},  // libcuda.so.1, libcudart.so.*
    {kNat, kPrefix, "symbol", "", kNeutral},           // unsymbolized frames say nothing
}};

bool matches(const FrameRule& r, std::string_view value) {
  if (r.match == MatchKind::kPrefix) {
    // The empty pattern matches only the empty value (an unsymbolized frame).
    return r.pattern.empty() ? value.empty() : value.substr(0, r.pattern.size()) == r.pattern;
  }
  return value.find(r.pattern) != std::string_view::npos;
}

std::string_view basename(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// The class decided by the innermost non-neutral frame of one side (kNone: application code, or
// only neutral frames).
template <typename Frames, typename Classify>
FrameClass sideClass(const Frames& frames, Classify classify) {
  for (const auto& f : frames) {
    FrameClass c = classify(f);
    if (c == kNeutral) continue;
    return c;  // kCommunication, or kNone for application code
  }
  return FrameClass::kNone;
}

uint64_t fnv(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h ^= 0xff;  // field separator
  h *= 0x100000001b3ull;
  return h;
}

uint64_t signature(const ThreadStack* t) {
  uint64_t h = 0xcbf29ce484222325ull;
  if (!t) return h;
  for (const PythonFrame& f : t->python_frames()) {
    h = fnv(h, f.function());
    h = fnv(h, f.file());
    h = fnv(h, std::to_string(f.line()));
  }
  h = fnv(h, "|");
  for (const NativeFrame& f : t->native_frames()) {
    if (!f.symbol().empty()) {
      h = fnv(h, f.symbol());
    } else {
      h = fnv(h, basename(f.module()));
      h = fnv(h, std::to_string(f.offset()));
    }
  }
  return h;
}

std::vector<std::string> representativeFrames(const ThreadStack* t) {
  std::vector<std::string> out;
  if (!t) return out;
  for (const PythonFrame& f : t->python_frames()) {
    out.push_back("py  " + f.function() + " (" + std::string(basename(f.file())) + ":" +
                  std::to_string(f.line()) + ")");
  }
  for (const NativeFrame& f : t->native_frames()) {
    std::string name = f.symbol().empty() ? "??" : f.symbol();
    out.push_back("nat " + name + " (" + std::string(basename(f.module())) + ")");
  }
  return out;
}

Suspect makeSuspect(const RankEvidence& e, std::string reason) {
  return Suspect{e.rank, e.host, e.gpu_uuid, e.gpu_index, std::move(reason)};
}

struct EdgeSide {
  uint32_t comm;  // communicator index (0: connections with global peers)
  uint64_t key;   // channel << 40 | sender << 20 | receiver
  uint64_t step;
  bool send;
};

constexpr int kMaxJoinRank = (1 << 20) - 1;
constexpr int kMaxChannel = (1 << 16) - 1;

uint64_t edgeKey(int channel, int sender, int receiver) {
  return uint64_t(channel) << 40 | uint64_t(sender) << 20 | uint64_t(receiver);
}

// One rank's connections with global peers (sub-communicator peers translated).
struct Conn {
  int channel;
  int peer;  // global rank
  uint64_t step;
  bool send;
  uint32_t comm;  // index into JoinInput::comm_names
};
struct RankConns {
  int rank;
  std::vector<Conn> conns;
};
struct JoinInput {
  std::vector<RankConns> ranks;  // inspected ranks only, ascending
  std::vector<std::string> comm_names{""};
};

// Translates sub-communicator peers (ConnectionStep.communicator set: `peer` is a rank of that
// communicator) to global ranks, from what every rank says its rank in each communicator is
// (CollectiveProgress.comm_rank from DumpStacks, ConnectionStep.comm_rank from Inspect).
// Connections whose peer cannot be translated are counted and left out.
JoinInput translateConnections(const std::vector<const RankEvidence*>& ranks, Diagnosis& d) {
  JoinInput in;
  std::map<std::pair<std::string, int>, int> global;  // (communicator, comm rank) -> rank
  std::map<std::string, uint32_t> comm_index;
  for (const RankEvidence* e : ranks) {
    for (const auto& c : e->stacks.collectives()) {
      if (c.nranks() > 0) global.try_emplace({c.communicator(), c.comm_rank()}, e->rank);
    }
    if (!e->inspected) continue;
    for (const auto& c : e->connections) {
      if (!c.communicator().empty()) global.try_emplace({c.communicator(), c.comm_rank()}, e->rank);
    }
  }
  for (const RankEvidence* e : ranks) {
    if (!e->inspected) continue;
    RankConns rc{e->rank, {}};
    for (const auto& c : e->connections) {
      int peer = c.peer();
      uint32_t comm = 0;
      if (!c.communicator().empty()) {
        auto it = global.find({c.communicator(), c.peer()});
        if (it == global.end()) {
          d.untranslated_connections++;
          continue;
        }
        peer = it->second;
        auto [ci, added] =
            comm_index.try_emplace(c.communicator(), static_cast<uint32_t>(in.comm_names.size()));
        if (added) in.comm_names.push_back(c.communicator());
        comm = ci->second;
      }
      rc.conns.push_back(Conn{c.channel(), peer, c.step(), c.send(), comm});
    }
    in.ranks.push_back(std::move(rc));
  }
  return in;
}

// The topology join of rule 4. Fills d.link (when one edge is the unique slowest in the most
// channels), the connection counters and evidence lines.
// Rule 4b: after an inspection that names no link, a rank every connection of which (its own
// reports and its peers' reports about it) is at step 0 while some other connection moved never
// reached the collective on its GPU (the stream is stuck before it): it holds the others.
std::vector<int> neverArrived(const JoinInput& in) {
  std::map<int, bool> moved;  // rank -> any connection touching it above step 0
  bool any_moved = false;
  for (const RankConns& e : in.ranks) {
    moved.try_emplace(e.rank, false);
    for (const Conn& c : e.conns) {
      if (c.peer < 0 || c.peer == e.rank) continue;
      moved.try_emplace(c.peer, false);
      if (c.step > 0) {
        moved[e.rank] = true;
        moved[c.peer] = true;
        any_moved = true;
      }
    }
  }
  std::vector<int> out;
  if (!any_moved) return out;
  for (const auto& [rank, m] : moved) {
    if (!m) out.push_back(rank);
  }
  return out;
}

// Channels are per communicator: channel c of the tensor-parallel group and channel c of the
// data-parallel group are different rings, so each (communicator, channel) votes on its own.
void joinConnections(const JoinInput& in, Diagnosis& d) {
  std::vector<EdgeSide> sides;
  std::unordered_set<int> inspected;
  for (const RankConns& e : in.ranks) {
    inspected.insert(e.rank);
    for (const Conn& c : e.conns) {
      if (c.channel < 0 || c.channel > kMaxChannel || c.peer < 0 || c.peer > kMaxJoinRank ||
          e.rank > kMaxJoinRank || c.peer == e.rank) {
        d.invalid_connections++;
        continue;
      }
      sides.push_back(c.send ? EdgeSide{c.comm, edgeKey(c.channel, e.rank, c.peer), c.step, true}
                             : EdgeSide{c.comm, edgeKey(c.channel, c.peer, e.rank), c.step, false});
    }
  }
  if (sides.empty()) return;
  std::sort(sides.begin(), sides.end(), [](const EdgeSide& a, const EdgeSide& b) {
    if (a.comm != b.comm) return a.comm < b.comm;
    return a.key != b.key ? a.key < b.key : a.send > b.send;
  });

  struct ChannelMin {
    uint64_t key = 0;
    uint64_t best = UINT64_MAX;
    uint64_t second = UINT64_MAX;
  };
  std::map<std::pair<uint32_t, int>, ChannelMin> channels;  // (communicator, channel)
  for (size_t i = 0; i < sides.size();) {
    size_t j = i;
    bool has_send = false, has_recv = false;
    uint64_t send_step = 0, recv_step = 0;
    for (; j < sides.size() && sides[j].key == sides[i].key && sides[j].comm == sides[i].comm;
         ++j) {
      if (sides[j].send && !has_send) {
        has_send = true;
        send_step = sides[j].step;
      } else if (!sides[j].send && !has_recv) {
        has_recv = true;
        recv_step = sides[j].step;
      }
    }
    const uint64_t key = sides[i].key;
    const int channel = int(key >> 40);
    const int sender = int((key >> 20) & kMaxJoinRank);
    const int receiver = int(key & kMaxJoinRank);
    uint64_t progress;
    if (has_send && has_recv) {
      if (recv_step > send_step) d.inconsistent_connections++;
      progress = std::min(send_step, recv_step);
    } else {
      // One side only: counted as unmatched when the other end was inspected too.
      if (inspected.count(has_send ? receiver : sender)) d.unmatched_connections++;
      progress = has_send ? send_step : recv_step;
    }
    ChannelMin& m = channels[{sides[i].comm, channel}];
    if (progress < m.best) {
      m.second = m.best;
      m.best = progress;
      m.key = key;
    } else if (progress < m.second) {
      m.second = progress;
    }
    i = j;
  }

  // Vote: the unique slowest edge of each channel.
  struct Vote {
    int votes = 0;
    uint64_t step = UINT64_MAX;
    int first_channel = -1;
    uint32_t comm = 0;
  };
  std::map<uint64_t, Vote> votes;  // key without channel
  for (const auto& [cc, m] : channels) {
    if (m.best == m.second) continue;  // a tie: this channel names no edge
    Vote& v = votes[m.key & ((uint64_t(1) << 40) - 1)];
    v.votes++;
    v.step = std::min(v.step, m.best);
    if (v.first_channel < 0) {
      v.first_channel = cc.second;
      v.comm = cc.first;
    }
  }
  const int total = int(channels.size());
  if (votes.empty()) {
    d.evidence.push_back("connection steps: no channel has a single slowest connection");
    return;
  }
  auto better = [](const Vote& a, const Vote& b) {
    return a.votes != b.votes ? a.votes > b.votes : a.step < b.step;
  };
  auto best = votes.begin();
  bool tie = false;
  for (auto it = std::next(votes.begin()); it != votes.end(); ++it) {
    if (better(it->second, best->second)) {
      best = it;
      tie = false;
    } else if (!better(best->second, it->second)) {
      tie = true;
    }
  }
  if (tie) {
    d.evidence.push_back("connection steps: channels disagree on the slowest connection");
    return;
  }
  SuspectLink link;
  link.channel = best->second.first_channel;
  link.sender = int((best->first >> 20) & kMaxJoinRank);
  link.receiver = int(best->first & kMaxJoinRank);
  link.step = best->second.step;
  link.channels_agreeing = best->second.votes;
  link.channels_total = total;
  link.communicator = in.comm_names[best->second.comm];
  d.link = link;
  d.evidence.push_back("slowest connection: rank " + std::to_string(link.sender) + " -> rank " +
                       std::to_string(link.receiver) +
                       (link.communicator.empty() ? "" : " on communicator " + link.communicator) +
                       " at step " + std::to_string(link.step) + " (slowest in " +
                       std::to_string(link.channels_agreeing) + " of " + std::to_string(total) +
                       " channels)");
}

std::vector<int> sortedUnique(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

std::string_view responsivenessName(Responsiveness r) {
  switch (r) {
    case Responsiveness::kAnswered:
      return "answered";
    case Responsiveness::kNoAnswer:
      return "no answer";
    case Responsiveness::kCrashed:
      return "crashed";
    case Responsiveness::kStopped:
      return "stopped";
  }
  return "?";
}

std::string_view hangKindName(HangKind k) {
  switch (k) {
    case HangKind::kNonCommunication:
      return "non-communication hang";
    case HangKind::kCommunication:
      return "communication hang";
    case HangKind::kUnresponsiveRank:
      return "unresponsive rank";
    case HangKind::kInconclusive:
      return "inconclusive";
  }
  return "?";
}

std::span<const FrameRule> frameRules() {
  return kFrameRules;
}

FrameClass classifyPython(const PythonFrame& f) {
  for (const FrameRule& r : kFrameRules) {
    if (r.side != kPy) continue;
    if (matches(r, r.field == "file" ? std::string_view(f.file()) : std::string_view(f.function())))
      return r.result;
  }
  return FrameClass::kNone;
}

FrameClass classifyNative(const NativeFrame& f) {
  for (const FrameRule& r : kFrameRules) {
    if (r.side != kNat) continue;
    if (matches(r,
                r.field == "module" ? std::string_view(f.module()) : std::string_view(f.symbol())))
      return r.result;
  }
  return FrameClass::kNone;
}

FrameClass classifyThread(const ThreadStack& t) {
  if (sideClass(t.native_frames(), classifyNative) == kComm) return kComm;
  if (sideClass(t.python_frames(), classifyPython) == kComm) return kComm;
  return FrameClass::kNone;
}

const ThreadStack* mainThread(const flare::v1::StackDump& d) {
  for (const ThreadStack& t : d.threads()) {
    if (t.main_thread()) return &t;
  }
  return d.threads_size() ? &d.threads(0) : nullptr;
}

std::string compactRanges(std::vector<int> ranks) {
  ranks = sortedUnique(std::move(ranks));
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += '-' + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace {

bool isComputeKind(const std::string& kind) {
  return kind == "kernel" || kind == "gemm" || kind == "attention";
}
bool isCommunicationKind(const std::string& kind) {
  return kind == "collective" || kind == "p2p";
}

// Rule 6: among several suspects, the watchdog reports separate the rank whose longest-stuck op
// is a compute kernel from the partners whose longest-stuck op is a collective (they wait for
// it; the kernels queued behind their collective are younger).
void applyWatchdog(const std::vector<const RankEvidence*>& ranks, Diagnosis& d) {
  if (d.suspects.size() < 2) return;
  std::unordered_map<int, const RankEvidence*> by_rank;
  for (const RankEvidence* e : ranks) by_rank[e->rank] = e;
  std::vector<Suspect> culprits;
  std::vector<int> waiting;
  std::string culprit_ops;
  for (const Suspect& s : d.suspects) {
    auto it = by_rank.find(s.rank);
    if (it == by_rank.end() || it->second->stuck.empty()) return;  // no report: cannot clear
    // The op stuck longest: a kernel queued behind a stuck collective (a stream waiting on the
    // collective's event) is younger than it, and so is a collective waiting for a stuck kernel.
    const auto& stuck = it->second->stuck;
    const auto oldest =
        std::max_element(stuck.begin(), stuck.end(),
                         [](const auto& a, const auto& b) { return a.age_ns() < b.age_ns(); });
    if (isComputeKind(oldest->kind())) {
      Suspect c = s;
      char age[48];
      std::snprintf(age, sizeof(age), " for %.1f s", static_cast<double>(oldest->age_ns()) / 1e9);
      c.reason += "; its watchdog: " + oldest->kind() + " " + oldest->name() + " stuck" + age;
      culprit_ops +=
          (culprit_ops.empty() ? "" : ", ") + std::to_string(s.rank) + ": " + oldest->name();
      culprits.push_back(std::move(c));
    } else if (isCommunicationKind(oldest->kind())) {
      waiting.push_back(s.rank);
    } else {
      return;  // stuck in something else first (a copy, a graph): not cleared
    }
  }
  if (culprits.empty() || waiting.empty()) return;
  d.suspects = std::move(culprits);
  d.victims = sortedUnique(std::move(waiting));
  d.evidence.push_back(
      "watchdogs: ranks " + compactRanges(d.victims) +
      " are stuck in a collective first, waiting for the compute kernel stuck on " + culprit_ops +
      ": victims, not culprits");
}

}  // namespace

Diagnosis analyze(std::span<const RankEvidence> input) {
  Diagnosis d;
  // Ranks in ascending order, first entry of a duplicate wins.
  std::vector<const RankEvidence*> ranks;
  ranks.reserve(input.size());
  for (const RankEvidence& e : input) ranks.push_back(&e);
  std::stable_sort(ranks.begin(), ranks.end(),
                   [](const RankEvidence* a, const RankEvidence* b) { return a->rank < b->rank; });
  {
    std::vector<const RankEvidence*> unique;
    unique.reserve(ranks.size());
    for (const RankEvidence* e : ranks) {
      if (!unique.empty() && unique.back()->rank == e->rank) {
        d.duplicate_ranks++;
        continue;
      }
      unique.push_back(e);
    }
    ranks.swap(unique);
  }
  std::unordered_map<int, const RankEvidence*> by_rank;
  by_rank.reserve(ranks.size() * 2);
  for (const RankEvidence* e : ranks) by_rank[e->rank] = e;

  // Stacks: classify and group the answering ranks.
  std::vector<int> in_comm, outside;
  std::unordered_map<uint64_t, size_t> group_of;
  for (const RankEvidence* e : ranks) {
    if (e->state != Responsiveness::kAnswered) {
      d.unresponsive.push_back(e->rank);
      continue;
    }
    const ThreadStack* t = mainThread(e->stacks);
    const bool comm = t && classifyThread(*t) == kComm;
    if (!t || (t->python_frames_size() == 0 && t->native_frames_size() == 0)) {
      // The rank answered but its main thread's stack is unknown (it did not answer the
      // signal): neither inside nor outside communication.
      d.unknown_stack.push_back(e->rank);
    } else {
      (comm ? in_comm : outside).push_back(e->rank);
    }
    const uint64_t sig = signature(t);
    auto [it, added] = group_of.try_emplace(sig, d.groups.size());
    if (added) {
      StackGroup g;
      g.signature = sig;
      g.in_communication = comm;
      g.frames = representativeFrames(t);
      d.groups.push_back(std::move(g));
    }
    d.groups[it->second].ranks.push_back(e->rank);
  }
  std::stable_sort(d.groups.begin(), d.groups.end(), [](const StackGroup& a, const StackGroup& b) {
    return a.ranks.size() > b.ranks.size();
  });
  for (StackGroup& g : d.groups) g.ranges = compactRanges(g.ranks);

  // Collective progress: the lagging collective of every communicator.
  struct Progress {
    int rank;
    uint64_t issued, completed;
    const std::string* op;
  };
  std::map<std::string, std::vector<Progress>> comms;
  for (const RankEvidence* e : ranks) {
    for (const auto& c : e->stacks.collectives()) {
      comms[c.communicator()].push_back(
          {e->rank, c.last_issued_seq(), c.last_completed_seq(), &c.last_issued_op()});
    }
  }
  for (const auto& [name, progress] : comms) {
    std::map<std::pair<uint64_t, uint64_t>, size_t> index;
    const size_t first = d.progress.size();
    for (const Progress& p : progress) {  // ranks ascending
      auto [it, added] = index.try_emplace({p.issued, p.completed}, d.progress.size());
      if (added) {
        ProgressGroup g;
        g.communicator = name;
        g.last_issued_seq = p.issued;
        g.last_completed_seq = p.completed;
        g.last_issued_op = *p.op;
        d.progress.push_back(std::move(g));
      }
      d.progress[it->second].ranks.push_back(p.rank);
    }
    std::sort(d.progress.begin() + first, d.progress.end(),
              [](const ProgressGroup& a, const ProgressGroup& b) {
                return a.last_issued_seq != b.last_issued_seq
                           ? a.last_issued_seq < b.last_issued_seq
                           : a.last_completed_seq < b.last_completed_seq;
              });
  }
  for (ProgressGroup& g : d.progress) g.ranges = compactRanges(g.ranks);
  std::vector<int> not_issued;
  for (const auto& [name, progress] : comms) {
    uint64_t min_completed = UINT64_MAX, max_issued = 0;
    for (const Progress& p : progress) {
      min_completed = std::min(min_completed, p.completed);
      max_issued = std::max(max_issued, p.issued);
    }
    const uint64_t seq = min_completed + 1;
    if (max_issued < seq) continue;  // every issued collective completed everywhere
    LaggingCollective l;
    l.communicator = name;
    l.seq = seq;
    for (const Progress& p : progress) {
      if (p.issued < seq) {
        l.not_issued.push_back(p.rank);
      } else if (p.completed < seq) {
        l.waiting.push_back(p.rank);
        if (l.op.empty() && p.issued == seq) l.op = *p.op;
      }
    }
    not_issued.insert(not_issued.end(), l.not_issued.begin(), l.not_issued.end());
    d.evidence.push_back(
        "communicator " + name + ": collective #" + std::to_string(seq) +
        (l.op.empty() ? "" : " (" + l.op + ")") + " waited on by ranks " +
        compactRanges(l.waiting) +
        (l.not_issued.empty() ? "" : "; never issued by ranks " + compactRanges(l.not_issued)));
    d.lagging.push_back(std::move(l));
  }
  not_issued = sortedUnique(std::move(not_issued));
  // A rank that never issued one communicator's collective while it waits in another's (issued,
  // not completed) is blocked by that one (its host waits there), not a culprit: e.g. with
  // tensor and data parallelism, the ranks of a data-parallel group hung on one link never
  // issue the next tensor-parallel all-reduce their partners wait in.
  {
    std::vector<int> waiting_somewhere;
    for (const LaggingCollective& l : d.lagging) {
      waiting_somewhere.insert(waiting_somewhere.end(), l.waiting.begin(), l.waiting.end());
    }
    waiting_somewhere = sortedUnique(std::move(waiting_somewhere));
    std::vector<int> blocked, free;
    for (int r : not_issued) {
      (std::binary_search(waiting_somewhere.begin(), waiting_somewhere.end(), r) ? blocked : free)
          .push_back(r);
    }
    if (!blocked.empty()) {
      d.evidence.push_back("ranks " + compactRanges(blocked) +
                           " never issued a collective but wait in another communicator's: "
                           "blocked, not culprits");
    }
    not_issued = std::move(free);
  }

  auto addSuspects = [&](const std::vector<int>& rs, const std::string& reason) {
    for (int r : rs) d.suspects.push_back(makeSuspect(*by_rank.at(r), reason));
  };

  if (!d.unresponsive.empty()) {
    d.evidence.push_back("ranks " + compactRanges(d.unresponsive) + " did not answer");
    if (d.unresponsive.size() == ranks.size()) {
      d.kind = HangKind::kInconclusive;
      d.evidence.push_back("no rank answered: nothing to compare");
      return d;
    }
    d.kind = HangKind::kUnresponsiveRank;
    for (int r : d.unresponsive) {
      const RankEvidence& e = *by_rank.at(r);
      d.suspects.push_back(makeSuspect(
          e, std::string(responsivenessName(e.state)) + (e.why.empty() ? "" : ": " + e.why)));
    }
    return d;
  }
  if (ranks.empty()) {
    d.evidence.push_back("no evidence");
    return d;
  }

  if (!d.unknown_stack.empty()) {
    d.evidence.push_back("ranks " + compactRanges(d.unknown_stack) +
                         ": main thread stack unknown (did not answer the capture)");
  }
  if (!in_comm.empty()) {
    d.evidence.push_back("ranks " + compactRanges(in_comm) + " wait inside communication");
  }
  if (!outside.empty()) {
    // The stacks are the host's; NCCL is asynchronous, so a rank whose host is outside
    // communication may still have collectives in flight on its GPU (the counters above). Said
    // so, so that this line does not read as contradicting "waited on by".
    const std::vector<int> sorted_outside = sortedUnique(outside);
    std::vector<int> in_flight;
    for (const LaggingCollective& l : d.lagging) {
      for (int r : l.waiting) {
        if (std::binary_search(sorted_outside.begin(), sorted_outside.end(), r))
          in_flight.push_back(r);
      }
    }
    in_flight = sortedUnique(std::move(in_flight));
    d.evidence.push_back(
        "ranks " + compactRanges(outside) + ": main-thread stacks outside communication calls" +
        (in_flight.empty() ? std::string()
                           : " (ranks " + compactRanges(in_flight) +
                                 " still wait in a collective on their GPUs: NCCL runs "
                                 "asynchronously, the host waits elsewhere)"));
  }

  if (in_comm.empty() && outside.empty() && not_issued.empty()) {
    d.kind = HangKind::kInconclusive;
    d.evidence.push_back("no main thread stack was captured");
    return d;
  }
  // Rule 4a: the stacks show no rank inside communication (NCCL runs asynchronously: ranks
  // typically wait in a later synchronization such as loss.item()), but the counters show every
  // rank issued the lagging collective of each communicator and none completed it: the GPUs
  // wait in it, so it is treated as a communication wait (and may need an inspection).
  bool counters_wait = false;
  if (in_comm.empty() && !outside.empty() && not_issued.empty() && !d.lagging.empty()) {
    std::vector<int> waiting;
    for (const LaggingCollective& l : d.lagging) {
      waiting.insert(waiting.end(), l.waiting.begin(), l.waiting.end());
    }
    waiting = sortedUnique(std::move(waiting));
    counters_wait = std::includes(waiting.begin(), waiting.end(), outside.begin(), outside.end());
    if (counters_wait) {
      d.evidence.push_back(
          "every rank issued the lagging collective and none completed it: "
          "the GPUs wait in communication");
    }
  }
  if ((outside.empty() || counters_wait) && not_issued.empty()) {
    d.kind = HangKind::kCommunication;
    const JoinInput join = translateConnections(ranks, d);
    joinConnections(join, d);
    if (d.link) {
      const RankEvidence* s = by_rank.count(d.link->sender) ? by_rank.at(d.link->sender) : nullptr;
      const RankEvidence* r =
          by_rank.count(d.link->receiver) ? by_rank.at(d.link->receiver) : nullptr;
      const std::string why = "end of the slowest connection " + std::to_string(d.link->sender) +
                              " -> " + std::to_string(d.link->receiver);
      std::vector<Suspect> ends;
      if (s)
        ends.push_back(makeSuspect(*s, why));
      else
        ends.push_back(Suspect{d.link->sender, "", "", -1, why});
      if (r)
        ends.push_back(makeSuspect(*r, why));
      else
        ends.push_back(Suspect{d.link->receiver, "", "", -1, why});
      d.suspects = std::move(ends);
    } else {
      bool any_inspected = std::any_of(ranks.begin(), ranks.end(),
                                       [](const RankEvidence* e) { return e->inspected; });
      d.needs_inspection = !any_inspected;
      std::vector<int> absent = any_inspected ? neverArrived(join) : std::vector<int>{};
      if (!absent.empty() && absent.size() < ranks.size()) {
        d.kind = HangKind::kNonCommunication;
        d.evidence.push_back("ranks " + compactRanges(absent) +
                             ": every connection at step 0 while the others moved");
        // Of those, a rank whose inspection found a collective kernel running (it reported
        // connections: its GPU waits in the collective, at step 0 for want of its peer) waits
        // for one whose GPU is not in a collective kernel at all (no connection reported): when
        // both kinds are there, the first are victims, the second the culprits.
        std::vector<int> in_kernel, outside_kernel;
        for (int r : absent) {
          auto it = by_rank.find(r);
          if (it == by_rank.end()) continue;
          (it->second->connections.empty() ? outside_kernel : in_kernel).push_back(r);
        }
        if (!in_kernel.empty() && !outside_kernel.empty()) {
          d.victims = in_kernel;
          absent = outside_kernel;
          d.evidence.push_back("ranks " + compactRanges(in_kernel) +
                               ": their GPUs wait in a collective kernel for ranks " +
                               compactRanges(outside_kernel) +
                               ", whose GPUs run no collective kernel: victims, not culprits");
        }
        for (int r : absent) {
          if (by_rank.count(r)) {
            d.suspects.push_back(makeSuspect(*by_rank.at(r),
                                             "its GPU never reached the collective the others "
                                             "wait in (all its connections at step 0)"));
          }
        }
      }
    }
  } else if (in_comm.empty()) {
    // Nobody waits in communication: the stacks point at no one.
    if (not_issued.empty()) {
      d.kind = HangKind::kInconclusive;
      d.evidence.push_back("no rank waits in communication and every rank issued every collective");
    } else {
      d.kind = HangKind::kNonCommunication;
      addSuspects(not_issued, "never issued the collective the others wait in");
    }
  } else if (!outside.empty() && !not_issued.empty()) {
    std::vector<int> both;
    std::set_intersection(outside.begin(), outside.end(), not_issued.begin(), not_issued.end(),
                          std::back_inserter(both));
    if (both.empty()) {
      d.kind = HangKind::kInconclusive;
      d.evidence.push_back("contradiction: the stacks point at ranks " + compactRanges(outside) +
                           ", the collective counters at ranks " + compactRanges(not_issued));
    } else {
      d.kind = HangKind::kNonCommunication;
      addSuspects(both, "outside communication and never issued the collective the others wait in");
    }
  } else if (!outside.empty()) {
    d.kind = HangKind::kNonCommunication;
    addSuspects(outside, "outside communication while the others wait in a collective");
  } else {
    d.kind = HangKind::kNonCommunication;
    addSuspects(not_issued, "never issued the collective the others wait in");
  }
  applyWatchdog(ranks, d);
  return d;
}

std::string formatDiagnosis(const Diagnosis& d, size_t max_frames) {
  std::string out = std::string(hangKindName(d.kind));
  if (!d.suspects.empty()) {
    out += ": suspects";
    for (const Suspect& s : d.suspects) {
      out += " rank " + std::to_string(s.rank);
      if (!s.host.empty()) out += " on " + s.host;
      if (s.gpu_index >= 0) out += " GPU " + std::to_string(s.gpu_index);
      if (!s.gpu_uuid.empty()) out += " (" + s.gpu_uuid + ")";
      out += ";";
    }
  }
  out += '\n';
  for (const Suspect& s : d.suspects) {
    out += "  rank " + std::to_string(s.rank) + ": " + s.reason + '\n';
  }
  if (!d.victims.empty()) {
    out +=
        "  victims (wait for the suspects, not at fault): ranks " + compactRanges(d.victims) + '\n';
  }
  if (d.needs_inspection) out += "  needs inspection of the NCCL kernels (cuda-gdb)\n";
  for (const std::string& e : d.evidence) out += "  " + e + '\n';
  for (const ProgressGroup& g : d.progress) {
    out += "  " + g.communicator + ": issued #" + std::to_string(g.last_issued_seq) +
           (g.last_issued_op.empty() ? "" : " (" + g.last_issued_op + ")") + ", completed #" +
           std::to_string(g.last_completed_seq) + ": ranks " + g.ranges + '\n';
  }
  for (const StackGroup& g : d.groups) {
    out += "  ranks " + g.ranges + (g.in_communication ? " [communication]" : "") + ":\n";
    for (size_t i = 0; i < g.frames.size() && i < max_frames; ++i) {
      out += "    " + g.frames[i] + '\n';
    }
    if (g.frames.size() > max_frames) {
      out += "    ... " + std::to_string(g.frames.size() - max_frames) + " more\n";
    }
  }
  return out;
}

}  // namespace flare::hang
