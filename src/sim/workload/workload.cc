#include "src/sim/workload/workload.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "src/common/config.h"
#include "src/common/rank_list.h"
#include "src/sim/cuda_registration.h"
#include "src/sim/flare_sim.h"

namespace flare::sim::workload {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS error");
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
  }
}

// Kernel "host stubs": their addresses identify the kernels, as nvcc's stubs do.
struct Kernel {
  const char* name;
  int cost;
  char stub = 0;
};
Kernel k_layer_norm{"_ZN5flare3sim17layer_norm_kernelEPKvPvm", FLARE_SIM_COST_BYTES};
Kernel k_flash_fwd{"_ZN5flash16flash_fwd_kernelEm", FLARE_SIM_COST_FLOPS};
Kernel k_flash_bwd{"_ZN5flash16flash_bwd_kernelEm", FLARE_SIM_COST_FLOPS};
Kernel k_gelu{"_ZN5flare3sim11gelu_kernelEm", FLARE_SIM_COST_BYTES};
Kernel k_gelu_bwd{"_ZN5flare3sim15gelu_bwd_kernelEm", FLARE_SIM_COST_BYTES};
Kernel k_residual{"_ZN5flare3sim19residual_add_kernelEm", FLARE_SIM_COST_BYTES};
Kernel k_ln_bwd{"_ZN5flare3sim21layer_norm_bwd_kernelEm", FLARE_SIM_COST_BYTES};
Kernel k_loss{"_ZN5flare3sim18cross_entropy_lossEm", FLARE_SIM_COST_BYTES};
Kernel k_adam{"_ZN5flare3sim23multi_tensor_apply_adamEm", FLARE_SIM_COST_BYTES};

void registerKernels() {
  static char image[] = "flare-sim-workload";
  void** h = __cudaRegisterFatBinary(image);
  for (Kernel* k : {&k_layer_norm, &k_flash_fwd, &k_flash_bwd, &k_gelu, &k_gelu_bwd, &k_residual,
                    &k_ln_bwd, &k_loss, &k_adam}) {
    __cudaRegisterFunction(h, &k->stub, nullptr, k->name, -1, nullptr, nullptr, nullptr, nullptr,
                           nullptr);
    flareSimRegisterKernelCost(k->name, k->cost, 0);
  }
  __cudaRegisterFatBinaryEnd(h);
}

void launch(Kernel& k, uint64_t amount, cudaStream_t s) {
  void* args[] = {&amount};
  check(cudaLaunchKernel(&k.stub, dim3(static_cast<unsigned>(amount / 4096 % 65535 + 1)), dim3(256),
                         args, 0, s),
        k.name);
}

// Exchanges a communicator id through a file in the rendezvous directory (like a TCPStore).
ncclUniqueId exchangeId(const std::string& dir, const std::string& key, bool leader) {
  ncclUniqueId id;
  const std::string path = dir + "/" + key + ".id";
  if (leader) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(id.internal, sizeof(id.internal));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("rename " + path);
    return id;
  }
  for (int i = 0; i < 120000; ++i) {
    std::ifstream f(path, std::ios::binary);
    if (f && f.read(id.internal, sizeof(id.internal))) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  throw std::runtime_error("timed out waiting for communicator id " + path);
}

struct Stall {
  double ms = 0;
  int every = 1;
  int64_t first = 0, last = INT64_MAX;  // the steps it applies to (a burst)
  bool at(int64_t step) const {
    return ms > 0 && step >= first && step <= last && step % every == 0;
  }
};

// The entry of a FLARE_SIM_* rank list for `rank` (an exact rank wins over '*'), parsed and
// validated by the shared reader (bad entries warn once and are skipped).
std::optional<common::RankEntry> entryFor(const char* var, int rank, size_t min_fields,
                                          size_t max_fields) {
  auto raw = common::getEnv(var);
  if (!raw) return std::nullopt;
  const auto list = common::parsePerRankList(var, *raw, min_fields, max_fields);
  const common::RankEntry* e = common::entryForRank(list, rank);
  return e ? std::optional<common::RankEntry>(*e) : std::nullopt;
}

