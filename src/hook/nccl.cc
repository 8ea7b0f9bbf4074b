// Interposed NCCL: communicator identity and collectives.
//
// Identity uses only the public API: the hash of the ncclUniqueId a communicator was created
// from is the same on every rank, so it identifies the communicator across the job; each
// communicator keeps its own sequence number of collectives. A group (ncclGroupStart/End) is
// one GPU kernel per communicator: its parts are collected on the calling thread and become one
// record at the outermost ncclGroupEnd, timed around it — never matched by a FIFO that could
// drift.
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/hook/rank_commands.h"
#include "src/hook/real.h"
#include "src/hook/runtime.h"
#include "src/hook/timed.h"

#define FLARE_EXPORT extern "C" __attribute__((visibility("default")))

namespace flare::hook {
namespace {

constexpr const char* kLib = "libnccl.so";

struct CommInfo {
  uint64_t hash = 0;
  int nranks = 0;
  int rank = 0;
  std::atomic<uint64_t> coll_seq{0};
  std::atomic<uint64_t> p2p_seq{0};
  // Hang diagnosis (rank_commands.h): the API of the last collective issued, and the highest
  // collective sequence number the timing layer saw complete on the GPU.
  std::atomic<const char*> last_api{nullptr};
  std::atomic<uint64_t> completed_seq{0};
};

// Communicators are few and long-lived: a map under a mutex, read through a per-thread cache.
struct Comms {
  std::mutex mu;
  std::unordered_map<ncclComm_t, CommInfo*> by_comm;  // guarded by mu; entries never freed
};
Comms& comms() {
  static Comms* c = new Comms();
  return *c;
}

void registerComm(ncclComm_t comm, const ncclUniqueId* id, uint64_t salt, int nranks, int rank) {
  auto* info = new CommInfo();
  info->hash = hashBytes(id ? static_cast<const void*>(id->internal) : &salt,
                         id ? sizeof(id->internal) : sizeof(salt), salt + 1469598103934665603ull);
  info->nranks = nranks;
  info->rank = rank;
  std::lock_guard<std::mutex> lock(comms().mu);
  comms().by_comm[comm] = info;  // a reused address replaces the old entry
}

CommInfo* lookup(ncclComm_t comm) {
  thread_local ncclComm_t last = nullptr;
  thread_local CommInfo* last_info = nullptr;
  if (comm == last && last_info) return last_info;
  std::lock_guard<std::mutex> lock(comms().mu);
  auto it = comms().by_comm.find(comm);
  CommInfo* info = it == comms().by_comm.end() ? nullptr : it->second;
  last = comm;
  last_info = info;
  return info;
}

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

const char* typeName(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return "i8";
    case ncclUint8:
      return "u8";
    case ncclFloat8e4m3:
      return "e4m3";
    case ncclFloat8e5m2:
      return "e5m2";
    case ncclFloat16:
      return "f16";
    case ncclBfloat16:
      return "bf16";
    case ncclInt32:
      return "i32";
    case ncclUint32:
      return "u32";
    case ncclFloat32:
      return "f32";
    case ncclInt64:
      return "i64";
    case ncclUint64:
      return "u64";
    case ncclFloat64:
      return "f64";
    default:
      return "other";
  }
}

// One call, or one part of a group.
struct Part {
  const char* api;
  bool p2p;
  ncclComm_t comm;
  cudaStream_t stream;
  ncclDataType_t type;
  size_t count;
  uint64_t bytes;  // S of nccl-tests
  int peer;
};

// The calling thread's open group.
struct Group {
  int depth = 0;
  Part parts[256];
  int n = 0;
  bool overflow = false;
};
thread_local Group t_group;

bool ok(ncclResult_t r) {
  return r == ncclSuccess || r == ncclInProgress;
}

timing::OpInfo infoFor(const Part* parts, int n) {
  timing::OpInfo op;
  CommInfo* c = lookup(parts[0].comm);
  bool all_p2p = true;
  uint64_t bytes = 0;
  int peer = parts[0].peer;
  for (int i = 0; i < n; ++i) {
    all_p2p &= parts[i].p2p;
    bytes += parts[i].bytes;
    if (parts[i].peer != peer) peer = -1;
  }
  op.kind = all_p2p ? timing::OpKind::kP2P : timing::OpKind::kCollective;
  op.bytes = bytes;
  op.peer = all_p2p ? peer : -1;
  if (c) {
    op.comm_hash = c->hash;
    op.nranks = static_cast<uint32_t>(c->nranks);
    op.seq = (all_p2p ? c->p2p_seq : c->coll_seq).fetch_add(1) + 1;
    if (!all_p2p) c->last_api.store(n == 1 ? parts[0].api : "ncclGroup");
  }
  // Signature: the API (or "ncclGroup"), dtype, size and communicator size. The key is built
  // from the API's name literal and numbers only; strings are made on a first sighting alone.
  const char* name = n == 1 ? parts[0].api : "ncclGroup";
  const int64_t fields[] = {n, static_cast<int64_t>(parts[0].type), static_cast<int64_t>(bytes),
                            op.nranks, static_cast<int64_t>(reinterpret_cast<uintptr_t>(name))};
  op.signature_id = signatureFor(hashBytes(fields, sizeof(fields)), [&] {
    timing::Signature s;
    s.name = name;
    s.kind = op.kind;
    s.dtype = typeName(parts[0].type);
    s.shape = {static_cast<int64_t>(n == 1 ? parts[0].count : bytes)};
    if (n > 1) {
      int sends = 0, recvs = 0;
      for (int i = 0; i < n; ++i) {
        sends += parts[i].p2p && std::strcmp(parts[i].api, "ncclSend") == 0;
        recvs += parts[i].p2p && std::strcmp(parts[i].api, "ncclRecv") == 0;
      }
      s.layout = "send=" + std::to_string(sends) + " recv=" + std::to_string(recvs) +
                 " coll=" + std::to_string(n - sends - recvs) + " ";
    }
    s.layout += "nranks=" + std::to_string(op.nranks);
    return s;
  });
  return op;
}

// A call outside a group is timed on its own; inside a group it is collected.
template <typename Call>
ncclResult_t submit(const Part& part, Call&& call) {
  if (t_group.depth > 0) {
    if (t_group.n < static_cast<int>(std::size(t_group.parts))) {
      t_group.parts[t_group.n++] = part;
    } else {
      t_group.overflow = true;
    }
    return call();
  }
  return timedCall(
      part.stream, [&] { return infoFor(&part, 1); }, ok, call);
}

struct NcclFns {
  RealFn<decltype(&ncclCommInitRank)> initRank{"ncclCommInitRank", kLib};
  RealFn<decltype(&ncclCommInitRankConfig)> initRankConfig{"ncclCommInitRankConfig", kLib};
  RealFn<decltype(&ncclCommInitAll)> initAll{"ncclCommInitAll", kLib};
  RealFn<decltype(&ncclCommSplit)> split{"ncclCommSplit", kLib};
  RealFn<decltype(&ncclAllReduce)> allReduce{"ncclAllReduce", kLib};
  RealFn<decltype(&ncclAllGather)> allGather{"ncclAllGather", kLib};
  RealFn<decltype(&ncclReduceScatter)> reduceScatter{"ncclReduceScatter", kLib};
  RealFn<decltype(&ncclBroadcast)> broadcast{"ncclBroadcast", kLib};
  RealFn<decltype(&ncclBcast)> bcast{"ncclBcast", kLib};
  RealFn<decltype(&ncclReduce)> reduce{"ncclReduce", kLib};
  RealFn<decltype(&ncclAlltoAll)> alltoall{"ncclAlltoAll", kLib};
  RealFn<decltype(&ncclSend)> send{"ncclSend", kLib};
  RealFn<decltype(&ncclRecv)> recv{"ncclRecv", kLib};
  RealFn<decltype(&ncclGroupStart)> groupStart{"ncclGroupStart", kLib};
  RealFn<decltype(&ncclGroupEnd)> groupEnd{"ncclGroupEnd", kLib};
  RealFn<decltype(&ncclCommCount)> count{"ncclCommCount", kLib};
};
NcclFns g_fns;

int commSize(ncclComm_t comm) {
  if (CommInfo* c = lookup(comm)) return c->nranks;
  int n = 1;
  if (auto f = g_fns.count.get()) f(comm, &n);
  return n;
}

}  // namespace

