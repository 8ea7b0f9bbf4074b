// Change points in a step-time series (fail-slows are changes against earlier steps of the same
// job) and jitter windows:
//   - detectMeanShifts: offline binary segmentation on mean shifts. A segment [s, e) is split at
//     the t maximizing the drop in squared error, gain = n1·n2/n · (mean1 − mean2)², when the gain
//     exceeds the BIC-like penalty β = penaltyFactor · σ̂² · ln n; σ̂ is the noise level,
//     estimated robustly from first differences (1.4826·MAD(Δx)/√2, so steps do not inflate it;
//     IQR(Δx)/1.349/√2 when the MAD is 0, then SD(Δx)/√2). Then the change points are pruned
//     against the same penalty with σ re-estimated from the residuals around the segment means
//     (the larger of the two), weakest first; each residual counts at most 3 robust SDs, so
//     that one outlier does not prune a real shift.
//   - CusumDetector: online two-sided CUSUM (Page) on standardized samples, for the daemon's
//     per-step stream.
//   - rollingCv / detectJitter: rolling coefficient of variation over a window; runs above a
//     threshold are jitter windows. A mean shift also raises the CV of the windows that straddle
//     it (for one window length): report jitter apart from detected shifts.
//
// Threading: the functions are pure; a CusumDetector is a plain object for one thread.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace flare::stats {

struct ChangePoint {
  size_t index = 0;      // first sample of the new segment
  double before = 0;     // mean of the segment before
  double after = 0;      // mean of the segment from `index`
  double magnitude = 0;  // after − before
  double relative = 0;   // (after − before) / |before| (0 when before = 0)
};

struct SegmentationOptions {
  // β = factor · σ̂² · ln n. 2 is the classic SIC/BIC for one change; binary segmentation tests
  // the best of many split points in every segment, so a stricter 4 keeps false alarms on pure
  // noise rare (a split still needs only a 0.65σ shift at the middle of 200 steps).
  double penaltyFactor = 4.0;
  size_t minSegment = 3;           // no segment shorter than this
  double minRelativeSigma = 1e-3;  // σ̂ ≥ this × |median|: smaller shifts are not changes
  size_t maxChangePoints = 16;
};

// Robust noise level of x: 1.4826 · MAD(first differences) / √2, falling back to the IQR and
// then the SD of the differences when the MAD is 0. 0 for n < 3.
double robustNoiseSigma(std::span<const double> x);

// Mean-shift change points of x, ascending index. x must be finite: a series with a non-finite
// value yields none (filter missing steps out first).
std::vector<ChangePoint> detectMeanShifts(std::span<const double> x,
                                          const SegmentationOptions& options = {});

struct CusumOptions {
  size_t warmup = 20;              // samples that set the baseline mean and σ
  double slack = 0.5;              // k, in σ: drift tolerated per sample
  double threshold = 5.0;          // h, in σ
  double minRelativeSigma = 1e-3;  // σ ≥ this × |baseline|
};

struct CusumAlarm {
  size_t index = 0;        // sample (0-based, counted since construction) that raised it
  size_t changeIndex = 0;  // estimated first sample of the change (maximum likelihood, below)
  double baseline = 0;     // warm-up mean
  double shiftedMean = 0;  // mean of the samples from changeIndex to index
  double magnitude = 0;    // shiftedMean − baseline
};

// Two-sided CUSUM. At an alarm the change's first sample is estimated by maximum likelihood for
// a shift from the known baseline: the t maximizing (Σ_{j≥t} (x_j − μ0))² / (n − t) with the
// alarm's sign, over the samples since the baseline was learned (at most the last 4096).
// After an alarm the detector re-learns its baseline from the next `warmup`
// samples (the new level), so one step change raises one alarm.
class CusumDetector {
 public:
  explicit CusumDetector(const CusumOptions& options = {});
  // Feeds the next sample; returns an alarm when it crosses the threshold. Non-finite samples
  // are ignored (and still counted in the index).
  std::optional<CusumAlarm> add(double x);
  size_t samples() const { return n_; }

 private:
  CusumOptions options_;
  size_t n_ = 0;
  std::vector<double> warm_;
  double mu_ = 0, sigma_ = 0;
  double up_ = 0, down_ = 0;
  std::vector<std::pair<size_t, double>> history_;  // (index, sample) since the baseline
};

// cv[i] = stddev/mean (n−1 denominator) of x[i−window+1 .. i]; NaN for i < window−1 or a
// window whose mean is 0.
std::vector<double> rollingCv(std::span<const double> x, size_t window);

struct JitterOptions {
  size_t window = 20;
  double cvThreshold = 0.05;
};

struct JitterWindow {
  size_t begin = 0;  // first sample covered by a window above the threshold
  size_t end = 0;    // one past the last
  double maxCv = 0;
  size_t maxAt = 0;  // last sample of the window with the largest CV
};

// Runs of windows whose CV exceeds the threshold, merged where they overlap.
std::vector<JitterWindow> detectJitter(std::span<const double> x,
                                       const JitterOptions& options = {});

}  // namespace flare::stats