// FLARE_SIM_HOST_STALL=RANK:MS[:EVERY_N_STEPS[:FIRST-LAST]] (FIRST-LAST: only in those steps, a
// burst)
Stall hostStallFor(int rank) {
  Stall s;
  auto e = entryFor("FLARE_SIM_HOST_STALL", rank, 1, 3);
  if (!e) return s;
  auto ms = common::parseDouble(e->fields[0]);
  auto every = e->fields.size() > 1 ? common::parseInt(e->fields[1]) : std::optional<int64_t>(1);
  std::optional<int64_t> first = 0, last = INT64_MAX;
  if (e->fields.size() > 2) {
    const std::string& range = e->fields[2];
    const size_t dash = range.find('-');
    first = dash == std::string::npos ? std::nullopt : common::parseInt(range.substr(0, dash));
    last = dash == std::string::npos ? std::nullopt : common::parseInt(range.substr(dash + 1));
  }
  if (!ms || *ms <= 0 || !every || *every <= 0 || !first || !last || *first < 0 || *last < *first) {
    common::configWarning("flare-sim: FLARE_SIM_HOST_STALL entry for rank " + std::to_string(rank) +
                          " is not RANK:MS[:EVERY[:FIRST-LAST]]; ignored");
    return s;
  }
  s.ms = *ms;
  s.every = static_cast<int>(*every);
  s.first = *first;
  s.last = *last;
  return s;
}

// FLARE_SIM_INJECT_SYNC_US=RANKS:US (a bare US: every rank, the older form): this rank's US, or
// -1 (off). Read by the simulator's rank-list reader (flareSimRankEntry), as every fault is.
double injectSyncUsFor() {
  char buf[64];
  if (flareSimRankEntry("FLARE_SIM_INJECT_SYNC_US", 1, 1, 1, buf, sizeof(buf)) != 1) return -1;
  auto us = common::parseDouble(buf);
  if (!us || *us > 1e6) {
    common::configWarning(std::string("flare-sim: FLARE_SIM_INJECT_SYNC_US value '") + buf +
                          "' is not a number of microseconds <= 1e6; off");
    return -1;
  }
  return *us;
}

// FLARE_SIM_CRASH=RANK:STEP
int64_t crashStepFor(int rank) {
  auto e = entryFor("FLARE_SIM_CRASH", rank, 1, 1);
  if (!e) return -1;
  auto step = common::parseInt(e->fields[0]);
  return step && *step >= 0 ? *step : -1;
}

}  // namespace

