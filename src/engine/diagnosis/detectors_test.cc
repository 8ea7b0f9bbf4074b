#include "src/engine/diagnosis/detectors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "src/engine/diagnosis/history.h"
#include "src/engine/diagnosis/job_metrics.h"
#include "src/engine/diagnosis/job_model.h"

namespace flare::engine {
namespace {

// 8 ranks, 24 steps of 10 ms marked by StepMarkers, 6 GEMMs of 1 ms per step and rank. In
// `slow_steps` rank 3's GEMMs take `factor` ms and every rank's step grows by the difference
// (the others wait for it at the step's end).
JobModel jitteryJob(const std::set<size_t>& slow_steps, double factor, double noise = 0.0) {
  JobModel job;
  const int64_t ms = 1'000'000;
  for (int rank = 0; rank < 8; ++rank) {
    flare::v1::RecordBatch b;
    auto* sig = b.add_signatures();
    sig->set_id(1);
    sig->set_name("cublasGemmEx");
    sig->set_kind(flare::v1::OP_KIND_GEMM);
    sig->set_dtype(flare::v1::DTYPE_BF16);
    sig->add_shape(4096);
    sig->add_shape(4096);
    sig->add_shape(4096);
    sig->set_flops_per_call(2ull * 4096 * 4096 * 4096);
    int64_t t = 0;
    for (size_t step = 0; step < 24; ++step) {
      auto* st = b.add_steps();
      st->set_step(step);
      st->set_start_ns(t);
      const bool slow = slow_steps.count(step) > 0;
      const int64_t gemm = slow && rank == 3 ? static_cast<int64_t>(factor * ms) : ms;
      for (int i = 0; i < 6; ++i) {
        auto* k = b.add_kernels();
        k->set_signature_id(1);
        k->set_stream_id(7);
        k->set_issue_ns(t + i * ms / 4);
        k->set_start_ns(t + ms + i * gemm);
        k->set_end_ns(t + ms + (i + 1) * gemm);
      }
      const double wiggle =
          noise * (static_cast<int>((step * 7919 + 13) % 11) - 5) / 5.0;  // deterministic ±noise
      t += static_cast<int64_t>(10 * ms * (1 + wiggle)) +
           (slow ? static_cast<int64_t>(6 * (factor - 1) * ms) : 0);
    }
    job.addBatch(rank, b);
  }
  return job;
}

TEST(Jitter, IntermittentlySlowGpuIsFoundInItsSpikeSteps) {
  const std::set<size_t> slow = {5, 9, 13, 17, 21};
  const JobModel job = jitteryJob(slow, 1.5);
  const auto j = findJitter(job, DiagnoseOptions{});
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(std::set<size_t>(j->steps.begin(), j->steps.end()), slow);
  EXPECT_NEAR(j->median_ns, 10e6, 1e3);  // 18 of 23 steps at 10 ms
  EXPECT_NEAR(j->spike_ns, 13e6, 1e3);   // + 6 × 0.5 ms
  // Over the whole window rank 3's median GEMM is the healthy 1 ms (5 slow steps of 23): only the
  // spike steps show it.
  const auto found = diagnose(job, DiagnoseOptions{});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "gpu_slow");
  EXPECT_EQ(found[0].ranks, std::vector<int>{3});
  ASSERT_FALSE(found[0].evidence.empty());
  EXPECT_EQ(found[0].evidence[0].metric, "step_time_jitter");
  EXPECT_NE(found[0].evidence[0].text.find("5 steps (5,9,13,17,21)"), std::string::npos);
  // The restricted model holds those steps only.
  const JobModel only = job.onlySteps(j->steps);
  EXPECT_EQ(only.ranks().at(3).ops.size(), 5u * 6u);
}

// ---- shared_gpu: ranks on one GPU ------------------------------------------------------------

// Rank 3's GEMMs 1.5x slower in every step: gpu_slow names it, unless rank 3 shares its GPU
// (the same UUID) with other ranks, where its GPU time holds theirs.
TEST(SharedGpu, RanksOnOneGpuAreNamedAndTheirGpuTimeFindingsLeftOut) {
  std::set<size_t> all;
  for (size_t i = 0; i < 24; ++i) all.insert(i);
  auto withUuids = [&all](const std::map<int, std::string>& uuid) {
    JobModel job = jitteryJob(all, 1.5);
    for (const auto& [rank, u] : uuid) job.setRankInfo(rank, "node1", "", u);
    return job;
  };
  std::map<int, std::string> distinct;
  for (int r = 0; r < 8; ++r) distinct[r] = "GPU-" + std::to_string(r);
  std::vector<DetectorRun> runs;
  auto found = diagnose(withUuids(distinct), DiagnoseOptions{}, nullptr, nullptr, &runs);
  ASSERT_EQ(found.size(), 1u) << diagnosesToJson(found);
  EXPECT_EQ(found[0].kind, "gpu_slow");
  for (const DetectorRun& r : runs) {
    if (r.name == "shared_gpu") {
      EXPECT_EQ(r.note, "");  // 8 known GPUs: nothing to say
    }
  }

  // Ranks 0-3 on one GPU: shared_gpu names them (infrastructure), gpu_slow on rank 3 is left out
  // and its run says so.
  std::map<int, std::string> shared = distinct;
  for (int r = 0; r < 4; ++r) shared[r] = "GPU-a";
  found = diagnose(withUuids(shared), DiagnoseOptions{}, nullptr, nullptr, &runs);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "shared_gpu");
  EXPECT_EQ(found[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(found[0].team, Team::kInfrastructure);
  EXPECT_DOUBLE_EQ(found[0].severity, 0.75);
  EXPECT_NE(found[0].summary.find("GPU-a on node1"), std::string::npos) << found[0].summary;
  bool noted = false;
  for (const DetectorRun& r : runs) {
    noted =
        noted || r.note.find("left out 1 finding on ranks that share a GPU") != std::string::npos;
  }
  EXPECT_TRUE(noted);

  // Ranks 0-1 share, rank 3 has its own GPU: its slowness is its own and stays named.
  std::map<int, std::string> pair = distinct;
  pair[1] = "GPU-0";
  found = diagnose(withUuids(pair), DiagnoseOptions{}, nullptr, nullptr, &runs);
  std::set<std::string> kinds;
  for (const Diagnosis& d : found) kinds.insert(d.kind);
  EXPECT_EQ(kinds, (std::set<std::string>{"shared_gpu", "gpu_slow"}));
  for (const Diagnosis& d : found) {
    if (d.kind == "gpu_slow") {
      EXPECT_EQ(d.ranks, std::vector<int>{3});
    } else if (d.kind == "shared_gpu") {
      EXPECT_EQ(d.ranks, (std::vector<int>{0, 1}));
    }
  }
}

TEST(Jitter, SteadyNoiseAndLevelShiftsAreNotJitter) {
  // ±4% step-time noise and no slow step: nothing.
  EXPECT_FALSE(findJitter(jitteryJob({}, 1.0, 0.04), DiagnoseOptions{}).has_value());
  EXPECT_TRUE(diagnose(jitteryJob({}, 1.0, 0.04), DiagnoseOptions{}).empty());
  // Two spikes: below jitter_min_spikes.
  EXPECT_FALSE(findJitter(jitteryJob({6, 15}, 1.5), DiagnoseOptions{}).has_value());
  // Slow from step 10 on: a level shift (the fail-slow change point's job), not jitter.
  std::set<size_t> tail;
  for (size_t s = 10; s < 24; ++s) tail.insert(s);
  EXPECT_FALSE(findJitter(jitteryJob(tail, 1.5), DiagnoseOptions{}).has_value());
}

// ---- link_slow: culprit versus victims ----------------------------------------------------------

// A communicator's all-reduce, once a step: its hash, members and size in bytes.
struct Comm {
  uint64_t hash;
  std::vector<int> members;
  double bytes;
};

// `ranks` ranks, 12 steps of the communicators' all-reduces. A collective takes 8 µs + bytes·f /
// (100 GB/s × the slowest member's link factor), ±1% deterministic noise per instance. All
// all-reduces share one signature, or with `signature_per_size` one each size (shape: the bf16
// elements), as a data-parallel job's gradient buckets have.
JobModel collectivesJob(int ranks, const std::vector<Comm>& comms,
                        const std::map<int, double>& link_factor, bool signature_per_size = false) {
  const int steps = 12;
  const int64_t ms = 1'000'000;
  auto factor = [&](int r) {
    auto it = link_factor.find(r);
    return it == link_factor.end() ? 1.0 : it->second;
  };
  std::map<double, uint32_t> sig_of;  // bytes -> signature id
  for (const Comm& comm : comms) {
    sig_of.try_emplace(comm.bytes,
                       signature_per_size ? static_cast<uint32_t>(sig_of.size() + 1) : 1);
  }
  std::vector<flare::v1::RecordBatch> batches(ranks);
  for (int r = 0; r < ranks; ++r) {
    std::set<uint32_t> added;
    for (const auto& [bytes, id] : sig_of) {
      if (!added.insert(id).second) continue;
      auto* sig = batches[r].add_signatures();
      sig->set_id(id);
      sig->set_name("ncclAllReduce");
      sig->set_kind(flare::v1::OP_KIND_COLLECTIVE);
      sig->set_collective(flare::v1::COLLECTIVE_KIND_ALL_REDUCE);
      if (signature_per_size) sig->add_shape(static_cast<int64_t>(bytes / 2));
    }
  }
  std::map<uint64_t, uint64_t> seq;  // per communicator hash
  for (int step = 0; step < steps; ++step) {
    const int64_t t0 = step * 100 * ms;
    for (int r = 0; r < ranks; ++r) {
      auto* st = batches[r].add_steps();
      st->set_step(static_cast<uint64_t>(step));
      st->set_start_ns(t0);
    }
    for (size_t c = 0; c < comms.size(); ++c) {
      const Comm& comm = comms[c];
      double slowest = 1.0;
      for (int r : comm.members) slowest = std::min(slowest, factor(r));
      const double n = static_cast<double>(comm.members.size());
      const double wiggle = 0.01 * (static_cast<int>((step * 7919 + c * 104729) % 11) - 5) / 5.0;
      const double ns = (8e3 + comm.bytes * 2 * (n - 1) / n / (100.0 * slowest)) * (1 + wiggle);
      const int64_t start = t0 + 10 * ms + static_cast<int64_t>(c) * 20 * ms;
      const uint64_t instance = seq[comm.hash]++;
      for (int r : comm.members) {
        auto* k = batches[r].add_kernels();
        k->set_signature_id(sig_of.at(comm.bytes));
        k->set_stream_id(9);
        k->set_issue_ns(start - ms);
        k->set_start_ns(start);
        k->set_end_ns(start + static_cast<int64_t>(ns));
        k->set_bytes(static_cast<uint64_t>(comm.bytes));
        k->mutable_collective()->set_comm_hash(comm.hash);
        k->mutable_collective()->set_seq(instance);
        k->mutable_collective()->set_nranks(static_cast<uint32_t>(comm.members.size()));
      }
    }
  }
  JobModel job;
  for (int r = 0; r < ranks; ++r) job.addBatch(r, batches[r]);
  return job;
}

// 8 ranks, tensor parallel 2 × data parallel 4 (TP pairs {0,1},{2,3},...; DP groups
// {0,2,4,6},{1,3,5,7}): one TP all-reduce (16 MiB) and one DP all-reduce (192 MiB) a step. With
// `tp` false every rank is in one DP communicator of 8; `global` adds that one beside TP and DP.
JobModel linkJob(const std::map<int, double>& link_factor, bool tp = true, bool global = false) {
  std::vector<Comm> comms;
  if (tp) {
    for (int g = 0; g < 4; ++g) comms.push_back({100u + g, {2 * g, 2 * g + 1}, 16.0 * (1 << 20)});
    for (int g = 0; g < 2; ++g)
      comms.push_back({200u + g, {g, g + 2, g + 4, g + 6}, 192.0 * (1 << 20)});
  }
  if (!tp || global) comms.push_back({300u, {0, 1, 2, 3, 4, 5, 6, 7}, 192.0 * (1 << 20)});
  return collectivesJob(8, comms, link_factor);
}

// The diagnoses of one kind, default options.
std::vector<Diagnosis> diagnosesOf(const JobModel& job, const std::string& kind) {
  std::vector<Diagnosis> out;
  for (Diagnosis& d : diagnose(job, DiagnoseOptions{})) {
    if (d.kind == kind) out.push_back(std::move(d));
  }
  return out;
}

std::vector<Diagnosis> linkDiagnoses(const JobModel& job) {
  return diagnosesOf(job, "link_slow");
}

TEST(LinkSlow, HealthyLinksRaiseNothing) {
  EXPECT_TRUE(linkDiagnoses(linkJob({})).empty());
}

TEST(LinkSlow, SlowLinkNamesTheRankInTheSlowCommunicatorsAndItsPeersAsVictims) {
  const auto found = linkDiagnoses(linkJob({{5, 0.7}}));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].ranks, std::vector<int>{5});
  // Its TP partner and the rest of its DP group: slowed, cleared by their healthy communicators.
  EXPECT_EQ(found[0].victims, (std::vector<int>{1, 3, 4, 7}));
  EXPECT_NE(found[0].summary.find("victims"), std::string::npos) << found[0].summary;
  EXPECT_NE(diagnosesToJson(found).find("\"ranks\":[5],\"victims\":[1,3,4,7]"), std::string::npos)
      << diagnosesToJson(found);
}

