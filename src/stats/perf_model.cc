#include "src/stats/perf_model.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace flare::stats {

namespace {

std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ' ' || c == '-' || c == '_' || c == '\t') {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

DevicePeak entry(const char* name, double fp32, double tf32, double fp16, double bf16, double fp8,
                 double mem_gbps, int sms, std::vector<std::vector<std::string>> patterns) {
  DevicePeak d;
  d.name = name;
  d.tflops[static_cast<int>(Dtype::kFp32)] = fp32;
  d.tflops[static_cast<int>(Dtype::kTf32)] = tf32;
  d.tflops[static_cast<int>(Dtype::kFp16)] = fp16;
  d.tflops[static_cast<int>(Dtype::kBf16)] = bf16;
  d.tflops[static_cast<int>(Dtype::kFp8)] = fp8;
  d.memoryBandwidthGBps = mem_gbps;
  d.smCount = sms;
  d.patterns = std::move(patterns);
  return d;
}

bool parseDouble(std::string_view s, double* v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && std::isfinite(*v) && *v >= 0;
}

}  // namespace

const char* dtypeName(Dtype d) {
  switch (d) {
    case Dtype::kFp32:
      return "fp32";
    case Dtype::kTf32:
      return "tf32";
    case Dtype::kFp16:
      return "fp16";
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp8:
      return "fp8";
    default:
      return "?";
  }
}

std::optional<Dtype> parseDtype(std::string_view name) {
  for (int i = 0; i < static_cast<int>(Dtype::kCount); ++i)
    if (name == dtypeName(static_cast<Dtype>(i))) return static_cast<Dtype>(i);
  return std::nullopt;
}

int dtypeBytes(Dtype d) {
  switch (d) {
    case Dtype::kFp16:
    case Dtype::kBf16:
      return 2;
    case Dtype::kFp8:
      return 1;
    default:
      return 4;
  }
}

const PeakTable& PeakTable::builtin() {
  // Dense TFLOPS (fp32 = CUDA cores; tf32/fp16/bf16/fp8 = tensor cores, no sparsity), memory
  // bandwidth (GB/s) and SM count, from NVIDIA's data sheets. Generic patterns first: the
  // table is searched from the end.
  static const PeakTable table = [] {
    PeakTable t;
    //            name        fp32  tf32   fp16    bf16    fp8     GB/s  SMs
    t.add(entry("H100 SXM", 67, 494.7, 989.4, 989.4, 1978.9, 3350, 132, {{"h100"}}));
    t.add(entry("H100 PCIe", 51, 378, 756, 756, 1513, 2000, 114, {{"h100", "pcie"}}));
    t.add(entry("H200", 67, 494.7, 989.4, 989.4, 1978.9, 4800, 132, {{"h200"}}));
    t.add(entry("H800", 67, 494.7, 989.4, 989.4, 1978.9, 3350, 132, {{"h800"}}));
    t.add(entry("H800 PCIe", 51, 378, 756, 756, 1513, 2000, 114, {{"h800", "pcie"}}));
    t.add(entry("H20", 44, 74, 148, 148, 296, 4000, 78, {{"h20"}}));
    t.add(entry("A100 80GB", 19.5, 156, 312, 312, 0, 2039, 108, {{"a100"}}));
    t.add(entry("A100 80GB PCIe", 19.5, 156, 312, 312, 0, 1935, 108, {{"a100", "pcie"}}));
    t.add(entry("A100 40GB", 19.5, 156, 312, 312, 0, 1555, 108, {{"a100", "40gb"}}));
    t.add(entry("A800", 19.5, 156, 312, 312, 0, 2039, 108, {{"a800"}}));
    t.add(entry("A800 PCIe", 19.5, 156, 312, 312, 0, 1935, 108, {{"a800", "pcie"}}));
    t.add(entry("B200", 75, 1125, 2250, 2250, 4500, 8000, 148, {{"b200"}}));
    t.add(entry("L40S", 91.6, 183, 362, 362, 733, 864, 142, {{"l40s"}}));
    // src/sim's GPU at its defaults (FLARE_SIM_PEAK_TFLOPS 400, FLARE_SIM_MEM_BW_GBPS 2000):
    // the simulated stack is not an H100 and does not claim to be one.
    t.add(
        entry("Flare Simulated GPU", 50, 200, 400, 400, 800, 2000, 132, {{"flare", "simulated"}}));
    return t;
  }();
  return table;
}

