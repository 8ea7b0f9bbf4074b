// Detector unoptimized_gemm: GEMM shapes that run well below what alike aligned GEMMs of the
// same job reach (same dtype, flops per call and arithmetic intensity within a factor), or below
// the shape's expected TFLOPS on the ranks' device (stats/perf_model.h), after the ranks'
// warm-up; raw ops and kernel summaries alike. One diagnosis for the job, every slow shape as
// evidence, with an alignment hint where a dimension is misaligned (docs/metrics.md).

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/stats/perf_model.h"
#include "src/stats/quantile.h"

namespace flare::engine {
namespace {

using namespace signals;

// A GEMM's flops per call from its signature's shape [m, n, k, batch] (the hook's count).
uint64_t gemmFlops(const flare::v1::Signature& sig) {
  if (sig.kind() != flare::v1::OP_KIND_GEMM || sig.shape_size() < 3) return 0;
  double f =
      2.0 * static_cast<double>(sig.shape(0)) * static_cast<double>(sig.shape(1)) *
      static_cast<double>(sig.shape(2)) *
      (sig.shape_size() >= 4 ? static_cast<double>(std::max<int64_t>(sig.shape(3), 1)) : 1.0);
  return f > 0 && f < 1.8e19 ? static_cast<uint64_t>(f) : 0;
}

std::optional<stats::Dtype> statsDtype(flare::v1::DType t) {
  switch (t) {
    case flare::v1::DTYPE_F32:
      return stats::Dtype::kFp32;
    case flare::v1::DTYPE_F16:
      return stats::Dtype::kFp16;
    case flare::v1::DTYPE_BF16:
      return stats::Dtype::kBf16;
    case flare::v1::DTYPE_F8E4M3:
    case flare::v1::DTYPE_F8E5M2:
      return stats::Dtype::kFp8;
    default:
      return std::nullopt;
  }
}

// The duration at quantile `q` of (duration, how many ops took it) pairs: the smallest value
// whose cumulative count reaches q × total. Reorders `v`; 0 when empty.
double weightedQuantile(std::vector<std::pair<double, uint64_t>>& v, uint64_t total, double q) {
  if (v.empty() || total == 0) return 0;
  std::sort(v.begin(), v.end());
  const double target = std::max(1.0, std::ceil(q * static_cast<double>(total)));
  uint64_t seen = 0;
  for (const auto& [value, count] : v) {
    seen += count;
    if (static_cast<double>(seen) >= target) return value;
  }
  return v.back().first;
}

// A GEMM's transposes from its signature's layout ("tn lda=..." -> "tn"); empty when the layout
// does not say (a registered kernel, an older rank).
std::string transposes(const flare::v1::Signature& sig) {
  const std::string& l = sig.layout();
  const size_t end = l.find_first_of(" ,");
  const std::string t = l.substr(0, end);
  if (t.size() != 2) return std::string();
  for (const char c : t)
    if (c != 'n' && c != 't' && c != 'c') return std::string();
  return t;
}

void detectUnoptimized(const JobModel& job, const DiagnoseOptions& opt,
                       std::vector<Diagnosis>* out) {
  // Per GEMM signature after the ranks' warm-up: the TFLOPS of its median call (what every call
  // pays: misalignment) and of its fast calls (the 10th percentile: what the kernel cuBLAS picked
  // for the shape reaches when nothing around it slows the GPU down), the GPU time, the flops
  // of one call and its arithmetic intensity.
  struct Stat {
    double tflops = 0;       // median call
    double fast_tflops = 0;  // 10th-percentile duration
    double time = 0;
    double flops = 0;
    double intensity = 0;  // flops per byte of A, B and C; 0 when the shape is unknown
    bool misaligned = false;
  };
  std::map<uint32_t, Stat> stats;
  // Per GEMM signature: (duration, how many ops took it) — raw ops one each; in MODE_SUMMARY
  // each cluster's median for its count — the total time, and the flops of one call.
  struct Durations {
    std::vector<std::pair<double, uint64_t>> values;
    uint64_t count = 0;
    double time = 0;
    uint64_t flops = 0;
  };
  auto measure = [&](uint32_t sig_id, Durations& d) {
    if (d.count < static_cast<uint64_t>(std::max(opt.min_samples, 1))) return;
    const auto& sig = job.signatures()[sig_id];
    const double flops = static_cast<double>(sig.flops_per_call() ? sig.flops_per_call() : d.flops);
    const double m = stats::weightedMedian(d.values, d.count);
    const double fast = weightedQuantile(d.values, d.count, 0.1);
    if (m <= 0 || fast <= 0 || flops <= 0) return;
    Stat st{flops / m / 1e3, flops / fast / 1e3, d.time, flops, 0, false};
    const auto dt = statsDtype(sig.dtype());
    if (dt && sig.shape_size() >= 3) {
      const double b = sig.shape_size() >= 4 ? static_cast<double>(sig.shape(3)) : 1.0;
      const double mm = static_cast<double>(sig.shape(0)), nn = static_cast<double>(sig.shape(1)),
                   kk = static_cast<double>(sig.shape(2));
      const double bytes = stats::dtypeBytes(*dt) * b * (mm * kk + kk * nn + mm * nn);
      if (bytes > 0) st.intensity = flops / bytes;
      st.misaligned = !stats::gemmAlignmentIssues(sig.shape(0), sig.shape(1), sig.shape(2),
                                                  stats::dtypeBytes(*dt))
                           .empty();
    }
    stats[sig_id] = st;
  };
  // Raw ops (a raw-mode window holds at most --max-ops-per-rank a rank), after the rank's
  // warm-up (its first step: lazy module loading, cuBLAS heuristics and cold caches make a
  // shape's first calls 10–1000× slower).
  std::map<uint32_t, Durations> durations;
  for (const auto& [rank, r] : job.ranks()) {
    const int64_t warm = warmupEnd(job, rank);
    for (const Op& op : r.ops) {
      const auto& sig = job.signatures()[op.sig];
      if (sig.kind() != flare::v1::OP_KIND_GEMM || op.flops < opt.unoptimized_min_flops) continue;
      if (op.start < warm) continue;
      Durations& d = durations[op.sig];
      d.values.emplace_back(static_cast<double>(op.duration()), 1);
      d.count += 1;
      d.time += static_cast<double>(op.duration());
      if (d.flops == 0) d.flops = op.flops;
    }
  }
  // Kernel summaries, one GEMM signature at a time over every rank (each rank's windows in the
  // order they arrived, those of its warm-up left out): only one signature's cluster medians are
  // held at once.
  std::vector<char> gemm(job.signatures().size());
  for (size_t i = 0; i < gemm.size(); ++i)
    gemm[i] = job.signatures()[i].kind() == flare::v1::OP_KIND_GEMM;
  const SummaryIndex index = indexSummaries(job, gemm, true);
  for (const uint32_t sig_id : index.sigs) {
    const auto& sig = job.signatures()[sig_id];
    auto from_ops = durations.extract(sig_id);  // the signature's raw ops, if any, come first
    Durations d = from_ops ? std::move(from_ops.mapped()) : Durations{};
    for (const SummaryIndex::Rank& rw : index.ranks) {
      const SummaryIndex::Run* run = rw.find(sig_id);
      if (run == nullptr) continue;
      for (uint32_t k = run->hi; k-- > run->lo;) {
        const SummaryWindow& w = rw.window(k);
        // The flops of one call: the summary's total over its count (else the hook's GEMM
        // count, 2·m·n·k·batch of the shape).
        const uint64_t n_ops = w.count();
        const uint64_t flops = w.flops > 0 && n_ops > 0
                                   ? static_cast<uint64_t>(w.flops / static_cast<double>(n_ops))
                                   : gemmFlops(sig);
        if (flops < opt.unoptimized_min_flops) continue;
        for (const WindowCluster& c : w.clusters) {
          d.values.emplace_back(c.p50, c.count);
          d.count += c.count;
          d.time += c.sum;
        }
        if (d.flops == 0) d.flops = flops;
      }
    }
    measure(sig_id, d);
  }
  for (auto& [sig_id, d] : durations) measure(sig_id, d);
  // The reference for a shape: the best of the job's *alike* aligned GEMMs — same dtype and
  // transposes, flops per call and arithmetic intensity each within a factor of
  // `unoptimized_alike_factor` — by the same statistic. A small or thin GEMM cannot reach what
  // the job's largest one does (too few tiles for the SMs, too little work per byte), so it is
  // only held to shapes like it; and cuBLAS picks its kernels per layout: on the H200 a healthy
  // GPT's [768,8192,768] ran at 263 TFLOPS as tn and 491 as nn (tests/fixtures/gpu,
  // healthy-small), which is the library's, not the job's to fix.
  auto same_layout = [&](uint32_t a, uint32_t b) {
    const std::string ta = transposes(job.signatures()[a]), tb = transposes(job.signatures()[b]);
    return ta.empty() || tb.empty() || ta == tb;
  };
  auto alike = [&](uint32_t a, const Stat& sa, uint32_t b, const Stat& sb) {
    if (a == b || sb.misaligned || !same_layout(a, b)) return false;
    if (job.signatures()[a].dtype() != job.signatures()[b].dtype()) return false;
    const double f = opt.unoptimized_alike_factor;
    auto near = [f](double x, double y) { return x > 0 && y > 0 && x <= f * y && y <= f * x; };
    if (!near(sa.flops, sb.flops)) return false;
    return sa.intensity == 0 || sb.intensity == 0 || near(sa.intensity, sb.intensity);
  };
  // A misaligned shape is also held to aligned GEMMs that are *no easier* than it, though not
  // alike: same dtype, fewer flops per call (down to 1/`unoptimized_harder_factor` of its) and no
  // more flops per byte. Such a GEMM has fewer tiles to fill the GPU with and less work per byte
  // moved, so the larger shape, aligned, would reach at least its TFLOPS; a misaligned FFN of a
  // small model (flops 2.7× its attention projections') was otherwise judged against the device
  // alone.
  auto harder = [&](uint32_t a, const Stat& sa, uint32_t b, const Stat& sb) {
    if (a == b || sb.misaligned || sa.intensity <= 0 || sb.intensity <= 0 || !same_layout(a, b))
      return false;
    if (job.signatures()[a].dtype() != job.signatures()[b].dtype()) return false;
    return sb.flops <= sa.flops && sb.flops * opt.unoptimized_harder_factor >= sa.flops &&
           sb.intensity <= sa.intensity;
  };
  // One diagnosis for the job (duplicates merged): every slow GEMM shape as evidence, the ones
  // with the most GPU time first.
  struct Slow {
    uint32_t sig;
    double tflops, ref, time;
    std::string hint;
    std::string device;   // set when the reference is the device's expected TFLOPS
    bool harder = false;  // the reference is a smaller aligned GEMM, no easier (not alike)
  };
  // The device of the job's ranks (the lowest rank that reported one) in the peak table.
  const stats::PeakTable& peaks = opt.peaks != nullptr ? *opt.peaks : stats::PeakTable::builtin();
  const stats::DevicePeak* device = nullptr;
  for (const auto& [rank, r] : job.ranks()) {
    if (!r.device_name.empty()) {
      device = peaks.find(r.device_name);
      break;
    }
  }
  std::vector<Slow> slow;
  for (const auto& [sig_id, st] : stats) {
    const auto& sig = job.signatures()[sig_id];
    double ref_median = 0, ref_fast = 0, ref_harder = 0;
    for (const auto& [other_id, other] : stats) {
      if (alike(sig_id, st, other_id, other)) {
        ref_median = std::max(ref_median, other.tflops);
        ref_fast = std::max(ref_fast, other.fast_tflops);
      } else if (st.misaligned && harder(sig_id, st, other_id, other)) {
        ref_harder = std::max(ref_harder, other.tflops);
      }
    }
    const bool by_harder = ref_harder > ref_median;  // misaligned shapes only
    if (by_harder) ref_median = ref_harder;
    // A misaligned shape (a dimension whose bytes are not a multiple of 128): every call pays,
    // so its median call is held to `unoptimized_misaligned_ratio` of alike aligned shapes; the
    // fix (pad the dimension) is the team's to make. An aligned shape only when even its fast
    // calls are below `unoptimized_ratio` of theirs (on a real GPU alike aligned shapes differ by
    // up to ~35%: layout, clock ramp after an idle GPU).
    double value = 0, ref = 0;
    if (st.misaligned && ref_median > 0 &&
        st.tflops < opt.unoptimized_misaligned_ratio * ref_median) {
      value = st.tflops;
      ref = ref_median;
    } else if (!st.misaligned && ref_fast > 0 &&
               st.fast_tflops < opt.unoptimized_ratio * ref_fast) {
      value = st.fast_tflops;
      ref = ref_fast;
    }
    const bool below_alike = ref > 0;
    // Against the device: the shape's expected TFLOPS ([m, n, k, batch] as the hook records).
    double expected = 0;
    const auto dt = statsDtype(sig.dtype());
    if (device != nullptr && dt && sig.shape_size() >= 3) {
      expected = stats::expectedGemm(*device, *dt, sig.shape_size() >= 4 ? sig.shape(3) : 1,
                                     sig.shape(0), sig.shape(1), sig.shape(2))
                     .expectedTflops;
    }
    // A shape expected to take less than unoptimized_device_min_expected_ns is not judged
    // against the device: its event-timed calls may hold the library's host time.
    const bool long_enough =
        expected > 0 && st.flops / (expected * 1e3) >= opt.unoptimized_device_min_expected_ns;
    const bool below_device = long_enough && st.tflops < opt.unoptimized_peak_ratio * expected;
    if (!below_alike && !below_device) continue;
    if (!below_alike) {  // the evidence then names the device's expectation
      value = st.tflops;
      ref = expected;
    }
    // Alignment hint: a dimension whose bytes are not a multiple of 128.
    std::string hint;
    if (dt && sig.shape_size() >= 3)
      hint = stats::gemmAlignmentHint(sig.shape(0), sig.shape(1), sig.shape(2), *dt);
    slow.push_back({sig_id, value, ref, st.time, hint, below_alike ? std::string() : device->name,
                    below_alike && by_harder});
  }
  if (slow.empty()) return;
  std::sort(slow.begin(), slow.end(), [](const Slow& a, const Slow& b) { return a.time > b.time; });
  Diagnosis d;
  d.kind = "unoptimized_gemm";
  d.team = Team::kInfrastructure;
  d.cause = "kernel shape";
  double worst = 1.0;
  for (const Slow& x : slow) worst = std::min(worst, x.tflops / x.ref);
  d.severity = 1.0 - worst;
  for (const Slow& x : slow) {
    const auto& sig = job.signatures()[x.sig];
    d.evidence.push_back(
        {"tflops",
         sig.name() + " " + shapeText(sig) + " " + sig.layout() + ": " +
             fmtNum(x.tflops, "TFLOPS") + " vs " + fmtNum(x.ref, "TFLOPS") +
             (!x.device.empty() ? " expected for this shape on " + x.device
              : x.harder        ? std::string(" for smaller aligned GEMMs of the job (no more "
                                                     "flops per byte)")
                                : std::string(" for alike GEMMs of the job")) +
             (x.hint.empty() ? std::string() : " — " + x.hint),
         x.tflops, x.ref});
  }
  const Slow& top = slow.front();
  d.summary = std::to_string(slow.size()) + " GEMM shape" + (slow.size() > 1 ? "s run" : " runs") +
              " at " + fmtPct(worst) + "–" +
              fmtPct(std::max_element(slow.begin(), slow.end(),
                                      [](const Slow& a, const Slow& b) {
                                        return a.tflops / a.ref < b.tflops / b.ref;
                                      })
                         ->tflops /
                     top.ref) +
              (!top.device.empty() ? " of the TFLOPS expected for the shape on " + top.device
               : top.harder        ? std::string(" of what smaller aligned GEMMs of the job reach")
                                   : std::string(" of what alike GEMMs of the job reach")) +
              (top.hint.empty() ? std::string() : "; e.g. " + top.hint);
  out->push_back(std::move(d));
}

class UnoptimizedGemmDetector final : public Detector {
 public:
  std::string_view name() const override { return "unoptimized_gemm"; }
  std::vector<std::string_view> kinds() const override { return {"unoptimized_gemm"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kRecent;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out;
    detectUnoptimized(view.job(), view.options(), &out);
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeUnoptimizedGemmDetector() {
  return std::make_unique<UnoptimizedGemmDetector>();
}

}  // namespace flare::engine