TEST(LinkSlow, MildSlowLinkBelowTheThresholdOnOneCommunicatorStillNamesOnlyTheCulprit) {
  // 16% and 20% slower: the 192 MiB DP all-reduce passes link_min_effect; the 16 MiB TP
  // all-reduce, where the fixed latency dilutes it, may not pass it in general. Naming the DP group
  // would name three bystanders: the culprit's TP communicator is slower than its peers, the
  // bystanders' are not.
  for (double f : {0.84, 0.80}) {
    const auto found = linkDiagnoses(linkJob({{2, f}}));
    ASSERT_EQ(found.size(), 1u) << f;
    EXPECT_EQ(found[0].ranks, std::vector<int>{2}) << f << " " << found[0].summary;
    EXPECT_EQ(found[0].victims, (std::vector<int>{0, 3, 4, 6})) << f;
  }
}

TEST(LinkSlow, ATenPercentSlowerLinkIsNamedWhenTheHealthyCommunicatorsAgree) {
  // The job's healthy communicators differ by the 1% wiggle only: the 7% floor applies, and a
  // link at 90% (busbw 10% below on both of rank 5's communicators) is named alone.
  const auto found = linkDiagnoses(linkJob({{5, 0.9}}));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].ranks, std::vector<int>{5}) << found[0].summary;
  EXPECT_EQ(found[0].victims, (std::vector<int>{1, 3, 4, 7}));
  EXPECT_NEAR(found[0].severity, 0.10, 0.02);
  ASSERT_FALSE(found[0].evidence.empty());
  EXPECT_NE(found[0].evidence[0].text.find("(slow: more than 7.0% below)"), std::string::npos)
      << found[0].evidence[0].text;
}

