// The simulated NCCL (libnccl.so.2): communicators whose collectives rendezvous across
// processes through POSIX shared memory.
//
// A communicator is a shared-memory segment named from its unique id. Each collective gets a
// per-communicator sequence number when it is called (the order NCCL requires every rank to
// follow). When a rank's stream reaches the collective, the rank publishes its arrival time
// for that sequence number and waits (futex on a shared generation word, never spinning)
// until every rank has arrived. The kernel then ends at
//     max(arrival times) + latency + S·f / (busbw · min(link factor of the ranks)),
// with S and f the nccl-tests definitions, so a late rank delays all the others and a slow
// link slows the whole ring. Send/recv rendezvous pairwise. A group (ncclGroupStart/End) is
// one kernel per communicator that completes when all its parts have. No data moves: the
// simulator models time, not values. flareSimNcclConnectionSteps (flare_sim_nccl.h) models the
// per-connection ring step counters of the in-flight collective for the hang tests.
//
// Segment layout (sizes depend on nranks; all fields are naturally aligned atomics):
//   Header | RankSlot[nranks] | PairSlot[nranks * nranks] (index sender*nranks + receiver)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "src/sim/flare_sim.h"
#include "src/sim/flare_sim_nccl.h"

#define SIM_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr uint64_t kMagic = 0x464c415245534e31ull;  // "FLARESN1"
constexpr int kRing = 16;                           // arrival-time ring per sequence number
constexpr int kMaxRanks = 4096;
constexpr int64_t kLatencyNs = 8000;  // per collective, before bandwidth

struct Header {
  std::atomic<uint64_t> magic;
  int32_t nranks;
  std::atomic<int32_t> joined;
  std::atomic<uint32_t> generation;  // futex word: bumped on every arrival
  std::atomic<int64_t> hang_seq;     // injected fault: the collective that never completes
  std::atomic<int32_t> hang_rank;    // the rank that injected it (its ring link stalls)
};

struct RankSlot {
  std::atomic<uint64_t> coll_seq;  // last collective this rank arrived at
  std::atomic<int64_t> arrive_ns[kRing];
  std::atomic<uint64_t> link_factor_bits;
  std::atomic<int32_t> pid;
};

struct PairSlot {  // traffic from one sender to one receiver
  std::atomic<uint64_t> send_seq, recv_seq;
  std::atomic<int64_t> send_ns[kRing], recv_ns[kRing];
};

size_t segmentSize(int n) {
  return sizeof(Header) + sizeof(RankSlot) * n + sizeof(PairSlot) * size_t(n) * n;
}

struct UniqueIdLayout {
  char tag[16];   // "flare-sim-nccl"
  char name[64];  // shared-memory segment name
};
static_assert(sizeof(UniqueIdLayout) <= NCCL_UNIQUE_ID_BYTES);

thread_local ncclResult_t t_last_result = ncclSuccess;

size_t typeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

}  // namespace

struct ncclComm {
  int rank = 0;
  int nranks = 0;
  int device = 0;
  Header* header = nullptr;
  size_t map_bytes = 0;
  std::string shm_name;
  uint64_t noise_key = 0;  // the same on every member: keys the noise's per-collective draw
  std::atomic<bool> aborted{false};
  std::mutex mu;
  uint64_t next_seq = 0;                // guarded by mu: collectives called so far
  std::vector<uint64_t> next_send_seq;  // guarded by mu: per peer
  std::vector<uint64_t> next_recv_seq;  // guarded by mu: per peer
  // The last collective the stream worker reached (0: none), for flareSimNcclConnectionSteps,
  // which treats it as in flight until its modelled end.
  std::atomic<uint64_t> inflight_seq{0};
  std::atomic<uint64_t> inflight_bytes{0};
  std::atomic<double> inflight_factor{1.0};

  RankSlot* slot(int r) {
    return reinterpret_cast<RankSlot*>(reinterpret_cast<char*>(header) + sizeof(Header)) + r;
  }
  PairSlot* pair(int sender, int receiver) {
    auto* base = reinterpret_cast<char*>(header) + sizeof(Header) + sizeof(RankSlot) * nranks;
    return reinterpret_cast<PairSlot*>(base) + size_t(sender) * nranks + receiver;
  }
  double linkFactor(int r) {
    uint64_t bits = slot(r)->link_factor_bits.load();
    double f;
    std::memcpy(&f, &bits, sizeof(f));
    return f > 0 ? f : 1.0;
  }
};

