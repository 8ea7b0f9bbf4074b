#include "src/hang/synthetic.h"

#include <algorithm>
#include <string>

namespace flare::hang::testing {
namespace {

using flare::v1::StackDump;
using flare::v1::ThreadStack;

void py(ThreadStack* t, const char* fn, const char* file, int line) {
  auto* f = t->add_python_frames();
  f->set_function(fn);
  f->set_file(file);
  f->set_line(line);
}

void nat(ThreadStack* t, const char* sym, const char* module, uint64_t off) {
  auto* f = t->add_native_frames();
  f->set_symbol(sym);
  f->set_module(module);
  f->set_offset(off);
  f->set_pc(0x7f0000000000ull + off);
}

void idleThread(StackDump* d) {
  ThreadStack* t = d->add_threads();
  t->set_thread_id(1001);
  t->set_name("pt_autograd_0");
  nat(t, "syscall", "/lib/x86_64-linux-gnu/libc.so.6", 0x11a0);
  nat(t, "std::condition_variable::wait(std::unique_lock<std::mutex>&)",
      "/lib/x86_64-linux-gnu/libstdc++.so.6", 0xd4e20);
  nat(t, "torch::autograd::ReadyQueue::pop()", "/opt/torch/lib/libtorch_cpu.so", 0x3a1f00);
}

ThreadStack* mainThread(StackDump* d) {
  ThreadStack* t = d->add_threads();
  t->set_thread_id(1000);
  t->set_name("python");
  t->set_main_thread(true);
  return t;
}

void trainFrames(ThreadStack* t) {
  py(t, "train_step", "/job/train.py", 88);
  py(t, "main", "/job/train.py", 140);
  py(t, "<module>", "/job/train.py", 151);
}

}  // namespace

StackDump allReduceStacks() {
  StackDump d;
  ThreadStack* t = mainThread(&d);
  py(t, "all_reduce", "/opt/torch/distributed/distributed_c10d.py", 2050);
  py(t, "wrapper", "/opt/torch/distributed/c10d_logger.py", 79);
  py(t, "allreduce_grads", "/job/train.py", 61);
  trainFrames(t);
  nat(t, "__futex_abstimed_wait_common", "/lib/x86_64-linux-gnu/libc.so.6", 0x8f2c0);
  nat(t, "pthread_cond_timedwait", "/lib/x86_64-linux-gnu/libc.so.6", 0x91a10);
  nat(t, "c10d::ProcessGroupNCCL::WorkNCCL::synchronizeInternal(std::chrono::milliseconds)",
      "/opt/torch/lib/libtorch_cuda.so", 0x1b2c300);
  nat(t, "c10d::ProcessGroupNCCL::WorkNCCL::wait(std::chrono::milliseconds)",
      "/opt/torch/lib/libtorch_cuda.so", 0x1b2c800);
  nat(t, "_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0", 0x1f0000);
  idleThread(&d);
  return d;
}

StackDump computeStacks() {
  StackDump d;
  ThreadStack* t = mainThread(&d);
  py(t, "item", "/job/model.py", 203);
  py(t, "forward", "/job/model.py", 190);
  trainFrames(t);
  nat(t, "__futex_abstimed_wait_common", "/lib/x86_64-linux-gnu/libc.so.6", 0x8f2c0);
  nat(t, "cudaStreamSynchronize", "/usr/local/cuda/lib64/libcudart.so.13", 0x52100);
  nat(t, "at::native::_local_scalar_dense_cuda(at::Tensor const&)",
      "/opt/torch/lib/libtorch_cuda.so", 0x9a1100);
  nat(t, "_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0", 0x1f0000);
  idleThread(&d);
  return d;
}

StackDump hostStuckStacks() {
  StackDump d;
  ThreadStack* t = mainThread(&d);
  py(t, "wait", "/usr/lib/python3.11/threading.py", 320);
  py(t, "get", "/usr/lib/python3.11/queue.py", 171);
  py(t, "next_batch", "/job/data.py", 44);
  trainFrames(t);
  nat(t, "__futex_abstimed_wait_common", "/lib/x86_64-linux-gnu/libc.so.6", 0x8f2c0);
  nat(t, "PyThread_acquire_lock_timed", "/usr/lib/libpython3.11.so.1.0", 0x2a0000);
  idleThread(&d);
  return d;
}

std::vector<flare::v1::ConnectionStep> ringSteps(int rank, int nranks, int channels, int stalled) {
  std::vector<flare::v1::ConnectionStep> out;
  // Edge e (sender e -> e+1) is k = (e - stalled) mod n hops after the stalled edge.
  auto edgeStep = [&](int sender, int channel) -> uint64_t {
    const int k = ((sender - stalled) % nranks + nranks) % nranks;
    return kStalledStep + 8 * uint64_t(std::min(k, nranks - k)) + uint64_t(channel);
  };
  for (int c = 0; c < channels; ++c) {
    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    flare::v1::ConnectionStep s;
    s.set_channel(c);
    s.set_peer(next);
    s.set_send(true);
    s.set_step(edgeStep(rank, c));
    out.push_back(s);
    flare::v1::ConnectionStep r;
    r.set_channel(c);
    r.set_peer(prev);
    r.set_send(false);
    r.set_step(edgeStep(prev, c));
    out.push_back(r);
  }
  return out;
}

std::vector<RankEvidence> makeJob(const JobShape& shape, Scenario s, int culprit) {
  std::vector<RankEvidence> out;
  out.reserve(size_t(shape.ranks));
  const StackDump comm = allReduceStacks();
  const StackDump compute = computeStacks();
  const StackDump stuck = hostStuckStacks();
  for (int r = 0; r < shape.ranks; ++r) {
    RankEvidence e;
    e.rank = r;
    e.host = "node" + std::to_string(r / shape.ranks_per_host);
    e.gpu_index = r % shape.ranks_per_host;
    e.gpu_uuid = "GPU-" + std::to_string(r);
    const bool bad = r == culprit;
    uint64_t issued = kSeq, completed = kSeq - 1;
    if (bad && s == Scenario::kComputeHang) {
      e.stacks = compute;
    } else if (bad && s == Scenario::kSkip) {
      e.stacks = stuck;
      issued = kSeq - 1;
    } else if (bad && s == Scenario::kUnresponsive) {
      e.state = Responsiveness::kNoAnswer;
      e.why = "no answer within 30 s";
      out.push_back(std::move(e));
      continue;
    } else {
      e.stacks = comm;
    }
    auto* p = e.stacks.add_collectives();
    p->set_communicator("dp");
    p->set_last_issued_seq(issued);
    p->set_last_completed_seq(completed);
    p->set_last_issued_op(issued == kSeq ? "ncclAllReduce" : "ncclReduceScatter");
    if (s == Scenario::kStalledLink) {
      e.inspected = true;
      e.connections = ringSteps(r, shape.ranks, shape.channels, culprit);
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace flare::hang::testing