std::vector<CommProgress> commProgress() {
  std::vector<CommProgress> out;
  std::lock_guard<std::mutex> lock(comms().mu);
  for (const auto& [comm, c] : comms().by_comm) {
    CommProgress p;
    p.comm = comm;
    p.hash = c->hash;
    p.nranks = c->nranks;
    p.rank = c->rank;
    p.issued = c->coll_seq.load();
    p.completed = c->completed_seq.load();
    const char* api = c->last_api.load();
    p.last_op = api ? api : "";
    out.push_back(std::move(p));
  }
  return out;
}

void noteCollectiveCompleted(uint64_t comm_hash, uint64_t seq) {
  std::lock_guard<std::mutex> lock(comms().mu);
  for (auto& [comm, c] : comms().by_comm) {
    if (c->hash != comm_hash) continue;
    uint64_t cur = c->completed_seq.load();
    while (seq > cur && !c->completed_seq.compare_exchange_weak(cur, seq)) {
    }
  }
}

}  // namespace flare::hook

using namespace flare::hook;  // NOLINT: the exported wrappers below

#define REAL_OR_FAIL(slot)      \
  auto real = g_fns.slot.get(); \
  if (!real) return ncclSystemError

FLARE_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                           int rank) {
  REAL_OR_FAIL(initRank);
  ncclResult_t r = real(comm, nranks, id, rank);
  if (r == ncclSuccess && comm) registerComm(*comm, &id, 0, nranks, rank);
  return r;
}

