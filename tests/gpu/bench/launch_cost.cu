// Per-call host cost of the CUDA calls on Flare's hot path, on a real GPU (issue 19, part d):
// what a kernel launch and an async memset cost bare and under libflare_hook.so (run it twice,
// with and without LD_PRELOAD), and what the primitives the hook adds per timed op cost
// (cudaEventRecord, cudaStreamIsCapturing, cudaGetDevice) and what its timing thread calls per
// op (cudaEventQuery, cudaEventElapsedTime).
//
// Each measurement: `reps` batches of `batch` calls timed with steady_clock; the batch's queue
// is drained (cudaStreamSynchronize, untimed) between batches so that no launch waits for a full
// queue; the result is the median over batches of ns per call. One JSON object on stdout.
//
// Build (tests/gpu/bench/build-launch-cost.sh, on a machine with nvcc):
//   nvcc -O2 -std=c++17 -cudart shared -arch=sm_90 launch_cost.cu -o launch_cost
// Run: launch_cost [batch=512] [reps=41]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void empty_kernel(int* p) {
  if (p != nullptr && threadIdx.x == 0 && blockIdx.x == 0) *p = 1;
}

namespace {

double nowNs() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

template <typename Call>
double perCall(cudaStream_t s, int batch, int reps, Call&& call) {
  std::vector<double> per;
  for (int r = 0; r < reps + 1; ++r) {  // the first batch warms up, untimed
    cudaStreamSynchronize(s);
    const double t0 = nowNs();
    for (int i = 0; i < batch; ++i) call(i);
    const double t1 = nowNs();
    if (r > 0) per.push_back((t1 - t0) / batch);
  }
  cudaStreamSynchronize(s);
  std::sort(per.begin(), per.end());
  return per[per.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 512;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 41;
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "launch_cost: no CUDA device\n");
    return 2;
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int* flag = nullptr;
  cudaMalloc(&flag, 4096);
  std::vector<cudaEvent_t> ev(static_cast<size_t>(batch));
  for (auto& e : ev) cudaEventCreate(&e);
  const double launch = perCall(s, batch, reps, [&](int) { empty_kernel<<<1, 32, 0, s>>>(flag); });
  const double memset = perCall(s, batch, reps, [&](int) { cudaMemsetAsync(flag, 0, 256, s); });
  const double record =
      perCall(s, batch, reps, [&](int i) { cudaEventRecord(ev[static_cast<size_t>(i)], s); });
  cudaStreamSynchronize(s);
  const double query =
      perCall(s, batch, reps, [&](int i) { (void)cudaEventQuery(ev[static_cast<size_t>(i)]); });
  float ms = 0;
  const double elapsed = perCall(s, batch, reps, [&](int i) {
    (void)cudaEventElapsedTime(&ms, ev[0], ev[static_cast<size_t>(i)]);
  });
  cudaStreamCaptureStatus st;
  const double capturing = perCall(s, batch, reps, [&](int) { cudaStreamIsCapturing(s, &st); });
  int dev = 0;
  const double get_device = perCall(s, batch, reps, [&](int) { cudaGetDevice(&dev); });
  // A launch followed by the two event records the hook adds around it, done by hand: the
  // floor of any per-op event timing.
  const double launch_2ev = perCall(s, batch / 2, reps, [&](int i) {
    cudaEventRecord(ev[static_cast<size_t>(2 * i)], s);
    empty_kernel<<<1, 32, 0, s>>>(flag);
    cudaEventRecord(ev[static_cast<size_t>(2 * i + 1)], s);
  });
  const cudaError_t err = cudaGetLastError();
  std::printf(
      "{\"batch\": %d, \"reps\": %d, \"ns_per_call\": {\"launch\": %.1f, \"memset_async\": %.1f, "
      "\"event_record\": %.1f, \"event_query\": %.1f, \"event_elapsed\": %.1f, "
      "\"stream_is_capturing\": %.1f, \"get_device\": %.1f, \"launch_with_two_records\": %.1f}, "
      "\"error\": \"%s\"}\n",
      batch, reps, launch, memset, record, query, elapsed, capturing, get_device, launch_2ev,
      cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