namespace {

// One part of a (possibly grouped) NCCL call.
struct Part {
  enum Kind { kCollective, kSend, kRecv } kind;
  double factor = 1.0;  // nccl-tests bus factor
  size_t bytes = 0;     // S
  int peer = -1;
  uint64_t seq = 0;   // collective seq, or per-pair seq for p2p
  bool hang = false;  // injected: this collective never completes
};

struct GroupOp {
  ncclComm* comm;
  std::vector<Part> parts;
};

bool stop(ncclComm* c) {
  return flareSimShuttingDown() || c->aborted.load();
}

// Waits until pred() holds, sleeping on the communicator's generation word.
template <typename Pred>
bool waitFor(ncclComm* c, Pred pred) {
  for (;;) {
    uint32_t gen = c->header->generation.load(std::memory_order_acquire);
    if (pred()) return true;
    if (stop(c)) return false;
    flareSimWaitWord(reinterpret_cast<volatile uint32_t*>(&c->header->generation), gen,
                     100'000'000);
  }
}

void bump(ncclComm* c) {
  c->header->generation.fetch_add(1, std::memory_order_acq_rel);
  flareSimWakeWord(reinterpret_cast<volatile uint32_t*>(&c->header->generation));
}

int64_t transferNs(double bytes, double factor, double link) {
  const double gbps = flareSimSetting("busbw_gbps") * link;
  return static_cast<int64_t>((kLatencyNs + bytes * factor / (gbps * 1e9) * 1e9) *
                              flareSimSetting("time_scale"));
}

// Collective `seq` of `c` once its last member has arrived: the transfer at the slowest member's
// link, times the noise's draw for the instance (the same on every member).
int64_t collectiveNs(ncclComm* c, uint64_t seq, double bytes, double factor, double link) {
  return static_cast<int64_t>(double(transferNs(bytes, factor, link)) *
                              flareSimCollectiveFactor(c->noise_key, seq));
}

// Runs on the stream worker when the stream reaches the group: arrive everywhere, then wait.
int64_t runGroup(void* ctx, int64_t start) {
  auto* g = static_cast<GroupOp*>(ctx);
  ncclComm* c = g->comm;
  const int me = c->rank;
  for (const Part& p : g->parts) {
    if (p.kind == Part::kCollective) {
      c->slot(me)->arrive_ns[p.seq % kRing].store(start);
      c->slot(me)->coll_seq.store(p.seq, std::memory_order_release);
    } else if (p.kind == Part::kSend) {
      PairSlot* ps = c->pair(me, p.peer);
      ps->send_ns[p.seq % kRing].store(start);
      ps->send_seq.store(p.seq, std::memory_order_release);
    } else {
      PairSlot* ps = c->pair(p.peer, me);
      ps->recv_ns[p.seq % kRing].store(start);
      ps->recv_seq.store(p.seq, std::memory_order_release);
    }
  }
  bump(c);
  int64_t end = start;
  for (const Part& p : g->parts) {
    if (p.kind == Part::kCollective) {
      c->inflight_bytes.store(p.bytes, std::memory_order_relaxed);
      c->inflight_factor.store(p.factor, std::memory_order_relaxed);
      c->inflight_seq.store(p.seq, std::memory_order_release);
      if (p.hang || c->header->hang_seq.load() == static_cast<int64_t>(p.seq)) {
        waitFor(c, [] { return false; });  // never completes; returns at exit or abort
        return start;
      }
      bool ok = waitFor(c, [&] {
        if (c->header->hang_seq.load() == static_cast<int64_t>(p.seq)) return false;
        for (int r = 0; r < c->nranks; ++r) {
          if (c->slot(r)->coll_seq.load(std::memory_order_acquire) < p.seq) return false;
        }
        return true;
      });
      if (!ok) return start;
      int64_t last = start;
      double link = 1.0;
      for (int r = 0; r < c->nranks; ++r) {
        last = std::max(last, c->slot(r)->arrive_ns[p.seq % kRing].load());
        link = std::min(link, c->linkFactor(r));
      }
      end = std::max(end, last + collectiveNs(c, p.seq, double(p.bytes), p.factor, link));
    } else {
      const bool send = p.kind == Part::kSend;
      PairSlot* ps = send ? c->pair(me, p.peer) : c->pair(p.peer, me);
      bool ok = waitFor(c, [&] {
        return (send ? ps->recv_seq : ps->send_seq).load(std::memory_order_acquire) >= p.seq;
      });
      if (!ok) return start;
      int64_t other = (send ? ps->recv_ns : ps->send_ns)[p.seq % kRing].load();
      double link = std::min(c->linkFactor(me), c->linkFactor(p.peer));
      end = std::max(end, std::max(start, other) + transferNs(double(p.bytes), 1.0, link));
    }
  }
  return end;
}

// Grouping state of the calling thread (ncclGroupStart/End nest).
struct PendingGroup {
  int depth = 0;
  std::vector<std::pair<GroupOp*, cudaStream_t>> ops;  // one per communicator
};
thread_local PendingGroup t_group;

ncclResult_t submit(GroupOp* op, cudaStream_t stream) {
  const char* name = "ncclDevKernel_Generic_sim";
  if (op->parts.size() == 1) {
    switch (op->parts[0].kind) {
      case Part::kSend:
        name = "ncclDevKernel_SendRecv_sim";
        break;
      case Part::kRecv:
        name = "ncclDevKernel_SendRecv_sim";
        break;
      default:
        name = "ncclDevKernel_Collective_sim";
        break;
    }
  }
  CUresult r = flareSimEnqueueOp(reinterpret_cast<CUstream>(stream), name, runGroup, op,
                                 [](void* p) { delete static_cast<GroupOp*>(p); });
  return r == CUDA_SUCCESS ? ncclSuccess : ncclInvalidUsage;
}

ncclResult_t add(ncclComm* comm, Part part, cudaStream_t stream) {
  if (!comm || !comm->header) return ncclInvalidArgument;
  if (comm->aborted) return ncclInvalidUsage;
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    if (part.kind == Part::kCollective) {
      part.seq = ++comm->next_seq;
      const int64_t hang = flareSimHangStep("collective");
      const int64_t hang_nranks = flareSimHangStep("collective_nranks");
      if (hang >= 0 && flareSimStep() >= hang &&
          (hang_nranks <= 0 || hang_nranks == comm->nranks)) {
        static std::atomic<bool> fired{false};
        if (!fired.exchange(true)) {
          part.hang = true;
          comm->header->hang_rank.store(comm->rank);
          comm->header->hang_seq.store(static_cast<int64_t>(part.seq));
          bump(comm);
        }
      }
    } else {
      if (part.peer < 0 || part.peer >= comm->nranks) return ncclInvalidArgument;
      auto& counters = part.kind == Part::kSend ? comm->next_send_seq : comm->next_recv_seq;
      part.seq = ++counters[part.peer];
    }
  }
  auto& pending = t_group.ops;
  auto it = std::find_if(pending.begin(), pending.end(),
                         [comm](const auto& e) { return e.first->comm == comm; });
  if (it == pending.end()) {
    pending.push_back({new GroupOp{comm, {}}, stream});
    it = pending.end() - 1;
  }
  it->first->parts.push_back(part);
  if (t_group.depth > 0) return ncclSuccess;
  auto [op, s] = pending.back();
  pending.clear();
  return submit(op, s);
}