FLARE_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                 int rank, ncclConfig_t* config) {
  REAL_OR_FAIL(initRankConfig);
  ncclResult_t r = real(comm, nranks, id, rank, config);
  if ((r == ncclSuccess || r == ncclInProgress) && comm) registerComm(*comm, &id, 0, nranks, rank);
  return r;
}

FLARE_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms_out, int ndev, const int* devlist) {
  REAL_OR_FAIL(initAll);
  ncclResult_t r = real(comms_out, ndev, devlist);
  if (r == ncclSuccess) {
    const uint64_t salt = reinterpret_cast<uintptr_t>(comms_out);  // one process: any shared salt
    for (int i = 0; i < ndev; ++i) registerComm(comms_out[i], nullptr, salt, ndev, i);
  }
  return r;
}

FLARE_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out,
                                        ncclConfig_t* config) {
  REAL_OR_FAIL(split);
  ncclResult_t r = real(comm, color, key, out, config);
  if ((r == ncclSuccess || r == ncclInProgress) && out && *out) {
    CommInfo* parent = lookup(comm);
    // Every member of the child derives the same identity: parent, color, and the parent's
    // split count so far (splits are collective, so it is the same on every rank).
    static std::atomic<uint64_t> splits{0};
    uint64_t salt =
        (parent ? parent->hash : 0) ^ (uint64_t(uint32_t(color)) << 20) ^ splits.fetch_add(1);
    int n = 1;
    if (auto f = g_fns.count.get()) f(*out, &n);
    registerComm(*out, nullptr, salt, n, key);
  }
  return r;
}

