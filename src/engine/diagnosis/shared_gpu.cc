// Detector shared_gpu: ranks that run on one GPU (the same DeviceInfo.uuid; signals::sharedGpus).
// Two processes on one GPU time-slice it: each one's kernels take longer and its GPU idles while
// the other runs, so its GPU times, void percentages and GEMM rates describe the sharing, not the
// rank. In a training job that is a placement fault (every local rank on device 0: a missing
// torch.cuda.set_device(LOCAL_RANK), a wrong CUDA_VISIBLE_DEVICES from the launcher); on a test
// machine it may be on purpose. Either way the diagnosis says so, routed to infrastructure, and
// the orchestrator (runDetectors, detector.cc) leaves out the GPU-time findings (gpu_slow,
// unoptimized_gemm, void_minority) whose ranks all share a GPU, saying how many in the run's
// note. Host-side findings (issue_stall, void_inter, ...) stand.
//
// Both modes: the UUID arrives with the rank's DeviceInfo (RecordBatch.device, the rank table).
// A rank whose UUID is unknown (an old hook, a spool without it) is never counted as sharing.
#include <memory>
#include <string>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/engine/diagnosis/signals.h"

namespace flare::engine {
namespace {

class SharedGpuDetector final : public Detector {
 public:
  std::string_view name() const override { return "shared_gpu"; }
  std::vector<std::string_view> kinds() const override { return {"shared_gpu"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kWhole;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    const JobModel& job = view.job();
    size_t known = 0;
    for (const auto& [rank, r] : job.ranks()) known += r.device_uuid.empty() ? 0 : 1;
    std::vector<Diagnosis> out;
    for (const signals::SharedGpu& g : signals::sharedGpus(job)) {
      const RankData& first = job.ranks().at(g.ranks.front());
      const double n = static_cast<double>(g.ranks.size());
      Diagnosis d;
      d.kind = "shared_gpu";
      d.team = Team::kInfrastructure;
      d.cause = "GPU shared by ranks";
      d.ranks = g.ranks;
      d.severity = 1.0 - 1.0 / n;  // each rank's share of the GPU is at most 1/n
      d.summary = "ranks " + signals::rankList(g.ranks) + " run on one GPU (" + g.uuid +
                  (first.host.empty() ? "" : " on " + first.host) +
                  "): they time-slice it, so their GPU times hold each other's work; check the "
                  "device each rank selects (torch.cuda.set_device(LOCAL_RANK), "
                  "CUDA_VISIBLE_DEVICES); GPU-time findings on them are left out";
      d.evidence.push_back({"device_uuid",
                            std::to_string(g.ranks.size()) + " ranks report GPU " + g.uuid +
                                (first.device_name.empty() ? "" : " (" + first.device_name + ")"),
                            n, 1});
      out.push_back(std::move(d));
    }
    // What could not be checked: ranks whose GPU is unknown (nothing to say when all are known).
    const size_t unknown = job.ranks().size() - known;
    if (known == 0) {
      view.note("no rank reported its GPU's UUID");
    } else if (unknown > 0) {
      view.note(std::to_string(unknown) + " of " + std::to_string(job.ranks().size()) +
                " ranks reported no GPU UUID");
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeSharedGpuDetector() {
  return std::make_unique<SharedGpuDetector>();
}

}  // namespace flare::engine