Part collective(size_t bytes, double factor) {
  Part p;
  p.kind = Part::kCollective;
  p.bytes = bytes;
  p.factor = factor;
  return p;
}

ncclResult_t setLast(ncclResult_t r) {
  if (r != ncclSuccess) t_last_result = r;
  return r;
}

// All-gather, reduce-scatter and all-to-all: `count` elements per rank, S = count·n, f = (n-1)/n.
ncclResult_t perRankCollective(size_t count, ncclDataType_t type, ncclComm_t comm,
                               cudaStream_t stream) {
  if (!comm || !typeBytes(type)) return setLast(ncclInvalidArgument);
  const double n = comm->nranks;
  return setLast(
      add(comm, collective(count * typeBytes(type) * comm->nranks, (n - 1) / n), stream));
}

}  // namespace

// ---- implementation (pnccl*), with nccl* as weak aliases like the real library ----

#define NCCL_ALIAS(name) __attribute__((weak, alias("p" #name)))

SIM_API ncclResult_t pncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

SIM_API ncclResult_t pncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::memset(id, 0, sizeof(*id));
  auto* u = reinterpret_cast<UniqueIdLayout*>(id->internal);
  std::snprintf(u->tag, sizeof(u->tag), "flare-sim-nccl");
  std::random_device rd;
  const char* run = getenv("FLARE_SIM_RUN_ID");
  std::snprintf(u->name, sizeof(u->name), "/flare-nccl-%s-%08x%08x", run ? run : "x", rd(), rd());
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (!out || nranks <= 0 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
    return setLast(ncclInvalidArgument);
  }
  const auto* u = reinterpret_cast<const UniqueIdLayout*>(id.internal);
  if (std::strncmp(u->tag, "flare-sim-nccl", sizeof(u->tag)) != 0) {
    return setLast(ncclInvalidArgument);
  }
  std::string name(u->name, strnlen(u->name, sizeof(u->name)));
  const size_t bytes = segmentSize(nranks);
  bool creator = false;
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) {
    creator = true;
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return setLast(ncclSystemError);
    }
  } else {
    // Another rank creates it: wait for the segment (up to 60 s, like a bootstrap timeout).
    for (int i = 0; i < 60000 && fd < 0; ++i) {
      fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0) usleep(1000);
    }
    if (fd < 0) return setLast(ncclSystemError);
  }
  void* mem = MAP_FAILED;
  for (int i = 0; i < 60000; ++i) {  // the creator may not have sized it yet
    struct stat st;
    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes) {
      mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      break;
    }
    usleep(1000);
  }
  close(fd);
  if (mem == MAP_FAILED) return setLast(ncclSystemError);
  auto* h = static_cast<Header*>(mem);
  if (creator) {
    h->nranks = nranks;
    h->hang_seq.store(-1);
    h->hang_rank.store(-1);
    h->magic.store(kMagic, std::memory_order_release);
  } else {
    for (int i = 0; i < 60000 && h->magic.load(std::memory_order_acquire) != kMagic; ++i) {
      usleep(1000);
    }
    if (h->magic.load() != kMagic || h->nranks != nranks) {
      munmap(mem, bytes);
      return setLast(ncclInvalidUsage);
    }
  }
  auto* c = new ncclComm();
  c->rank = rank;
  c->nranks = nranks;
  cudaGetDevice(&c->device);
  c->header = h;
  c->map_bytes = bytes;
  c->shm_name = name;
  c->noise_key = flareSimNameKey(name.c_str());
  c->next_send_seq.assign(nranks, 0);
  c->next_recv_seq.assign(nranks, 0);
  double link = flareSimLinkFactor();
  uint64_t bits;
  std::memcpy(&bits, &link, sizeof(bits));
  c->slot(rank)->link_factor_bits.store(bits);
  c->slot(rank)->pid.store(getpid());
  // The last rank to join removes the name; the mapping stays valid for everyone.
  if (h->joined.fetch_add(1) + 1 == nranks) shm_unlink(name.c_str());
  bump(c);
  *out = c;
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                             int rank, ncclConfig_t* config) {
  return pncclCommInitRank(comm, nranks, id, rank);
}

