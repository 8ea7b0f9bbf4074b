// The performance formulas of the metrics (design.md "The metrics"): device peaks, GEMM and
// attention FLOPs, nccl-tests bus bandwidth, the 128-byte alignment hint, and a simple model of
// a GEMM shape's expected TFLOPS.
//
// Peak table: dense (no 2:4 sparsity) tensor-core TFLOPS per dtype from the vendors' data sheets
// and the HBM bandwidth, per device; looked up by the name CUDA reports
// (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"). An operator adds or overrides an entry
// with a spec string (parseDevicePeak), for a device missing here or a power-capped fleet.
//
// Expected TFLOPS of a GEMM (b × [m×k]·[k×n]):
//   tiles      = ⌈m/T_m⌉·⌈n/T_n⌉·b                        (T = 128×128 by default)
//   tile eff.  = m·n / (⌈m/T_m⌉T_m · ⌈n/T_n⌉T_n)           (padding of edge tiles)
//   wave eff.  = tiles / (⌈tiles/SMs⌉·SMs)                 (the last wave's idle SMs)
//   align eff. = misalignedFactor (0.5) if m, n or k is not a multiple of 128 bytes, else 1
//   compute    = peak(dtype) · baseEfficiency (0.75) · tile · wave · align
//   memory     = AI · bandwidth, AI = 2bmnk / (bytes·b·(mk + kn + mn))  (each operand once)
//   expected   = min(compute, memory)                       (a roofline)
// It is a yardstick for "this shape runs far below what the device gives such shapes", not a
// performance predictor: compare measured/expected, flag ratios well below 1.
//
// Threading: PeakTable is a value; builtin() is immutable after first use; functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flare::stats {

enum class Dtype { kFp32 = 0, kTf32, kFp16, kBf16, kFp8, kCount };

// "fp32", "tf32", "fp16", "bf16", "fp8".
const char* dtypeName(Dtype d);
std::optional<Dtype> parseDtype(std::string_view name);
// Bytes per element (tf32 is stored as fp32).
int dtypeBytes(Dtype d);

struct DevicePeak {
  std::string name;                                     // canonical, e.g. "H100 SXM"
  double tflops[static_cast<int>(Dtype::kCount)] = {};  // dense; 0: not supported
  double memoryBandwidthGBps = 0;                       // HBM/GDDR, GB/s (1e9 bytes/s)
  int smCount = 0;
  // Lower-case words of CUDA's name that identify it: an entry matches when every word of one
  // pattern is a word of the reported name (words split on space, '-' and '_').
  std::vector<std::vector<std::string>> patterns;

  double peakTflops(Dtype d) const { return tflops[static_cast<int>(d)]; }
};

class PeakTable {
 public:
  // H100 SXM and PCIe, H200, H800, H20, A100 (40 and 80 GB), A800, B200, L40S.
  static const PeakTable& builtin();

  // The entry for a CUDA device name; nullptr when unknown. Entries are tried from the last added
  // to the first: custom entries before built-in ones, and within the built-in table the
  // specific patterns ("h100 pcie") before the generic ones ("h100").
  const DevicePeak* find(std::string_view cudaName) const;
  // Adds an entry that takes precedence over the ones before it.
  void add(DevicePeak peak);
  const std::vector<DevicePeak>& entries() const { return entries_; }

 private:
  std::vector<DevicePeak> entries_;  // searched back to front: later additions win
};

// Parses "NAME:key=value,key=value,..." with keys fp32, tf32, fp16, bf16, fp8 (TFLOPS),
// mem_gbps, sms, match (space-separated words of CUDA's name; default: NAME's words).
// Example: "H100-capped:bf16=700,fp8=1400,mem_gbps=3350,sms=132,match=h100 hbm3".
std::optional<DevicePeak> parseDevicePeak(std::string_view spec, std::string* error = nullptr);

// 2·b·m·n·k.
double gemmFlops(double b, double m, double n, double k);
// 4·b·s_q·s_k·h·d forward; halved when causal; ×2.5 for the backward pass.
double attentionFlops(double b, double sq, double sk, double heads, double headDim, bool causal,
                      bool backward);
// TFLOPS of `flops` done in `seconds` (0 when seconds ≤ 0).
double tflops(double flops, double seconds);

enum class Collective {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kReduce,
  kSendRecv
};
const char* collectiveName(Collective c);
std::optional<Collective> parseCollective(std::string_view name);
// nccl-tests' busbw factor: 2(n−1)/n all-reduce; (n−1)/n all-gather, reduce-scatter, all-to-all;
// 1 broadcast, reduce, send/recv. 0 for n < 1.
double busBandwidthFactor(Collective c, int ranks);
// algbw = S/t (bytes/s), S the total buffer size; 0 when seconds ≤ 0.
double algBandwidth(double bytes, double seconds);
double busBandwidth(Collective c, int ranks, double bytes, double seconds);

struct AlignmentIssue {
  char dim = 0;         // 'm', 'n' or 'k'
  int64_t value = 0;    // elements
  int64_t bytes = 0;    // value × element size
  int64_t aligned = 0;  // nearest multiple of 128 bytes, in elements (ties up; never 0)
};
// The dimensions of an m×n×k GEMM of `elementBytes`-byte elements whose byte size is not a
// multiple of 128.
std::vector<AlignmentIssue> gemmAlignmentIssues(int64_t m, int64_t n, int64_t k, int elementBytes);
// A one-line hint naming each misaligned dimension, its value and the nearest aligned value;
// empty when aligned. E.g. "k=4095 (8190 bytes in bf16) is not a multiple of 128 bytes; nearest
// aligned k=4096 (pad to it for tensor-core-friendly tiles)".
std::string gemmAlignmentHint(int64_t m, int64_t n, int64_t k, Dtype dtype);

struct GemmModelOptions {
  int tileM = 128;
  int tileN = 128;
  double baseEfficiency = 0.75;
  double misalignedFactor = 0.5;
};

struct GemmExpectation {
  double flops = 0;
  double bytes = 0;
  double tileEfficiency = 1;
  double waveEfficiency = 1;
  double alignEfficiency = 1;
  double computeTflops = 0;   // compute-bound ceiling
  double memoryTflops = 0;    // arithmetic intensity × bandwidth
  double expectedTflops = 0;  // min of the two
  bool memoryBound = false;
};

// The model in the header comment. All zero when the device lacks the dtype or a dimension ≤ 0.
GemmExpectation expectedGemm(const DevicePeak& device, Dtype dtype, int64_t b, int64_t m, int64_t n,
                             int64_t k, const GemmModelOptions& options = {});

}  // namespace flare::stats
