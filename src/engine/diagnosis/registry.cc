// The built-in detectors, in the order they run: one line each. A detector's diagnoses of equal
// severity keep this order, and a detector sees those of the detectors above it
// (DetectorView::earlier: the summary-mode gpu_slow skips ranks the raw one named; issue_stall
// defers to gpu_slow). Each `X(Name)` is a `std::unique_ptr<Detector> make<Name>Detector()`
// defined in the detector's own file.
#include <memory>

#include "src/engine/diagnosis/detector.h"
#include "src/engine/diagnosis/detectors.h"

#define FLARE_DETECTORS(X)                                    \
  X(SharedGpu)              /* shared_gpu.cc */               \
  X(GpuSlow)                /* gpu_slow.cc */                 \
  X(GpuSlowFromSummaries)   /* gpu_slow.cc */                 \
  X(LinkSlow)               /* link_slow.cc */                \
  X(IssueStall)             /* issue_stall.cc */              \
  X(SlowSteps)              /* slow_steps.cc */               \
  X(IssueLatencyRegression) /* issue_latency_regression.cc */ \
  X(Void)                   /* void_percentages.cc */         \
  X(UnoptimizedGemm)        /* unoptimized_gemm.cc */

namespace flare::engine {

#define FLARE_DECLARE_DETECTOR(Name) std::unique_ptr<Detector> make##Name##Detector();
FLARE_DETECTORS(FLARE_DECLARE_DETECTOR)
#undef FLARE_DECLARE_DETECTOR

namespace {

DetectorRegistry makeBuiltin() {
  DetectorRegistry registry;
#define FLARE_ADD_DETECTOR(Name) registry.add(make##Name##Detector());
  FLARE_DETECTORS(FLARE_ADD_DETECTOR)
#undef FLARE_ADD_DETECTOR
  return registry;
}

}  // namespace

const DetectorRegistry& builtinDetectors() {
  static const DetectorRegistry registry = makeBuiltin();
  return registry;
}

std::vector<Diagnosis> diagnose(const JobModel& job, const DiagnoseOptions& options,
                                const JobModel* baseline, const History* history,
                                std::vector<DetectorRun>* runs) {
  return runDetectors(builtinDetectors(), job, options, baseline, history, runs);
}

}  // namespace flare::engine