TEST(LinkSlow, AFabricWhoseHealthyCommunicatorsDifferRaisesTheThreshold) {
  // TP pairs on links of 100%, 95%, 105% and 91% (both ends): the pairs' busbw spread is about
  // 7%, so the 91% pair (9% below the median of the others) is within what this fabric's
  // healthy communicators differ by, and nothing is said. Judged by the 7% floor alone it would
  // be named.
  const std::map<int, double> fabric = {{0, 1.0},  {1, 1.0},  {2, 0.95}, {3, 0.95},
                                        {4, 1.05}, {5, 1.05}, {6, 0.91}, {7, 0.91}};
  EXPECT_TRUE(linkDiagnoses(linkJob(fabric)).empty());
  DiagnoseOptions floor_only;
  floor_only.link_spread_sigmas = 0;
  floor_only.link_clear_sigmas = 0;
  std::vector<std::string> kinds;
  for (const Diagnosis& d : diagnose(linkJob(fabric), floor_only)) kinds.push_back(d.kind);
  EXPECT_EQ(kinds, std::vector<std::string>{"link_slow"});
}

TEST(LinkSlow, TwoEndsThatNoOtherCommunicatorSeparatesAreNamedAsTheLinkBetweenThem) {
  // Both ranks of TP pair {4,5} have slow links: their pair's communicator is slow against the
  // other pairs, and both DP groups are equally slow, so neither DP group is slow against its
  // peer: each end is in one slow communicator and one that clears it. The data cannot say
  // which end: both are named, as the link between them, and no one else.
  const auto both = linkDiagnoses(linkJob({{4, 0.7}, {5, 0.7}}));
  ASSERT_EQ(both.size(), 1u);
  EXPECT_EQ(both[0].ranks, (std::vector<int>{4, 5}));
  EXPECT_TRUE(both[0].victims.empty());
  EXPECT_NE(both[0].summary.find("the link between ranks 4 and 5"), std::string::npos)
      << both[0].summary;
}