SIM_API ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev <= 0) return setLast(ncclInvalidArgument);
  ncclUniqueId id;
  pncclGetUniqueId(&id);
  for (int i = 0; i < ndev; ++i) {
    ncclResult_t r = pncclCommInitRank(&comms[i], ndev, id, i);
    if (r != ncclSuccess) return r;
    comms[i]->device = devlist ? devlist[i] : i;
  }
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return comm ? ncclSuccess : ncclInvalidArgument;
}

SIM_API ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  // Queued collectives may still reference the communicator: keep it mapped. Communicators
  // are few and live as long as the job in practice.
  comm->aborted = false;
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  comm->aborted = true;  // blocked collectives of this rank return
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

SIM_API ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!comm || !error) return ncclInvalidArgument;
  *error = ncclSuccess;
  return ncclSuccess;
}

SIM_API const char* pncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

SIM_API const char* pncclGetLastError(ncclComm_t comm) {
  return t_last_result == ncclSuccess ? "" : pncclGetErrorString(t_last_result);
}

SIM_API ncclResult_t pncclGroupStart() {
  t_group.depth++;
  return ncclSuccess;
}

SIM_API ncclResult_t pncclGroupEnd() {
  if (t_group.depth == 0) return setLast(ncclInvalidUsage);
  if (--t_group.depth > 0) return ncclSuccess;
  auto ops = std::move(t_group.ops);
  t_group.ops.clear();
  ncclResult_t result = ncclSuccess;
  for (auto& [op, stream] : ops) {
    ncclResult_t r = submit(op, stream);
    if (r != ncclSuccess) result = r;
  }
  return setLast(result);
}