const DevicePeak* PeakTable::find(std::string_view cudaName) const {
  const std::vector<std::string> name = words(cudaName);
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    for (const auto& pattern : it->patterns) {
      if (pattern.empty()) continue;
      const bool all = std::all_of(pattern.begin(), pattern.end(), [&](const std::string& w) {
        return std::find(name.begin(), name.end(), w) != name.end();
      });
      if (all) return &*it;
    }
  }
  return nullptr;
}

void PeakTable::add(DevicePeak peak) {
  entries_.push_back(std::move(peak));
}

std::optional<DevicePeak> parseDevicePeak(std::string_view spec, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<DevicePeak> {
    if (error) *error = "bad device peak spec '" + std::string(spec) + "': " + why;
    return std::nullopt;
  };
  const size_t colon = spec.find(':');
  if (colon == std::string_view::npos || colon == 0) return fail("expected NAME:key=value,...");
  DevicePeak d;
  d.name = std::string(spec.substr(0, colon));
  std::string_view rest = spec.substr(colon + 1);
  bool any_peak = false;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return fail("item without '='");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    double v = 0;
    if (key == "match") {
      d.patterns.push_back(words(value));
      if (d.patterns.back().empty()) return fail("empty match");
      continue;
    }
    if (!parseDouble(value, &v)) return fail("bad number for " + std::string(key));
    if (auto dt = parseDtype(key)) {
      d.tflops[static_cast<int>(*dt)] = v;
      any_peak = true;
    } else if (key == "mem_gbps") {
      d.memoryBandwidthGBps = v;
    } else if (key == "sms") {
      if (v < 1 || v > 10000 || v != std::floor(v)) return fail("sms must be 1..10000");
      d.smCount = static_cast<int>(v);
    } else {
      return fail("unknown key " + std::string(key));
    }
  }
  if (!any_peak) return fail("no peak given");
  if (d.patterns.empty()) d.patterns.push_back(words(d.name));
  return d;
}

double gemmFlops(double b, double m, double n, double k) {
  return 2.0 * b * m * n * k;
}

double attentionFlops(double b, double sq, double sk, double heads, double headDim, bool causal,
                      bool backward) {
  double f = 4.0 * b * sq * sk * heads * headDim;
  if (causal) f *= 0.5;
  if (backward) f *= 2.5;
  return f;
}

double tflops(double flops, double seconds) {
  return seconds > 0 ? flops / seconds / 1e12 : 0;
}

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kAllGather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reducescatter";
    case Collective::kAllToAll:
      return "alltoall";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kSendRecv:
      return "sendrecv";
  }
  return "?";
}

std::optional<Collective> parseCollective(std::string_view name) {
  for (Collective c :
       {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
        Collective::kAllToAll, Collective::kBroadcast, Collective::kReduce, Collective::kSendRecv})
    if (name == collectiveName(c)) return c;
  return std::nullopt;
}

double busBandwidthFactor(Collective c, int ranks) {
  if (ranks < 1) return 0;
  const double n = ranks;
  switch (c) {
    case Collective::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return (n - 1) / n;
    case Collective::kBroadcast:
    case Collective::kReduce:
    case Collective::kSendRecv:
      return 1.0;
  }
  return 0;
}

double algBandwidth(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds : 0;
}