FLARE_EXPORT ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t type,
                                        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(allReduce);
  return submit({"ncclAllReduce", false, comm, stream, type, count, count * typeBytes(type), -1},
                [&] { return real(s, r, count, type, op, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclAllGather(const void* s, void* r, size_t count, ncclDataType_t type,
                                        ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(allGather);
  const uint64_t bytes = count * typeBytes(type) * commSize(comm);
  return submit({"ncclAllGather", false, comm, stream, type, count, bytes, -1},
                [&] { return real(s, r, count, type, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclReduceScatter(const void* s, void* r, size_t count,
                                            ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t stream) {
  REAL_OR_FAIL(reduceScatter);
  const uint64_t bytes = count * typeBytes(type) * commSize(comm);
  return submit({"ncclReduceScatter", false, comm, stream, type, count, bytes, -1},
                [&] { return real(s, r, count, type, op, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclAlltoAll(const void* s, void* r, size_t count, ncclDataType_t type,
                                       ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(alltoall);
  const uint64_t bytes = count * typeBytes(type) * commSize(comm);
  return submit({"ncclAlltoAll", false, comm, stream, type, count, bytes, -1},
                [&] { return real(s, r, count, type, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, ncclDataType_t type,
                                        int root, ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(broadcast);
  return submit({"ncclBroadcast", false, comm, stream, type, count, count * typeBytes(type), -1},
                [&] { return real(s, r, count, type, root, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclBcast(void* buf, size_t count, ncclDataType_t type, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(bcast);
  return submit({"ncclBroadcast", false, comm, stream, type, count, count * typeBytes(type), -1},
                [&] { return real(buf, count, type, root, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclReduce(const void* s, void* r, size_t count, ncclDataType_t type,
                                     ncclRedOp_t op, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  REAL_OR_FAIL(reduce);
  return submit({"ncclReduce", false, comm, stream, type, count, count * typeBytes(type), -1},
                [&] { return real(s, r, count, type, op, root, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclSend(const void* s, size_t count, ncclDataType_t type, int peer,
                                   ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(send);
  return submit({"ncclSend", true, comm, stream, type, count, count * typeBytes(type), peer},
                [&] { return real(s, count, type, peer, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclRecv(void* r, size_t count, ncclDataType_t type, int peer,
                                   ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(recv);
  return submit({"ncclRecv", true, comm, stream, type, count, count * typeBytes(type), peer},
                [&] { return real(r, count, type, peer, comm, stream); });
}

FLARE_EXPORT ncclResult_t ncclGroupStart() {
  REAL_OR_FAIL(groupStart);
  ncclResult_t r = real();
  if (r == ncclSuccess && t_group.depth++ == 0) {
    t_group.n = 0;
    t_group.overflow = false;
  }
  return r;
}

FLARE_EXPORT ncclResult_t ncclGroupEnd() {
  REAL_OR_FAIL(groupEnd);
  if (t_group.depth == 0 || --t_group.depth > 0 || t_group.n == 0) return real();
  // The outermost end launches one kernel per communicator: one record each, with all parts.
  Guard guard;
  flare::timing::Tracer* t = guard.outer ? tracer() : nullptr;
  if (!t || t_group.overflow) return real();
  struct Pending {
    int first;
    int count;
    flare::timing::Tracer::Ticket ticket;
    bool timed;
    flare::timing::OpInfo info;
  };
  Pending pending[16];
  int np = 0;
  // Parts of one communicator are made contiguous, in call order, by a stable insertion sort
  // in place (std::stable_sort may allocate; groups are short and nearly always one
  // communicator, which this leaves untouched in one pass).
  Part* parts = t_group.parts;
  const int n = t_group.n;
  for (int i = 1; i < n; ++i) {
    for (int j = i; j > 0 && parts[j].comm < parts[j - 1].comm; --j)
      std::swap(parts[j], parts[j - 1]);
  }
  for (int i = 0; i < n && np < 16;) {
    int j = i;
    while (j < n && parts[j].comm == parts[i].comm) ++j;
    Pending& p = pending[np++];
    p.first = i;
    p.count = j - i;
    p.info = infoFor(parts + i, j - i);
    p.timed = p.info.signature_id != 0 && t->begin(parts[i].stream, &p.ticket);
    i = j;
  }
  ncclResult_t r = real();
  for (int i = 0; i < np; ++i) {
    if (!pending[i].timed) continue;
    if (ok(r)) {
      t->end(&pending[i].ticket, pending[i].info);
    } else {
      t->cancel(&pending[i].ticket);
    }
  }
  t_group.n = 0;
  return r;
}