TEST(LinkSlow, OneCommunicatorWithNoPeerToCompareIsNotBlamed) {
  // DP 8: one communicator, no peer communicator to compare its busbw with: nothing is said
  // (history or a baseline would be needed), rather than naming all eight ranks.
  EXPECT_TRUE(linkDiagnoses(linkJob({{3, 0.7}}, /*tp=*/false)).empty());
  // ... and "nothing found" says that this was not compared, with what was measured.
  std::vector<DetectorRun> runs;
  diagnose(linkJob({{3, 0.7}}, /*tp=*/false), DiagnoseOptions{}, nullptr, nullptr, &runs);
  const auto link = std::find_if(runs.begin(), runs.end(),
                                 [](const DetectorRun& r) { return r.name == "link_slow"; });
  ASSERT_NE(link, runs.end());
  EXPECT_EQ(link->note.rfind("1 communicator (ranks 0-7: ncclAllReduce of 192.0 MiB at ", 0), 0u)
      << link->note;
  EXPECT_NE(link->note.find("with no peer"), std::string::npos) << link->note;
  // Beside TP and DP groups, a job-wide all-reduce has no peer either: the TP pairs and DP
  // groups are compared, and the note names the one that was not.
  runs.clear();
  diagnose(linkJob({}, /*tp=*/true, /*global=*/true), DiagnoseOptions{}, nullptr, nullptr, &runs);
  for (const DetectorRun& r : runs) {
    if (r.name == "link_slow") {
      EXPECT_NE(r.note.find("1 communicator (ranks 0-7: ncclAllReduce"), std::string::npos)
          << r.note;
      EXPECT_NE(r.note.find("(6 others compared)"), std::string::npos) << r.note;
    }
  }
  // With peers there is nothing to say (shared_gpu's note: the synthetic ranks sent no UUID).
  runs.clear();
  diagnose(linkJob({}), DiagnoseOptions{}, nullptr, nullptr, &runs);
  for (const DetectorRun& r : runs) {
    if (r.name != "shared_gpu") {
      EXPECT_EQ(r.note, "") << r.name;
    }
  }
}

// ---- link_slow: a communicator with no peer, against healthy history ---------------------------

// The link_slow detector's run record (what it looked at) of one diagnose() call.
DetectorRun linkRun(const JobModel& job, const JobModel* baseline, const History* history,
                    std::vector<Diagnosis>* found, const DiagnoseOptions& options = {}) {
  std::vector<DetectorRun> runs;
  for (Diagnosis& d : diagnose(job, options, baseline, history, &runs)) {
    if (d.kind == "link_slow") found->push_back(std::move(d));
  }
  for (DetectorRun& r : runs) {
    if (r.name == "link_slow") return r;
  }
  ADD_FAILURE() << "link_slow did not run";
  return {};
}

TEST(LinkSlow, APeerlessCommunicatorSlowerThanItsHealthyHistoryNamesAllItsRanks) {
  // DP 8 (one communicator of all eight ranks, nothing to compare with inside the job), and two
  // healthy runs of it as history: rank 3's link at 50% halves the ring's busbw.
  const flare::v1::HealthyBaseline a = makeBaseline(linkJob({}, /*tp=*/false));
  const flare::v1::HealthyBaseline b = makeBaseline(linkJob({}, /*tp=*/false));
  const History history = buildHistory({&a, &b}, HistoryOptions{});
  ASSERT_EQ(history.runs, 2u);
  std::vector<Diagnosis> found;
  const DetectorRun run = linkRun(linkJob({{3, 0.5}}, /*tp=*/false), nullptr, &history, &found);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(found[0].victims.empty());
  EXPECT_EQ(found[0].team, Team::kOperations);
  EXPECT_NEAR(found[0].severity, 0.5, 0.03);
  EXPECT_NE(found[0].summary.find("below healthy history (the slowest of 2 runs)"),
            std::string::npos)
      << found[0].summary;
  EXPECT_EQ(found[0].summary.rfind("ranks 0-7: slow network link", 0), 0u) << found[0].summary;
  EXPECT_NE(found[0].summary.find("cannot tell whose link"), std::string::npos);
  ASSERT_EQ(found[0].evidence.size(), 1u);
  EXPECT_NEAR(found[0].evidence[0].value / found[0].evidence[0].reference, 0.5, 0.03);
  EXPECT_NE(found[0].evidence[0].text.find("(slow: more than 20.0% below)"), std::string::npos)
      << found[0].evidence[0].text;
  EXPECT_EQ(run.note, "");  // compared: nothing left unsaid
}

