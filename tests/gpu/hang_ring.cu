// A kernel that hangs like a NCCL ring kernel (tests/gpu/test_hang_inspect_gpu.py): one block
// per channel; thread 0 keeps the channel's ring state (prev/next rank, send/recv step
// counters) in shared memory, advances the steps to the targets given on the command line, and
// then waits forever for a flag nobody sets. The host's main thread blocks in
// cudaDeviceSynchronize, as a rank's does in a real hang. Built with -G so that cuda-gdb sees
// `flareTestRing` by name.
//
// Usage: hang_ring RANK NRANKS SEND0 RECV0 [SEND1 RECV1 ...]   (one pair per channel)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

struct FlareTestRing {
  int prev;
  int next;
  unsigned long long sendStep;
  unsigned long long recvStep;
};

__global__ void flareTestRingKernel(int rank, int nranks, const unsigned long long* targets,
                                    volatile int* release) {
  __shared__ FlareTestRing flareTestRing;
  if (threadIdx.x == 0) {
    flareTestRing.prev = (rank + nranks - 1) % nranks;
    flareTestRing.next = (rank + 1) % nranks;
    flareTestRing.sendStep = 0;
    flareTestRing.recvStep = 0;
    while (flareTestRing.sendStep < targets[2 * blockIdx.x]) flareTestRing.sendStep++;
    while (flareTestRing.recvStep < targets[2 * blockIdx.x + 1]) flareTestRing.recvStep++;
    __threadfence_block();
    while (*release == 0) {
    }
  }
  __syncthreads();
}

int main(int argc, char** argv) {
  if (argc < 5 || (argc - 3) % 2 != 0) {
    std::fprintf(stderr, "usage: %s RANK NRANKS SEND0 RECV0 [SEND1 RECV1 ...]\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), nranks = std::atoi(argv[2]);
  const int channels = (argc - 3) / 2;
  std::vector<unsigned long long> targets;
  for (int i = 3; i < argc; ++i) targets.push_back(std::strtoull(argv[i], nullptr, 10));
  unsigned long long* d_targets = nullptr;
  int* release = nullptr;
  if (cudaMalloc(&d_targets, targets.size() * sizeof(targets[0])) != cudaSuccess ||
      cudaMemcpy(d_targets, targets.data(), targets.size() * sizeof(targets[0]),
                 cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMalloc(&release, sizeof(int)) != cudaSuccess || cudaMemset(release, 0, sizeof(int))) {
    std::fprintf(stderr, "cuda setup failed\n");
    return 1;
  }
  flareTestRingKernel<<<channels, 32>>>(rank, nranks, d_targets, release);
  std::printf("READY\n");
  std::fflush(stdout);
  cudaDeviceSynchronize();  // never returns: the test kills the process
  return 0;
}