double busBandwidth(Collective c, int ranks, double bytes, double seconds) {
  return algBandwidth(bytes, seconds) * busBandwidthFactor(c, ranks);
}

std::vector<AlignmentIssue> gemmAlignmentIssues(int64_t m, int64_t n, int64_t k, int elementBytes) {
  std::vector<AlignmentIssue> out;
  if (elementBytes <= 0) return out;
  // Elements per 128 bytes (element sizes here divide 128; otherwise the lcm's element count).
  const int64_t eb = elementBytes;
  const int64_t quantum = std::lcm(int64_t{128}, eb) / eb;
  for (auto [dim, v] : {std::pair<char, int64_t>{'m', m}, {'n', n}, {'k', k}}) {
    if (v <= 0 || (v * eb) % 128 == 0) continue;
    AlignmentIssue a;
    a.dim = dim;
    a.value = v;
    a.bytes = v * eb;
    const int64_t down = v / quantum * quantum, up = down + quantum;
    a.aligned = (down > 0 && v - down < up - v) ? down : up;
    out.push_back(a);
  }
  return out;
}

std::string gemmAlignmentHint(int64_t m, int64_t n, int64_t k, Dtype dtype) {
  std::string out;
  for (const AlignmentIssue& a : gemmAlignmentIssues(m, n, k, dtypeBytes(dtype))) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s%c=%lld (%lld bytes in %s) is not a multiple of 128 bytes; nearest aligned "
                  "%c=%lld",
                  out.empty() ? "" : "; ", a.dim, static_cast<long long>(a.value),
                  static_cast<long long>(a.bytes), dtypeName(dtype), a.dim,
                  static_cast<long long>(a.aligned));
    out += buf;
  }
  if (!out.empty()) out += " (pad to it for tensor-core-friendly tiles)";
  return out;
}

GemmExpectation expectedGemm(const DevicePeak& device, Dtype dtype, int64_t b, int64_t m, int64_t n,
                             int64_t k, const GemmModelOptions& options) {
  GemmExpectation e;
  const double peak = device.peakTflops(dtype);
  if (b <= 0 || m <= 0 || n <= 0 || k <= 0 || !(peak > 0) || options.tileM <= 0 ||
      options.tileN <= 0)
    return e;
  const double tm = options.tileM, tn = options.tileN;
  const double mt = std::ceil(static_cast<double>(m) / tm),
               nt = std::ceil(static_cast<double>(n) / tn);
  e.flops = gemmFlops(static_cast<double>(b), static_cast<double>(m), static_cast<double>(n),
                      static_cast<double>(k));
  const double eb = dtypeBytes(dtype);
  e.bytes = eb * static_cast<double>(b) *
            (static_cast<double>(m) * static_cast<double>(k) +
             static_cast<double>(k) * static_cast<double>(n) +
             static_cast<double>(m) * static_cast<double>(n));
  e.tileEfficiency = static_cast<double>(m) * static_cast<double>(n) / (mt * tm * nt * tn);
  const double tiles = mt * nt * static_cast<double>(b);
  const double sms = device.smCount > 0 ? device.smCount : 1;
  e.waveEfficiency = tiles / (std::ceil(tiles / sms) * sms);
  e.alignEfficiency =
      gemmAlignmentIssues(m, n, k, static_cast<int>(eb)).empty() ? 1.0 : options.misalignedFactor;
  e.computeTflops =
      peak * options.baseEfficiency * e.tileEfficiency * e.waveEfficiency * e.alignEfficiency;
  const double intensity = e.flops / e.bytes;  // FLOP per byte
  e.memoryTflops = device.memoryBandwidthGBps > 0
                       ? intensity * device.memoryBandwidthGBps * 1e9 / 1e12
                       : e.computeTflops;
  e.memoryBound = e.memoryTflops < e.computeTflops;
  e.expectedTflops = std::min(e.computeTflops, e.memoryTflops);
  return e;
}

}  // namespace flare::stats