TEST(LinkSlow, APeerlessCommunicatorWithinItsHistoryOrTheThresholdRaisesNothing) {
  const flare::v1::HealthyBaseline a = makeBaseline(linkJob({}, /*tp=*/false));
  const History history = buildHistory({&a}, HistoryOptions{});
  // Healthy, and a link at 90%: within the 20% a job may differ from its history by (other
  // nodes, other links); compared, so the note is empty.
  for (double f : {1.0, 0.9}) {
    std::vector<Diagnosis> found;
    const DetectorRun run = linkRun(linkJob({{3, f}}, /*tp=*/false), nullptr, &history, &found);
    EXPECT_TRUE(found.empty()) << f << " " << found[0].summary;
    EXPECT_EQ(run.note, "") << f;
  }
  // The history's slowest run is the reference: a healthy run that was itself 30% slower makes
  // a 50% link 29% below the slowest, still named; a slowest run at 60% clears it.
  const flare::v1::HealthyBaseline slow = makeBaseline(linkJob({{5, 0.7}}, /*tp=*/false));
  std::vector<Diagnosis> found;
  const History with_slow = buildHistory({&a, &slow}, HistoryOptions{});
  linkRun(linkJob({{3, 0.5}}, /*tp=*/false), nullptr, &with_slow, &found);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NEAR(found[0].severity, 1 - 0.5 / 0.7, 0.03);
  const flare::v1::HealthyBaseline slower = makeBaseline(linkJob({{5, 0.6}}, /*tp=*/false));
  const History with_slower = buildHistory({&a, &slower}, HistoryOptions{});
  found.clear();
  linkRun(linkJob({{3, 0.5}}, /*tp=*/false), nullptr, &with_slower, &found);
  EXPECT_TRUE(found.empty());
}

TEST(LinkSlow, APeerlessCommunicatorIsComparedWithTheBaselineRun) {
  // flare-diagnose --baseline: the baseline run's model instead of stored history.
  const JobModel baseline = linkJob({}, /*tp=*/false);
  std::vector<Diagnosis> found;
  linkRun(linkJob({{6, 0.5}}, /*tp=*/false), &baseline, nullptr, &found);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].ranks.size(), 8u);
  EXPECT_NE(found[0].summary.find("below the baseline run"), std::string::npos) << found[0].summary;
  found.clear();
  linkRun(linkJob({}, /*tp=*/false), &baseline, nullptr, &found);
  EXPECT_TRUE(found.empty());
  // Several baseline runs (flare-diagnose --baseline A --baseline B): the slowest is the
  // reference, as in flared's history. Beside a run on a 70% link, a 50% link is 29% below it.
  const JobModel slow = linkJob({{1, 0.7}}, /*tp=*/false);
  DiagnoseOptions several;
  several.link_baseline_busbw = lowestBaselineBusbw({&baseline, &slow}, 3);
  found.clear();
  linkRun(linkJob({{6, 0.5}}, /*tp=*/false), &baseline, nullptr, &found, several);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NEAR(found[0].severity, 1 - 0.5 / 0.7, 0.03);
  EXPECT_NE(found[0].summary.find("below the slowest of 2 baseline runs"), std::string::npos)
      << found[0].summary;
  // ... and beside one on a 60% link, within 20% of it: nothing.
  const JobModel slower = linkJob({{1, 0.6}}, /*tp=*/false);
  several.link_baseline_busbw = lowestBaselineBusbw({&baseline, &slower}, 3);
  found.clear();
  linkRun(linkJob({{6, 0.5}}, /*tp=*/false), &baseline, nullptr, &found, several);
  EXPECT_TRUE(found.empty());
}

// Pure data parallelism over 4 ranks with two gradient buckets a step: all-reduces of 64 and
// 256 MiB (two signatures) on the one communicator; rank 2's link at `factor`.
JobModel bucketsJob(double factor) {
  const std::vector<int> all = {0, 1, 2, 3};
  return collectivesJob(4, {{300u, all, 64.0 * (1 << 20)}, {300u, all, 256.0 * (1 << 20)}},
                        {{2, factor}}, /*signature_per_size=*/true);
}

TEST(LinkSlow, APeerlessCommunicatorSlowInSeveralCollectivesIsOneDiagnosis) {
  // Both buckets slow on the one communicator: one diagnosis, with the evidence of each.
  const flare::v1::HealthyBaseline a = makeBaseline(bucketsJob(1.0));
  const History history = buildHistory({&a}, HistoryOptions{});
  std::vector<Diagnosis> found;
  const DetectorRun run = linkRun(bucketsJob(0.5), nullptr, &history, &found);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(found[0].evidence.size(), 2u);
  EXPECT_NE(found[0].summary.find("below healthy history (1 run), and 1 more of its collective "
                                  "too;"),
            std::string::npos)
      << found[0].summary;
  EXPECT_EQ(run.note, "");
}