std::vector<StepResult> run(const Options& o, void (*on_step)(const StepResult&)) {
  registerKernels();
  const int world = std::max(1, o.world_size);
  int tp = std::max(1, std::min(o.tp, world));
  while (world % tp) tp--;
  const int dp = world / tp;
  const int tp_group = o.rank / tp, dp_group = o.rank % tp;

  // LOCAL_RANK's device, as torch.cuda.set_device(LOCAL_RANK) does (8 per simulated node);
  // with fewer simulated GPUs (FLARE_SIM_DEVICES) ranks share them, as on a misconfigured node.
  int devices = 8;
  check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  check(cudaSetDevice(o.rank % 8 % std::max(1, devices)), "cudaSetDevice");
  cudaStream_t compute, tp_stream, dp_stream;
  check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&tp_stream, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&dp_stream, cudaStreamNonBlocking), "stream");
  cublasHandle_t blas;
  check(cublasCreate(&blas), "cublasCreate");
  check(cublasSetStream(blas, compute), "cublasSetStream");
  cublasLtHandle_t lt;
  check(cublasLtCreate(&lt), "cublasLtCreate");

  ncclComm_t tp_comm = nullptr, dp_comm = nullptr;
  if (tp > 1) {
    ncclUniqueId id = exchangeId(o.rdzv_dir, "tp" + std::to_string(tp_group), o.rank % tp == 0);
    check(ncclCommInitRank(&tp_comm, tp, id, o.rank % tp), "ncclCommInitRank(tp)");
  }
  if (dp > 1) {
    ncclUniqueId id = exchangeId(o.rdzv_dir, "dp" + std::to_string(dp_group), o.rank / tp == 0);
    check(ncclCommInitRank(&dp_comm, dp, id, o.rank / tp), "ncclCommInitRank(dp)");
  }

  const int64_t h = o.hidden, T = o.seq * o.micro_batch, ffn = o.ffn > 0 ? o.ffn : 4 * h;
  const int64_t h_tp = h / tp, ffn_tp = ffn / tp;
  const uint64_t act_bytes = uint64_t(T) * h * 2;
  const uint64_t layer_param_bytes = uint64_t(12) * h * h / tp * 2;
  const uint64_t attn_flops = uint64_t(2) * o.micro_batch * o.seq * o.seq * h_tp;  // causal
  const float alpha = 1, beta = 0;

  auto gemm = [&](int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    check(cublasGemmEx(blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                       static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha,
                       nullptr, CUDA_R_16BF, static_cast<int>(ta ? k : m), nullptr, CUDA_R_16BF,
                       static_cast<int>(tb ? n : k), &beta, nullptr, CUDA_R_16BF,
                       static_cast<int>(m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  // Weight-gradient GEMMs go through cuBLASLt, as PyTorch's do for bf16.
  cublasLtMatmulDesc_t lt_desc;
  check(cublasLtMatmulDescCreate(&lt_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "lt desc");
  cublasOperation_t trans_b = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(lt_desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
  auto wgrad = [&](int64_t m, int64_t n, int64_t k) {
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, n, k, n);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, m, n, m);
    check(cublasLtMatmul(lt, lt_desc, &alpha, nullptr, a, nullptr, b, &beta, nullptr, c, nullptr, c,
                         nullptr, nullptr, 0, compute),
          "cublasLtMatmul");
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
  };

  // Events: cross-stream handoffs (created once and reused, as frameworks do).
  cudaEvent_t ev_fwd, ev_tp, ev_dp, ev_step, gemm_a, gemm_b;
  for (cudaEvent_t* e : {&ev_fwd, &ev_tp, &ev_dp, &ev_step}) {
    check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "event");
  }
  check(cudaEventCreate(&gemm_a), "event");
  check(cudaEventCreate(&gemm_b), "event");

  auto tpAllReduce = [&] {
    if (!tp_comm) return;
    check(cudaEventRecord(ev_fwd, compute), "record");
    check(cudaStreamWaitEvent(tp_stream, ev_fwd, 0), "wait");
    check(ncclAllReduce(nullptr, nullptr, act_bytes / 2, ncclBfloat16, ncclSum, tp_comm, tp_stream),
          "ncclAllReduce(tp)");
    check(cudaEventRecord(ev_tp, tp_stream), "record");
    check(cudaStreamWaitEvent(compute, ev_tp, 0), "wait");
  };

  std::vector<char> host_batch(o.copies > 0 ? (1 << 20) : 0);
  void* dev_batch = nullptr;
  if (o.copies > 0) check(cudaMalloc(&dev_batch, host_batch.size()), "cudaMalloc");
  const Stall stall = hostStallFor(o.rank);
  // FLARE_SIM_INJECT_SYNC_US=RANKS:US (a bare US: every rank): a needless synchronize at the
  // start of each layer's forward, then host work (framework overhead) before the next launch,
  // during which the GPU has nothing.
  const double inject_sync_us = injectSyncUsFor();
  const int64_t crash_step = crashStepFor(o.rank);
  const int64_t skip_step = flareSimHangStep("skip");
  std::vector<StepResult> results;

  // Flare's explicit step marker (include/flare/step.h), when the hook is loaded.
  using StepFn = int (*)();
  const auto mark_step = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "flare_step"));
  // A step's time is the interval between its start and the next step's (the last step's: its
  // end), as the step marker sees it: the bookkeeping after a step and a preemption there
  // belong to it. Its result is handed on once the next step has started.
  std::optional<StepResult> pending;
  std::chrono::steady_clock::time_point pending_t0;
  auto emit = [&](std::chrono::steady_clock::time_point end) {
    if (!pending) return;
    pending->step_ms = std::chrono::duration<double, std::milli>(end - pending_t0).count();
    results.push_back(*pending);
    if (on_step) on_step(*pending);
    pending.reset();
  };
  for (int step = 0; step < o.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    emit(t0);
    flareSimSetStep(step);
    if (mark_step != nullptr) mark_step();
    const double boundary_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step == crash_step) {
      std::fprintf(stderr, "flare-sim: rank %d crashing at step %d (FLARE_SIM_CRASH)\n", o.rank,
                   step);
      std::abort();
    }
    // DataLoader: wait for the next batch on the host, then copy it to the GPU. The wait varies
    // from step to step (the sim's host noise, FLARE_SIM_HOST_JITTER).
    std::this_thread::sleep_for(std::chrono::microseconds(
        static_cast<int64_t>(o.data_ms * 1000 * flareSimHostFactor(step, 0))));
    // Input batches to the GPU and a zeroed buffer (--copies): memcpy and memset activity.
    for (int c = 0; c < o.copies; ++c) {
      check(cudaMemcpyAsync(dev_batch, host_batch.data(), host_batch.size(), cudaMemcpyHostToDevice,
                            compute),
            "cudaMemcpyAsync");
      check(cudaMemsetAsync(dev_batch, 0, host_batch.size() / 4, compute), "cudaMemsetAsync");
    }
    if (step == skip_step) {
      // Injected: this rank never reaches the step's collectives (stuck on the host).
      std::fprintf(stderr,
                   "flare-sim: rank %d stuck before step %d's collectives "
                   "(FLARE_SIM_HANG skip)\n",
                   o.rank, step);
      while (!flareSimShuttingDown()) std::this_thread::sleep_for(std::chrono::seconds(1));
    }

    // Forward.
    for (int l = 0; l < o.layers; ++l) {
      if (inject_sync_us >= 0) {
        check(cudaStreamSynchronize(compute), "cudaStreamSynchronize(injected)");
        // Host work off the CPU (a sleep): a busy loop would take the CPU from the other simulated
        // ranks on a small machine and slow every rank, not only this layer's refill.
        if (inject_sync_us > 0)
          std::this_thread::sleep_for(
              std::chrono::nanoseconds(static_cast<int64_t>(inject_sync_us * 1000)));
      }
      launch(k_layer_norm, act_bytes * 2, compute);
      if (l == 0) check(cudaEventRecord(gemm_a, compute), "record");
      gemm(3 * h_tp, T, h, true, false);  // QKV
      if (l == 0) check(cudaEventRecord(gemm_b, compute), "record");
      launch(k_flash_fwd, attn_flops, compute);
      gemm(h, T, h_tp, true, false);  // output projection
      tpAllReduce();
      launch(k_residual, act_bytes * 3, compute);
      if (l == o.layers / 2 && stall.at(step)) {
        // Injected GC-like pause on the host in the middle of the forward pass.
        std::this_thread::sleep_for(std::chrono::microseconds(int64_t(stall.ms * 1000)));
      }
      launch(k_layer_norm, act_bytes * 2, compute);
      gemm(ffn_tp, T, h, true, false);  // fc1
      launch(k_gelu, uint64_t(T) * ffn_tp * 4, compute);
      // Injected (--extra-kernels): unfused elementwise work, the "minority" kernels of V_minority.
      for (int e = 0; e < o.extra_kernels; ++e) launch(k_residual, act_bytes * 3, compute);
      gemm(h, T, ffn_tp, true, false);  // fc2
      tpAllReduce();
      launch(k_residual, act_bytes * 3, compute);
    }
    launch(k_loss, act_bytes * 8, compute);

    // Backward, with each layer's gradients all-reduced on the data-parallel stream.
    for (int l = o.layers - 1; l >= 0; --l) {
      gemm(ffn_tp, T, h, false, false);  // fc2 dgrad
      wgrad(h, ffn_tp, T);               // fc2 wgrad
      launch(k_gelu_bwd, uint64_t(T) * ffn_tp * 6, compute);
      gemm(h, T, ffn_tp, false, false);  // fc1 dgrad
      wgrad(ffn_tp, h, T);               // fc1 wgrad
      tpAllReduce();
      launch(k_ln_bwd, act_bytes * 4, compute);
      gemm(h_tp, T, h, false, false);  // out-proj dgrad
      wgrad(h, h_tp, T);               // out-proj wgrad
      launch(k_flash_bwd, attn_flops * 5 / 2, compute);
      gemm(h, T, 3 * h_tp, false, false);  // QKV dgrad
      wgrad(3 * h_tp, h, T);               // QKV wgrad
      tpAllReduce();
      launch(k_ln_bwd, act_bytes * 4, compute);
      if (dp_comm) {
        check(cudaEventRecord(ev_fwd, compute), "record");
        check(cudaStreamWaitEvent(dp_stream, ev_fwd, 0), "wait");
        check(ncclAllReduce(nullptr, nullptr, layer_param_bytes / 2, ncclBfloat16, ncclSum, dp_comm,
                            dp_stream),
              "ncclAllReduce(dp)");
      }
    }
    // Optimizer, after every gradient bucket is reduced.
    if (dp_comm) {
      check(cudaEventRecord(ev_dp, dp_stream), "record");
      check(cudaStreamWaitEvent(compute, ev_dp, 0), "wait");
    }
    launch(k_adam, layer_param_bytes * o.layers * 8, compute);
    check(cudaEventRecord(ev_step, compute), "record");
    check(cudaEventSynchronize(ev_step), "cudaEventSynchronize(step)");  // loss.item()

    StepResult r;
    r.step = step;
    float g = 0;
    check(cudaEventElapsedTime(&g, gemm_a, gemm_b), "elapsed");
    r.gemm_ms = g;
    r.boundary_ms = boundary_ms;
    pending = r;
    pending_t0 = t0;
  }
  emit(std::chrono::steady_clock::now());
  cublasLtMatmulDescDestroy(lt_desc);
  if (dev_batch) cudaFree(dev_batch);
  return results;
}

}  // namespace flare::sim::workload