SIM_API ncclResult_t pncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || !typeBytes(type)) return setLast(ncclInvalidArgument);
  const double n = comm->nranks;
  return setLast(add(comm, collective(count * typeBytes(type), 2 * (n - 1) / n), stream));
}

SIM_API ncclResult_t pncclAllGather(const void* send, void* recv, size_t sendcount,
                                    ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  return perRankCollective(sendcount, type, comm, stream);
}

SIM_API ncclResult_t pncclReduceScatter(const void* send, void* recv, size_t recvcount,
                                        ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  return perRankCollective(recvcount, type, comm, stream);
}

SIM_API ncclResult_t pncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t type,
                                   ncclComm_t comm, cudaStream_t stream) {
  return perRankCollective(count, type, comm, stream);
}

SIM_API ncclResult_t pncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                                    int root, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || !typeBytes(type) || root < 0 || root >= comm->nranks) {
    return setLast(ncclInvalidArgument);
  }
  return setLast(add(comm, collective(count * typeBytes(type), 1.0), stream));
}

SIM_API ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t type, int root,
                                ncclComm_t comm, cudaStream_t stream) {
  return pncclBroadcast(buff, buff, count, type, root, comm, stream);
}

SIM_API ncclResult_t pncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || !typeBytes(type) || root < 0 || root >= comm->nranks) {
    return setLast(ncclInvalidArgument);
  }
  return setLast(add(comm, collective(count * typeBytes(type), 1.0), stream));
}

SIM_API ncclResult_t pncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  if (!comm || !typeBytes(type)) return setLast(ncclInvalidArgument);
  Part p;
  p.kind = Part::kSend;
  p.peer = peer;
  p.bytes = count * typeBytes(type);
  return setLast(add(comm, p, stream));
}

SIM_API ncclResult_t pncclRecv(void* recv, size_t count, ncclDataType_t type, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  if (!comm || !typeBytes(type)) return setLast(ncclInvalidArgument);
  Part p;
  p.kind = Part::kRecv;
  p.peer = peer;
  p.bytes = count * typeBytes(type);
  return setLast(add(comm, p, stream));
}

// ---- private API (flare_sim_nccl.h) ----