TEST(LinkSlow, WhatTheHistoryCannotCompareIsSaid) {
  // A history without a busbw for the collective (its runs measured no complete instance):
  // the note says so, and nothing is named.
  flare::v1::HealthyBaseline a = makeBaseline(linkJob({}, /*tp=*/false));
  for (auto& s : *a.mutable_signatures()) s.set_busbw_gbps(0);
  const History history = buildHistory({&a}, HistoryOptions{});
  std::vector<Diagnosis> found;
  DetectorRun run = linkRun(linkJob({{3, 0.5}}, /*tp=*/false), nullptr, &history, &found);
  EXPECT_TRUE(found.empty());
  EXPECT_NE(run.note.find("with no peer"), std::string::npos) << run.note;
  EXPECT_NE(run.note.find("the healthy history has no figure for its collective"),
            std::string::npos)
      << run.note;
  // Without any history, the note says how to get one.
  run = linkRun(linkJob({{3, 0.5}}, /*tp=*/false), nullptr, nullptr, &found);
  EXPECT_NE(run.note.find("flare baseline add"), std::string::npos) << run.note;
  // A job-wide all-reduce beside TP and DP groups runs the same signature as the DP groups here
  // (linkJob's one signature): the history's figure for it is not this communicator's alone,
  // so it is not compared with it, and the note names it as before.
  const flare::v1::HealthyBaseline g = makeBaseline(linkJob({}, /*tp=*/true, /*global=*/true));
  const History global_history = buildHistory({&g}, HistoryOptions{});
  found.clear();
  run = linkRun(linkJob({}, /*tp=*/true, /*global=*/true), nullptr, &global_history, &found);
  EXPECT_TRUE(found.empty());
  EXPECT_NE(run.note.find("1 communicator (ranks 0-7: ncclAllReduce"), std::string::npos)
      << run.note;
  EXPECT_NE(run.note.find("its collective runs on other communicators too, so the healthy "
                          "history's figure for it is not its own"),
            std::string::npos)
      << run.note;
}

// ---- unoptimized_gemm: what a shape is held to -----------------------------------------------

struct GemmShape {
  int64_t m, n, k;
  double tflops;
  std::string layout = "";  // Signature.layout, e.g. "tn lda=768 ldb=768 ldc=768"
};

// 2 ranks, 6 steps of 100 ms, each shape called 4 times per step at its TFLOPS (bf16).
JobModel gemmJob(const std::vector<GemmShape>& shapes) {
  const int64_t ms = 1'000'000;
  JobModel job;
  for (int rank = 0; rank < 2; ++rank) {
    flare::v1::RecordBatch b;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto* sig = b.add_signatures();
      sig->set_id(static_cast<uint32_t>(i + 1));
      sig->set_name("cublasGemmEx");
      sig->set_kind(flare::v1::OP_KIND_GEMM);
      sig->set_dtype(flare::v1::DTYPE_BF16);
      sig->set_layout(shapes[i].layout);
      for (int64_t d : {shapes[i].m, shapes[i].n, shapes[i].k, int64_t{1}}) sig->add_shape(d);
    }
    for (int step = 0; step < 6; ++step) {
      const int64_t t0 = step * 100 * ms;
      auto* st = b.add_steps();
      st->set_step(static_cast<uint64_t>(step));
      st->set_start_ns(t0);
      int64_t t = t0 + ms;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const double flops = 2.0 * shapes[i].m * shapes[i].n * shapes[i].k;
        for (int c = 0; c < 4; ++c) {
          auto* k = b.add_kernels();
          k->set_signature_id(static_cast<uint32_t>(i + 1));
          k->set_stream_id(7);
          k->set_issue_ns(t - 100'000);
          k->set_start_ns(t);
          t += static_cast<int64_t>(flops / (shapes[i].tflops * 1e12) * 1e9);
          k->set_end_ns(t);
          k->set_flops(static_cast<uint64_t>(flops));
        }
      }
    }
    job.addBatch(rank, b);
  }
  return job;
}

std::vector<Diagnosis> gemmDiagnoses(const JobModel& job) {
  return diagnosesOf(job, "unoptimized_gemm");
}

