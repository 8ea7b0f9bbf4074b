// Per-call host cost of the CUDA calls on Flare's hot path, on a real GPU (issue 19, part d):
// what a kernel launch and an async memset cost bare and under libflare_hook.so (run it twice,
// with and without LD_PRELOAD), and what the primitives the hook adds per timed op cost
// (cudaEventRecord, cudaStreamIsCapturing, cudaGetDevice) and what its timing thread calls per
// op (cudaEventQuery, cudaEventElapsedTime).
//
// launch_with_hook_calls: the two records by hand, after the cudaStreamIsCapturing and
// cudaGetDevice the hook makes per timed op (every CUDA call of its launching thread).
// launch_with_two_records_polled: the same two records by hand while a second thread makes the
// driver calls Flare's timing thread makes per op (every 1 ms, for each pair recorded since its
// last pass: cudaEventQuery of the end event, then cudaEventElapsedTime of both events against a
// reference event). Its difference from launch_with_two_records is what a poller's driver calls
// cost the launching thread (contention in the driver), which no single-threaded row shows.
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
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
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
  // The same with the two queries the hook makes per timed op before its records (is the stream
  // capturing? which device is current?): all the CUDA calls of the hook's launching thread.
  const double launch_flare_calls = perCall(s, batch / 2, reps, [&](int i) {
    cudaStreamCaptureStatus capture;
    cudaStreamIsCapturing(s, &capture);
    int device = 0;
    cudaGetDevice(&device);
    cudaEventRecord(ev[static_cast<size_t>(2 * i)], s);
    empty_kernel<<<1, 32, 0, s>>>(flag);
    cudaEventRecord(ev[static_cast<size_t>(2 * i + 1)], s);
  });
  // The same as launch_with_two_records, with a poller thread beside it (see the top of the file).
  // The call adds one atomic increment (a few ns) to tell the poller how many pairs were recorded.
  cudaEvent_t reference;
  cudaEventCreate(&reference);
  cudaEventRecord(reference, s);
  cudaStreamSynchronize(s);
  std::atomic<long> recorded{0}, polled{0}, taken{0};  // taken: pairs the poller is past
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    const long pairs = batch / 2;
    long seen = 0;
    float t = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const long n = recorded.load(std::memory_order_acquire);
      if (n - seen > pairs) seen = n - pairs;  // pairs re-recorded since: the newest batch only
      for (; seen < n; ++seen) {
        const auto i = static_cast<size_t>(seen % pairs);
        if (cudaEventQuery(ev[2 * i + 1]) != cudaSuccess) break;
        cudaEventElapsedTime(&t, reference, ev[2 * i]);
        cudaEventElapsedTime(&t, reference, ev[2 * i + 1]);
        polled.fetch_add(1, std::memory_order_relaxed);
      }
      taken.store(seen, std::memory_order_release);
    }
  });
  const double launch_2ev_polled = perCall(s, batch / 2, reps, [&](int i) {
    cudaEventRecord(ev[static_cast<size_t>(2 * i)], s);
    empty_kernel<<<1, 32, 0, s>>>(flag);
    cudaEventRecord(ev[static_cast<size_t>(2 * i + 1)], s);
    recorded.fetch_add(1, std::memory_order_release);
  });
  // The last batch's pass, untimed: until the poller is past every recorded pair (up to 2 s; a
  // fixed 3 ms wait saw none taken when a loaded machine did not run the poller in time).
  for (int ms = 0; ms < 2000 && taken.load(std::memory_order_acquire) < recorded.load(); ++ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop.store(true);
  poller.join();
  const cudaError_t err = cudaGetLastError();
  std::printf(
      "{\"batch\": %d, \"reps\": %d, \"ns_per_call\": {\"launch\": %.1f, \"memset_async\": %.1f, "
      "\"event_record\": %.1f, \"event_query\": %.1f, \"event_elapsed\": %.1f, "
      "\"stream_is_capturing\": %.1f, \"get_device\": %.1f, \"launch_with_two_records\": %.1f, "
      "\"launch_with_hook_calls\": %.1f, \"launch_with_two_records_polled\": %.1f}, "
      "\"pairs_polled\": %ld, \"error\": \"%s\"}\n",
      batch, reps, launch, memset, record, query, elapsed, capturing, get_device, launch_2ev,
      launch_flare_calls, launch_2ev_polled, polled.load(), cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