SIM_API int flareSimNcclConnectionSteps(ncclComm_t comm, FlareSimConnStep* out, int max,
                                        uint64_t* seq_out) {
  if (!comm || !comm->header || max < 0 || (max > 0 && !out)) return -1;
  const uint64_t seq = comm->inflight_seq.load(std::memory_order_acquire);
  if (seq_out) *seq_out = seq;
  const int n = comm->nranks;
  if (seq == 0 || n < 2) return 0;
  constexpr uint64_t kBuffer = 8;  // slices one connection buffers (NCCL_STEPS)
  const uint64_t total = 16 * uint64_t(n - 1);
  const uint64_t stall = 4 * uint64_t(n - 1);
  bool all = true;
  int64_t last = 0;
  double link = 1.0;
  auto arrived = [&](int r) {
    return comm->slot(r)->coll_seq.load(std::memory_order_acquire) >= seq;
  };
  for (int r = 0; r < n; ++r) {
    if (!arrived(r)) {
      all = false;
      continue;
    }
    last = std::max(last, comm->slot(r)->arrive_ns[seq % kRing].load());
    link = std::min(link, comm->linkFactor(r));
  }
  const bool hang = comm->header->hang_seq.load() == static_cast<int64_t>(seq);
  const int hung = comm->header->hang_rank.load();
  uint64_t progress = total;
  if (all && !hang) {
    const double dur = double(collectiveNs(comm, seq, double(comm->inflight_bytes.load()),
                                           comm->inflight_factor.load(), link));
    const double frac = dur > 0 ? double(flareSimNowNs() - last) / dur : 1.0;
    if (frac >= 1.0) return 0;  // completed
    progress = uint64_t(double(total) * std::max(frac, 0.0));
  }
  auto edgeStep = [&](int sender) -> uint64_t {  // the connection sender -> sender + 1
    if (!all) return arrived(sender) && arrived((sender + 1) % n) ? kBuffer : 0;
    if (!hang || hung < 0 || hung >= n) return progress;
    const int k = ((sender - hung) % n + n) % n;
    return std::min(progress, stall + kBuffer * uint64_t(std::min(k, n - k)));
  };
  const int me = comm->rank, next = (me + 1) % n, prev = (me + n - 1) % n;
  int written = 0;
  for (int ch = 0; ch < kFlareSimNcclChannels; ++ch) {
    if (written < max) out[written++] = FlareSimConnStep{ch, next, edgeStep(me), 1};
    if (written < max) out[written++] = FlareSimConnStep{ch, prev, edgeStep(prev), 0};
  }
  return written;
}

// Weak public names, as in the real libnccl.so.2 (tools interpose them; pnccl* stay reachable).
SIM_API ncclResult_t ncclGetVersion(int*) NCCL_ALIAS(ncclGetVersion);
SIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId*) NCCL_ALIAS(ncclGetUniqueId);
SIM_API ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int)
    NCCL_ALIAS(ncclCommInitRank);
SIM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)
    NCCL_ALIAS(ncclCommInitRankConfig);
SIM_API ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*) NCCL_ALIAS(ncclCommInitAll);
SIM_API ncclResult_t ncclCommFinalize(ncclComm_t) NCCL_ALIAS(ncclCommFinalize);
SIM_API ncclResult_t ncclCommDestroy(ncclComm_t) NCCL_ALIAS(ncclCommDestroy);
SIM_API ncclResult_t ncclCommAbort(ncclComm_t) NCCL_ALIAS(ncclCommAbort);
SIM_API ncclResult_t ncclCommCount(const ncclComm_t, int*) NCCL_ALIAS(ncclCommCount);
SIM_API ncclResult_t ncclCommUserRank(const ncclComm_t, int*) NCCL_ALIAS(ncclCommUserRank);
SIM_API ncclResult_t ncclCommCuDevice(const ncclComm_t, int*) NCCL_ALIAS(ncclCommCuDevice);
SIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*)
    NCCL_ALIAS(ncclCommGetAsyncError);
SIM_API const char* ncclGetErrorString(ncclResult_t) NCCL_ALIAS(ncclGetErrorString);
SIM_API const char* ncclGetLastError(ncclComm_t) NCCL_ALIAS(ncclGetLastError);
SIM_API ncclResult_t ncclGroupStart() NCCL_ALIAS(ncclGroupStart);
SIM_API ncclResult_t ncclGroupEnd() NCCL_ALIAS(ncclGroupEnd);
SIM_API ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                   ncclComm_t, cudaStream_t) NCCL_ALIAS(ncclAllReduce);
SIM_API ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                   cudaStream_t) NCCL_ALIAS(ncclAllGather);
SIM_API ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                       ncclComm_t, cudaStream_t) NCCL_ALIAS(ncclReduceScatter);
SIM_API ncclResult_t ncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                  cudaStream_t) NCCL_ALIAS(ncclAlltoAll);
SIM_API ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                                   cudaStream_t) NCCL_ALIAS(ncclBroadcast);
SIM_API ncclResult_t ncclBcast(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    NCCL_ALIAS(ncclBcast);
SIM_API ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int,
                                ncclComm_t, cudaStream_t) NCCL_ALIAS(ncclReduce);
SIM_API ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    NCCL_ALIAS(ncclSend);
SIM_API ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    NCCL_ALIAS(ncclRecv);