TEST(UnoptimizedGemm, AMisalignedShapeIsHeldToSmallerAlignedGemmsNoEasierThanIt) {
  // A small model's misaligned FFN (8190 = 16380 bytes) has 2.7x the flops of its attention
  // projection (3072), so the two are not alike (2x); but the projection does less work per
  // byte and has fewer tiles, and it runs at 280 TFLOPS: the FFN at 145 is named against it.
  const auto slow = gemmDiagnoses(gemmJob({{3072, 2048, 2048, 280}, {8190, 2048, 2048, 145}}));
  ASSERT_EQ(slow.size(), 1u);
  ASSERT_EQ(slow[0].evidence.size(), 1u);
  EXPECT_NEAR(slow[0].evidence[0].value, 145, 1);
  EXPECT_NEAR(slow[0].evidence[0].reference, 280, 1);
  EXPECT_NE(slow[0].evidence[0].text.find("smaller aligned GEMMs"), std::string::npos)
      << slow[0].evidence[0].text;
  EXPECT_NE(slow[0].summary.find("nearest aligned m=8192"), std::string::npos) << slow[0].summary;
  // At 95% of the projection's TFLOPS it is not slow.
  EXPECT_TRUE(gemmDiagnoses(gemmJob({{3072, 2048, 2048, 280}, {8190, 2048, 2048, 266}})).empty());
  // An aligned shape is not held to a smaller, non-alike GEMM (wave quantization and tile
  // choice make such shapes differ on real GPUs; only misalignment is a fix the team owns).
  EXPECT_TRUE(gemmDiagnoses(gemmJob({{3072, 2048, 2048, 280}, {8192, 2048, 2048, 145}})).empty());
  // A GEMM more than 4x smaller is no yardstick: 1024 x 1024 x 2048 has 1/16 of the flops.
  EXPECT_TRUE(gemmDiagnoses(gemmJob({{1024, 1024, 2048, 280}, {8190, 2048, 2048, 145}})).empty());
  // Nor is a smaller GEMM that does more work per byte (an easier one): 2048 x 2048 x 1536
  // (12.9 GFLOP, 614 flops per byte) for 16380 x 1024 x 1024 (34.4 GFLOP, 496 per byte).
  EXPECT_TRUE(gemmDiagnoses(gemmJob({{2048, 2048, 1536, 280}, {16380, 1024, 1024, 145}})).empty());
}

TEST(UnoptimizedGemm, AShapeIsHeldOnlyToGemmsOfItsOwnTransposes) {
  // The H200 fixture's healthy GPT (tests/fixtures/gpu/healthy-small, fast calls): its
  // [768,8192,768] runs at 501 TFLOPS as nn and 263 as tn. cuBLAS picks kernels per layout;
  // the tn call is as fast as the library makes that layout, not a shape the job should fix.
  const std::string nn = "nn lda=768 ldb=768 ldc=768", tn = "tn lda=768 ldb=768 ldc=768";
  EXPECT_TRUE(
      gemmDiagnoses(gemmJob({{768, 8192, 768, 501, nn}, {768, 8192, 768, 240, tn}})).empty());
  // Of the same transposes, the slow one is named against the fast one.
  const auto slow = gemmDiagnoses(gemmJob({{768, 8192, 768, 501, tn}, {768, 8192, 1024, 240, tn}}));
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_NEAR(slow[0].evidence[0].value, 240, 1);
  EXPECT_NEAR(slow[0].evidence[0].reference, 501, 1);
  // A layout that does not say its transposes (a registered kernel) is held to every layout.
  EXPECT_EQ(gemmDiagnoses(gemmJob({{768, 8192, 768, 501, nn}, {768, 8192, 1024, 240, ""}})).size(),
            1u);
  // A misaligned shape likewise: the unaligned-gemm fixture's [3080,8192,768] ran at 462 as tn
  // where the aligned tn projection [2304,8192,768] ran at 440 (misalignment costs it little
  // there), and at 558 as nn against [768,8192,2304] nn at 672: only the nn call is named.
  const std::string tn2 = "tn lda=768 ldb=768 ldc=2304", nn2 = "nn lda=768 ldb=2304 ldc=768";
  const auto mis = gemmDiagnoses(gemmJob({{2304, 8192, 768, 440, tn2},
                                          {768, 8192, 2304, 672, nn2},
                                          {3080, 8192, 768, 462, "tn lda=768 ldb=768 ldc=3080"},
                                          {3080, 8192, 768, 558, "nn lda=3080 ldb=768 ldc=3080"}}));
  ASSERT_EQ(mis.size(), 1u);
  ASSERT_EQ(mis[0].evidence.size(), 1u) << mis[0].summary;
  EXPECT_NEAR(mis[0].evidence[0].value, 558, 1);
  EXPECT_NEAR(mis[0].evidence[0].reference, 672, 1);
}

// ---- evidence that passed its test: fail-slow and jitter under host noise ----------------------

// A job of 8 ranks stepping together through `step_ms` (step 0 the warm-up), with one all-reduce
// per step over all ranks; in each step the rank `late[step]` arrives last (-1: nobody stands
// out, every rank arrives at once).
JobModel seriesJob(const std::vector<double>& step_ms, const std::vector<int>& late) {
  const int64_t ms = 1'000'000;
  JobModel job;
  for (int rank = 0; rank < 8; ++rank) {
    flare::v1::RecordBatch b;
    auto* sig = b.add_signatures();
    sig->set_id(1);
    sig->set_name("ncclAllReduce");
    sig->set_kind(flare::v1::OP_KIND_COLLECTIVE);
    sig->set_collective(flare::v1::COLLECTIVE_KIND_ALL_REDUCE);
    int64_t t = 0;
    for (size_t step = 0; step < step_ms.size(); ++step) {
      auto* st = b.add_steps();
      st->set_step(step);
      st->set_start_ns(t);
      const int64_t len = static_cast<int64_t>(step_ms[step] * ms);
      const int64_t arrive = t + len / 2 + (late[step] == rank ? len / 4 : 0);
      auto* k = b.add_kernels();
      k->set_signature_id(1);
      k->set_stream_id(9);
      k->set_issue_ns(arrive - ms / 10);
      k->set_start_ns(arrive);
      k->set_end_ns(t + len - ms / 10);
      k->set_bytes(1 << 20);
      k->mutable_collective()->set_comm_hash(42);
      k->mutable_collective()->set_seq(step);
      k->mutable_collective()->set_nranks(8);
      t += len;
    }
    job.addBatch(rank, b);
  }
  return job;
}

// Host noise as a loaded host makes it: every step ±2% (uniform), and now and then (`hiccups`, a
// share of the steps) a hiccup of +14% to +71% on a random rank, which then arrives last.
// Deterministic per seed. `shift_at`: from that step on the level is `shift` higher (a fail-slow);
// `every`: every that many steps rank 3 pauses, costing `spike` (a recurring fault).
struct Noisy {
  std::vector<double> ms;
  std::vector<int> late;
  std::vector<bool> hiccup;
};
Noisy noisySeries(uint64_t seed, size_t steps, double hiccups, size_t shift_at = 0,
                  double shift = 0, size_t every = 0, double spike = 0) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto uniform = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<double>(x % 1'000'000) / 1e6;
  };
  Noisy n;
  for (size_t s = 0; s < steps; ++s) {
    double v = 10.0 * (1 + 0.04 * (uniform() - 0.5));
    int late = -1;
    const bool hiccup = uniform() < hiccups;
    if (hiccup) {
      v += 10.0 * (0.14 + 0.57 * uniform());
      late = static_cast<int>(uniform() * 8) % 8;
    }
    if (shift_at > 0 && s >= shift_at) v += 10.0 * shift;
    if (every > 0 && s > 0 && s % every == 0) {
      v += 10.0 * spike;
      late = 3;
    }
    n.ms.push_back(s == 0 ? 50.0 : v);
    n.late.push_back(late);
    n.hiccup.push_back(hiccup);
  }
  return n;
}

// The tests switched off: what findFailSlow and findJitter accepted before they had them.
DiagnoseOptions untested() {
  DiagnoseOptions o;
  o.fail_slow_alpha = 1;
  o.fail_slow_min_sigmas = 0;
  o.fail_slow_min_held = 0;
  o.fail_slow_min_after = o.fail_slow_min_steps;
  o.jitter_min_sigmas = 0;
  o.jitter_alike_factor = 1e9;
  o.jitter_alpha = 1e9;
  return o;
}

TEST(Evidence, HostNoiseGivesNoChangePointAndNoJitterWindow) {
  size_t untested_hits = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    for (size_t steps : {24u, 40u, 80u}) {
      const Noisy n = noisySeries(seed, steps, seed % 2 ? 0.08 : 0.04);
      const JobModel job = seriesJob(n.ms, n.late);
      EXPECT_FALSE(findFailSlow(job, DiagnoseOptions{}).has_value()) << seed << " " << steps;
      EXPECT_FALSE(findJitter(job, DiagnoseOptions{}).has_value()) << seed << " " << steps;
      untested_hits +=
          findFailSlow(job, untested()).has_value() || findJitter(job, untested()).has_value();
    }
  }
  // The same series without the tests: host noise passed for evidence (the issue's report).
  EXPECT_GE(untested_hits, 5u);  // 6 of the 60 series
}

// The faults are found in the same noise at 4% hiccups (at 8%, two hiccups just before the onset
// can pass for it: the onset is then placed there, 5 steps early, in one of these seeds).
TEST(Evidence, AFailSlowUnderHostNoiseIsFoundAtItsOnset) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    for (double shift : {0.25, 0.35}) {
      const Noisy n = noisySeries(seed, 40, 0.04, 24, shift);
      const auto f = findFailSlow(seriesJob(n.ms, n.late), DiagnoseOptions{});
      ASSERT_TRUE(f.has_value()) << seed << " " << shift;
      EXPECT_NEAR(static_cast<double>(f->step), 24.0, 2.0) << seed << " " << shift;
    }
  }
}

TEST(Evidence, ARecurringPauseOfOneRankIsAJitterWindowOfItsSteps) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const Noisy n = noisySeries(seed, 42, 0.04, 0, 0, 6, 0.5);  // rank 3, every 6th step
    const auto j = findJitter(seriesJob(n.ms, n.late), DiagnoseOptions{});
    ASSERT_TRUE(j.has_value()) << seed;
    // Every injected step the noise left alone; besides them at most noise spikes that happened
    // to hit rank 3.
    for (size_t s = 6; s <= 40; s += 6) {
      if (n.hiccup[s]) continue;
      EXPECT_NE(std::find(j->steps.begin(), j->steps.end(), s), j->steps.end()) << seed << " " << s;
    }
    for (size_t s : j->steps) EXPECT_EQ(n.late[s], 3) << seed << " " << s;
  }
}

// A rank that is steadily last (its GPU is slow in every step) is last in the steps of the host's
// hiccups too; that is no jitter of its own. Against 1/ranks, three such hiccup steps passed as
// its recurring fault (8 · (1/8)^3 < 0.05; a CI run under a CPU hog cited them); against its own
// share of the quiet steps they do not.
TEST(Evidence, HiccupsBesideASteadilyLastRankAreNotItsJitter) {
  size_t spiky = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Noisy n = noisySeries(seed, 40, 0.08);
    for (size_t s = 1; s < n.ms.size(); ++s) spiky += n.hiccup[s];
    std::fill(n.late.begin(), n.late.end(), 3);
    EXPECT_FALSE(findJitter(seriesJob(n.ms, n.late), DiagnoseOptions{}).has_value()) << seed;
  }
  EXPECT_GE(spiky, 40u);  // the noise did spike: about 3 steps per series
}

}  // namespace
}  // namespace flare::engine
