// Ingest core: hello and batch validation, per-job state, report math, sessions, commands,
// rate limit, dedupe and counters. No transport; a FakeClock drives time.
#include "src/engine/ingest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/engine/metrics.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

using testing::addKernel;
using testing::allReduceSig;
using testing::gemmSig;
using testing::kNow;
using testing::makeHello;

class FakeChannel : public CommandChannel {
 public:
  bool send(const v1::DaemonMessage& m) override {
    sent.push_back(m);
    return true;
  }
  void close(Code code, const std::string& error) override {
    closed = true;
    close_code = code;
  }
  std::vector<v1::DaemonMessage> sent;
  bool closed = false;
  Code close_code = Code::kOk;
};

class IngestTest : public ::testing::Test {
 protected:
  IngestTest() : clock_(kNow) {}
  void make(IngestConfig cfg = {}) {
    ingest_ = std::make_unique<Ingest>(std::move(cfg), nullptr, clock_);
  }
  uint64_t connect(const std::string& job, int rank, int world,
                   std::shared_ptr<FakeChannel> ch = nullptr, const std::string& token = "") {
    auto out = ingest_->hello(makeHello(job, rank, world, token),
                              ch ? ch : std::make_shared<FakeChannel>());
    EXPECT_TRUE(out.verdict.ok()) << out.verdict.error;
    EXPECT_TRUE(out.ack.accepted());
    return out.session_id;
  }
  uint64_t rejected(Reason r) const {
    return ingest_->counters().rejected[static_cast<size_t>(r)].load();
  }
  v1::GetReportResponse report(const std::string& job) {
    v1::GetReportRequest req;
    req.set_job_id(job);
    v1::GetReportResponse out;
    EXPECT_EQ(ingest_->report(req, &out), Code::kOk);
    return out;
  }

  common::FakeClock clock_;
  std::unique_ptr<Ingest> ingest_;
};

TEST_F(IngestTest, TokensGateHellosPerJobWithDefault) {
  IngestConfig cfg;
  cfg.job_tokens["jobA"] = "secretA";
  cfg.default_token = "fallback";
  make(cfg);
  auto ch = std::make_shared<FakeChannel>();
  auto bad = ingest_->hello(makeHello("jobA", 0, 2, "wrong"), ch);
  EXPECT_FALSE(bad.ack.accepted());
  EXPECT_EQ(bad.verdict.code, Code::kUnauthenticated);
  EXPECT_TRUE(bad.verdict.close_stream);
  EXPECT_FALSE(bad.ack.error().empty());
  // Job A's token is not the default: another job cannot use it.
  EXPECT_FALSE(ingest_->hello(makeHello("jobB", 0, 2, "secretA"), ch).ack.accepted());
  EXPECT_FALSE(ingest_->hello(makeHello("jobA", 0, 2, ""), ch).ack.accepted());
  EXPECT_EQ(rejected(Reason::kUnauthenticated), 3u);
  EXPECT_TRUE(ingest_->hello(makeHello("jobA", 0, 2, "secretA"), ch).ack.accepted());
  EXPECT_TRUE(ingest_->hello(makeHello("jobB", 0, 2, "fallback"), ch).ack.accepted());
  EXPECT_EQ(ingest_->activeSessions(), 2u);
}

TEST_F(IngestTest, HelloFieldsValidated) {
  IngestConfig cfg;
  cfg.max_ranks_per_job = 4;
  cfg.max_jobs = 1;
  make(cfg);
  auto ch = std::make_shared<FakeChannel>();
  auto h = makeHello("job", 0, 2);
  h.set_protocol_version(99);
  EXPECT_EQ(ingest_->hello(h, ch).verdict.reason, Reason::kProtocolVersion);
  EXPECT_EQ(ingest_->hello(makeHello("job", 2, 2), ch).verdict.reason, Reason::kBadHello);
  EXPECT_EQ(ingest_->hello(makeHello("job", -1, 2), ch).verdict.reason, Reason::kBadHello);
  EXPECT_EQ(ingest_->hello(makeHello("", 0, 2), ch).verdict.reason, Reason::kBadHello);
  EXPECT_EQ(ingest_->hello(makeHello("a/b", 0, 2), ch).verdict.reason, Reason::kBadHello);
  // The one job-id rule (src/common/job_id.h): '+' too, and the refusal names the rule.
  const auto plus = ingest_->hello(makeHello("a+b", 0, 2), ch);
  EXPECT_EQ(plus.verdict.reason, Reason::kBadHello);
  EXPECT_NE(plus.ack.error().find("1 to 128 of A-Z a-z 0-9 . _ - : @"), std::string::npos)
      << plus.ack.error();
  EXPECT_EQ(ingest_->hello(makeHello(std::string(129, 'j'), 0, 2), ch).verdict.reason,
            Reason::kBadHello);
  EXPECT_EQ(ingest_->hello(makeHello("job", 0, 5), ch).verdict.reason, Reason::kTooManyRanks);
  EXPECT_TRUE(ingest_->hello(makeHello("job", 0, 4), ch).verdict.ok());
  EXPECT_EQ(ingest_->hello(makeHello("job2", 0, 4), ch).verdict.reason, Reason::kTooManyJobs);
}

TEST_F(IngestTest, DecodeRejectsMalformedAndOversized) {
  IngestConfig cfg;
  cfg.max_message_bytes = 64;
  make(cfg);
  v1::RankMessage m;
  const std::string garbage = "\xff\xff\xff\xff\x0f garbage";
  Verdict v = ingest_->decode(garbage.data(), garbage.size(), &m);
  EXPECT_EQ(v.reason, Reason::kMalformed);
  EXPECT_TRUE(v.close_stream);
  EXPECT_EQ(ingest_->decode("", 0, &m).reason, Reason::kMalformed);  // no oneof set
  std::string big(65, '\0');
  EXPECT_EQ(ingest_->decode(big.data(), big.size(), &m).reason, Reason::kOversized);
  v1::RankMessage ok;
  *ok.mutable_hello() = makeHello("j", 0, 1);
  const std::string bytes = ok.SerializeAsString();
  ASSERT_LE(bytes.size(), 64u);
  EXPECT_TRUE(ingest_->decode(bytes.data(), bytes.size(), &m).ok());
  EXPECT_EQ(m.hello().job_id(), "j");
  EXPECT_EQ(rejected(Reason::kMalformed), 2u);
  EXPECT_EQ(rejected(Reason::kOversized), 1u);
}

TEST_F(IngestTest, DecodeExpandsCollectiveBlocksAndRefusesHostileOnes) {
  IngestConfig cfg;
  cfg.max_batch_items = 10;
  make(cfg);
  auto encode = [](int entries, bool lopsided) {
    v1::RankMessage m;
    v1::CollectiveBlock* b = m.mutable_batch()->add_collective_blocks();
    b->set_signature_id(1);
    b->set_base_seq(40);
    b->set_base_issue_ns(1'000'000);
    b->mutable_info()->set_comm_hash(9);
    for (int i = 0; i < entries; ++i) {
      b->add_seq_delta(i == 0 ? 0 : 1);
      b->add_issue_delta_ns(1'000);
      b->add_issue_latency_ns(50);
      if (!lopsided || i > 0) b->add_duration_ns(200);
    }
    return m.SerializeAsString();
  };
  v1::RankMessage m;
  std::string bytes = encode(3, false);
  ASSERT_TRUE(ingest_->decode(bytes.data(), bytes.size(), &m).ok());
  ASSERT_EQ(m.batch().kernels_size(), 3);
  EXPECT_EQ(m.batch().collective_blocks_size(), 0);
  EXPECT_EQ(m.batch().kernels(2).collective().seq(), 42u);
  EXPECT_EQ(m.batch().kernels(2).issue_ns(), 1'003'000);
  EXPECT_EQ(m.batch().kernels(2).end_ns(), 1'003'250);
  EXPECT_EQ(m.batch().kernels(2).collective().comm_hash(), 9u);

  bytes = encode(3, true);
  Verdict v = ingest_->decode(bytes.data(), bytes.size(), &m);
  EXPECT_EQ(v.reason, Reason::kMalformed);
  EXPECT_NE(v.error.find("different lengths"), std::string::npos) << v.error;
  bytes = encode(11, false);  // expands past --max-batch-items
  v = ingest_->decode(bytes.data(), bytes.size(), &m);
  EXPECT_EQ(v.reason, Reason::kOversized);
  EXPECT_FALSE(v.close_stream);
}

TEST_F(IngestTest, DeviceInfoInABatchNamesTheRanksGpuAndHostileOnesAreIgnored) {
  make();
  const uint64_t s0 = connect("job", 0, 2);
  const uint64_t s1 = connect("job", 1, 2);
  auto device_of = [&](int rank) {
    v1::ListRanksRequest lr;
    lr.set_job_id("job");
    lr.set_rank(rank);
    v1::ListRanksResponse out;
    EXPECT_EQ(ingest_->ranks(lr, &out), Code::kOk);
    return out.ranks_size() == 1 ? out.ranks(0).device_name() : std::string("?");
  };
  // The hello left before CUDA was up: no device yet. The first batch after the rank's first
  // op carries it.
  EXPECT_EQ(device_of(0), "");
  v1::RecordBatch b;
  b.set_rank(0);
  b.set_batch_seq(1);
  b.mutable_device()->set_name("NVIDIA H100 80GB HBM3");
  b.mutable_device()->set_uuid("GPU-0123");
  *b.add_signatures() = gemmSig(1, 4096, 4096, 4096);
  addKernel(&b, 1, kNow, 1000000);
  ASSERT_TRUE(ingest_->batch(s0, b).ok());
  EXPECT_EQ(device_of(0), "NVIDIA H100 80GB HBM3");
  // An overlong name and one with a control character: ignored and counted; the batch's records
  // are kept.
  v1::RecordBatch h;
  h.set_rank(1);
  h.set_batch_seq(1);
  h.mutable_device()->set_name(std::string(300, 'A'));
  *h.add_signatures() = gemmSig(1, 4096, 4096, 4096);
  addKernel(&h, 1, kNow, 1000000);
  ASSERT_TRUE(ingest_->batch(s1, h).ok());
  v1::RecordBatch h2;
  h2.set_rank(1);
  h2.set_batch_seq(2);
  h2.mutable_device()->set_name(std::string("GPU\n\x1b[31mred", 12));
  addKernel(&h2, 1, kNow + 2000000, 1000000);
  ASSERT_TRUE(ingest_->batch(s1, h2).ok());
  EXPECT_EQ(device_of(1), "");
  EXPECT_EQ(ingest_->counters().bad_device_info.load(), 2u);
  EXPECT_EQ(ingest_->counters().kernel_records.load(), 3u);
}

TEST_F(IngestTest, ReportComputesTflopsBusbwShareAndQuantiles) {
  make();
  const uint64_t s0 = connect("job", 0, 8);
  const uint64_t s1 = connect("job", 1, 8);
  // Rank 0: 3 GEMMs of 4096^3 taking 1 ms each; 2 all-reduces of 64 MiB over 8 ranks, 4 ms.
  v1::RecordBatch b;
  b.set_rank(0);
  b.set_batch_seq(1);
  *b.add_signatures() = gemmSig(1, 4096, 4096, 4096);
  *b.add_signatures() = allReduceSig(2, 64ull << 20);
  for (int i = 0; i < 3; ++i) addKernel(&b, 1, kNow + i * 10000000, 1000000);
  for (int i = 0; i < 2; ++i) addKernel(&b, 2, kNow + i * 10000000, 4000000, 8);
  ASSERT_TRUE(ingest_->batch(s0, b).ok());
  // Rank 1 names the same GEMM with its own id 5: one line in the report.
  v1::RecordBatch b1;
  b1.set_rank(1);
  b1.set_batch_seq(1);
  *b1.add_signatures() = gemmSig(5, 4096, 4096, 4096);
  addKernel(&b1, 5, kNow, 3000000);
  // A host thread waiting 20 ms in cudaEventSynchronize: listed, but no share of GPU time.
  v1::Signature sync;
  sync.set_id(6);
  sync.set_name("cudaEventSynchronize");
  sync.set_kind(v1::OP_KIND_SYNC);
  *b1.add_signatures() = sync;
  addKernel(&b1, 6, kNow + 5000000, 20000000);
  ASSERT_TRUE(ingest_->batch(s1, b1).ok());

  auto r = report("job");
  ASSERT_EQ(r.signatures_size(), 3);
  EXPECT_EQ(r.signatures(0).signature().name(), "cudaEventSynchronize");
  EXPECT_EQ(r.signatures(0).total_ns(), 20000000);
  EXPECT_EQ(r.signatures(0).time_share(), 0);
  r.mutable_signatures()->DeleteSubrange(0, 1);
  const auto& ar = r.signatures(0);    // 8 ms of all-reduce first
  const auto& gemm = r.signatures(1);  // 6 ms of GEMM
  EXPECT_EQ(ar.signature().name(), "ncclAllReduce");
  EXPECT_EQ(ar.count(), 2u);
  EXPECT_EQ(ar.total_ns(), 8000000);
  const double S = 64.0 * (1 << 20);
  EXPECT_NEAR(ar.busbw_gbps(), S / 4e-3 * (2.0 * 7 / 8) / 1e9, 1e-6);
  EXPECT_EQ(ar.tflops(), 0);
  EXPECT_EQ(gemm.count(), 4u);
  EXPECT_EQ(gemm.total_ns(), 6000000);
  const double flops = 4 * 2.0 * 4096.0 * 4096.0 * 4096.0;
  EXPECT_NEAR(gemm.tflops(), flops / 6e-3 / 1e12, 1e-9);
  EXPECT_NEAR(gemm.time_share(), 6.0 / 14.0, 1e-12);
  EXPECT_NEAR(ar.time_share(), 8.0 / 14.0, 1e-12);
  // p50 of {1,1,1,3} ms within a bucket (<19%) of 1 ms; p99 of 3 ms.
  EXPECT_NEAR(gemm.p50_ns(), 1000000, 190000);
  EXPECT_NEAR(gemm.p99_ns(), 3000000, 570000);
}

// The first real-GPU run: one out-of-range step statistic cost its batch, signature tables
// included, and every later batch of the rank was refused as unknown_signature. Now only the bad
// item goes, counted by reason and shown per rank; the tables and the rest are applied.
TEST_F(IngestTest, ContentFailuresDropOnlyTheBadItemAndKeepTheTables) {
  IngestConfig cfg;
  cfg.max_batch_items = 10;
  make(cfg);
  auto ch = std::make_shared<FakeChannel>();
  const uint64_t s = connect("job", 0, 1, ch);
  v1::RecordBatch b;
  b.set_rank(0);
  *b.add_signatures() = gemmSig(1, 128, 128, 128);
  addKernel(&b, 1, kNow, 1000);
  addKernel(&b, 9, kNow, 1000);             // unknown signature
  v1::StepStats* bad = b.add_step_stats();  // T_inter 41x its step (the GPU run's step 0)
  bad->set_start_ns(kNow);
  bad->set_end_ns(kNow + 1000);
  bad->set_inter_ns(41000);
  Verdict v = ingest_->batch(s, b);
  EXPECT_TRUE(v.ok()) << v.error;
  EXPECT_EQ(v.items_dropped, 2u);
  EXPECT_EQ(v.reason, Reason::kUnknownSignature);  // the first refused item's
  EXPECT_FALSE(v.close_stream);
  // The signature table and the good record were applied: later batches may name signature 1.
  EXPECT_EQ(report("job").signatures(0).count(), 1u);
  v1::RecordBatch next;
  next.set_rank(0);
  addKernel(&next, 1, kNow, 1000);
  v = ingest_->batch(s, next);
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v.items_dropped, 0u);
  EXPECT_EQ(report("job").signatures(0).count(), 2u);
  // Absurd timestamps: 1970, far future, end before start; each record dropped alone.
  for (auto [start, dur] : {std::pair<int64_t, int64_t>{1000, 10},
                            {kNow + 86400LL * 1000000000LL * 365, 10},
                            {kNow, -5}}) {
    v1::RecordBatch t;
    t.set_rank(0);
    addKernel(&t, 1, start, dur);
    addKernel(&t, 1, kNow, 10);
    v = ingest_->batch(s, t);
    EXPECT_EQ(v.reason, Reason::kBadTimestamp);
    EXPECT_EQ(v.items_dropped, 1u);
  }
  EXPECT_EQ(report("job").signatures(0).count(), 5u);
  // A bad signature entry goes alone; the good one beside it is kept.
  v1::RecordBatch sigs;
  sigs.set_rank(0);
  *sigs.add_signatures() = gemmSig(0, 64, 64, 64);
  *sigs.add_signatures() = gemmSig(2, 256, 256, 256);
  addKernel(&sigs, 2, kNow, 10);
  v = ingest_->batch(s, sigs);
  EXPECT_EQ(v.reason, Reason::kBadSignature);
  EXPECT_EQ(v.items_dropped, 1u);
  EXPECT_EQ(report("job").signatures_size(), 2);
  // What concerns the batch itself still refuses it whole: too many items.
  v1::RecordBatch big;
  big.set_rank(0);
  for (int i = 0; i < 11; ++i) addKernel(&big, 1, kNow, 10);
  v = ingest_->batch(s, big);
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.reason, Reason::kOversized);
  EXPECT_EQ(report("job").signatures(0).count(), 5u);

  EXPECT_EQ(rejected(Reason::kOversized), 1u);
  EXPECT_EQ(rejected(Reason::kBadTimestamp), 0u);  // no batch was refused for it
  EXPECT_EQ(ingest_->counters().items_dropped[static_cast<size_t>(Reason::kBadTimestamp)], 3u);
  PromWriter w;
  ingest_->writeMetrics(w);
  EXPECT_THAT(w.text(), ::testing::HasSubstr(
                            "flare_ingest_items_dropped_total{reason=\"unknown_signature\"} 1\n"));
  EXPECT_THAT(w.text(), ::testing::HasSubstr(
                            "flare_ingest_items_dropped_total{reason=\"bad_timestamp\"} 3\n"));
  EXPECT_THAT(w.text(),
              ::testing::HasSubstr("flare_ingest_items_dropped_total{reason=\"bad_record\"} 1\n"));
  EXPECT_THAT(w.text(),
              ::testing::HasSubstr("flare_ingest_rejected_total{reason=\"oversized\"} 1\n"));
  // The rank's refusals, by reason, as `flare status` shows them.
  v1::ListRanksRequest req;
  req.set_job_id("job");
  v1::ListRanksResponse ranks;
  ASSERT_EQ(ingest_->ranks(req, &ranks), Code::kOk);
  ASSERT_EQ(ranks.ranks_size(), 1);
  std::map<std::string, v1::Refusals> by;
  for (const v1::Refusals& r : ranks.ranks(0).refusals()) by[r.reason()] = r;
  EXPECT_EQ(by["bad_record"].items(), 1u);
  EXPECT_THAT(by["bad_record"].last_error(), ::testing::HasSubstr("inter_ns 41000"));
  EXPECT_EQ(by["bad_timestamp"].items(), 3u);
  EXPECT_EQ(by["oversized"].batches(), 1u);
  EXPECT_EQ(by["oversized"].items(), 0u);
}

// Raw mode's run-queue readings: one out of range (a 1970 time, a negative or impossible wait)
// is dropped alone and counted; the good ones and the rest of the batch are kept.
TEST_F(IngestTest, RunQueueReadingsOutOfRangeAreDroppedAlone) {
  make(IngestConfig{});
  auto ch = std::make_shared<FakeChannel>();
  const uint64_t s = connect("job", 0, 1, ch);
  v1::RecordBatch b;
  b.set_rank(0);
  *b.add_signatures() = gemmSig(1, 128, 128, 128);
  addKernel(&b, 1, kNow, 1000);
  auto reading = [&](int64_t t, int64_t waited) {
    v1::RunQueueReading* q = b.add_run_queue();
    q->set_thread_id(7);
    q->set_time_ns(t);
    q->set_waited_ns(waited);
  };
  reading(kNow, 5'000);
  reading(1000, 5'000);               // 1970
  reading(kNow + 1000, -1);           // a negative wait
  reading(kNow + 2000, kNow + 3000);  // longer than the thread can have lived
  reading(kNow + 10'000'000, 9'000);
  const Verdict v = ingest_->batch(s, b);
  EXPECT_TRUE(v.ok()) << v.error;
  EXPECT_EQ(v.items_dropped, 3u);
  EXPECT_EQ(v.reason, Reason::kBadTimestamp);
  EXPECT_EQ(ingest_->counters().items_dropped[static_cast<size_t>(Reason::kBadTimestamp)], 1u);
  EXPECT_EQ(ingest_->counters().items_dropped[static_cast<size_t>(Reason::kBadRecord)], 2u);
  EXPECT_EQ(report("job").signatures(0).count(), 1u);
}

TEST_F(IngestTest, StreamIsBoundToItsRankAndJob) {
  make();
  const uint64_t a0 = connect("jobA", 0, 2);
  connect("jobB", 1, 2);
  v1::RecordBatch b;
  b.set_rank(1);  // jobA's rank-0 stream claims rank 1
  *b.add_signatures() = gemmSig(1, 64, 64, 64);
  addKernel(&b, 1, kNow, 100);
  Verdict v = ingest_->batch(a0, b);
  EXPECT_EQ(v.code, Code::kPermissionDenied);
  EXPECT_TRUE(v.close_stream);
  EXPECT_EQ(rejected(Reason::kRankMismatch), 1u);
  // Nothing reached job B (nor job A).
  EXPECT_EQ(report("jobB").signatures_size(), 0);
  EXPECT_EQ(report("jobA").signatures_size(), 0);
  // A batch naming its own rank lands in its own job only.
  b.set_rank(0);
  ASSERT_TRUE(ingest_->batch(a0, b).ok());
  EXPECT_EQ(report("jobA").signatures_size(), 1);
  EXPECT_EQ(report("jobB").signatures_size(), 0);
}

TEST_F(IngestTest, ReconnectReplacesSessionAndDeliversQueuedCommands) {
  make();
  auto old_ch = std::make_shared<FakeChannel>();
  const uint64_t old_s = connect("job", 0, 2, old_ch);
  ingest_->close(old_s);
  // Rank away: the command waits for it.
  v1::SendCommandRequest req;
  req.set_job_id("job");
  req.mutable_command()->mutable_dump_stacks()->set_native(true);
  v1::SendCommandResponse resp;
  std::string err;
  ASSERT_EQ(ingest_->sendCommand(req, "", &resp, &err), Code::kOk);
  EXPECT_EQ(resp.queued(), 1);
  auto ch1 = std::make_shared<FakeChannel>();
  auto out = ingest_->hello(makeHello("job", 0, 2), ch1);
  ASSERT_EQ(out.pending.size(), 1u);
  EXPECT_EQ(out.pending[0].id(), resp.command_id());
  EXPECT_TRUE(out.pending[0].has_dump_stacks());
  // A second stream of the same rank replaces the first, which is told to close.
  auto ch2 = std::make_shared<FakeChannel>();
  const uint64_t s2 = connect("job", 0, 2, ch2);
  EXPECT_TRUE(ch1->closed);
  v1::RecordBatch b;
  b.set_rank(0);
  EXPECT_EQ(ingest_->batch(out.session_id, b).reason, Reason::kSessionReplaced);
  EXPECT_TRUE(ingest_->batch(s2, b).ok());
  // Live rank: delivered on its channel; the result comes back by command id.
  v1::SendCommandResponse resp2;
  ASSERT_EQ(ingest_->sendCommand(req, "", &resp2, &err), Code::kOk);
  EXPECT_EQ(resp2.delivered(), 1);
  ASSERT_EQ(ch2->sent.size(), 1u);
  EXPECT_EQ(ch2->sent[0].command().id(), resp2.command_id());
  v1::CommandResult res;
  res.set_command_id(resp2.command_id());
  res.set_ok(true);
  res.mutable_stacks()->add_threads()->set_thread_id(42);
  EXPECT_TRUE(ingest_->commandResult(s2, res).ok());
  v1::GetCommandResultsRequest rq;
  rq.set_job_id("job");
  rq.set_command_id(resp2.command_id());
  v1::GetCommandResultsResponse rr;
  ASSERT_EQ(ingest_->commandResults(rq, &rr), Code::kOk);
  ASSERT_EQ(rr.results_size(), 1);
  EXPECT_EQ(rr.results(0).result().stacks().threads(0).thread_id(), 42u);
  v1::ListRanksRequest lr;
  lr.set_job_id("job");
  v1::ListRanksResponse ranks;
  ASSERT_EQ(ingest_->ranks(lr, &ranks), Code::kOk);
  ASSERT_EQ(ranks.ranks_size(), 1);
  EXPECT_TRUE(ranks.ranks(0).connected());
  // One rank asked for: that one, or none.
  lr.set_rank(0);
  v1::ListRanksResponse one;
  ASSERT_EQ(ingest_->ranks(lr, &one), Code::kOk);
  ASSERT_EQ(one.ranks_size(), 1);
  EXPECT_EQ(one.ranks(0).rank(), 0);
  lr.set_rank(5);
  v1::ListRanksResponse none;
  ASSERT_EQ(ingest_->ranks(lr, &none), Code::kOk);
  EXPECT_EQ(none.ranks_size(), 0);
}

TEST_F(IngestTest, SendCommandNeedsTheJobsToken) {
  IngestConfig cfg;
  cfg.job_tokens["job"] = "t";
  make(cfg);
  connect("job", 0, 1, nullptr, "t");
  v1::SendCommandRequest req;
  req.set_job_id("job");
  req.mutable_command()->mutable_deep_trace()->set_steps(3);
  v1::SendCommandResponse resp;
  std::string err;
  EXPECT_EQ(ingest_->sendCommand(req, "x", &resp, &err), Code::kUnauthenticated);
  EXPECT_EQ(ingest_->sendCommand(req, "t", &resp, &err), Code::kOk);
  EXPECT_EQ(resp.delivered(), 1);
  // Exit (FLARE_HANG_KILL) is the hang monitor's alone, even with the job's token.
  req.mutable_command()->mutable_exit()->set_reason("operator");
  EXPECT_EQ(ingest_->sendCommand(req, "t", &resp, &err), Code::kPermissionDenied);
  EXPECT_NE(err.find("hang diagnosis"), std::string::npos) << err;
}

v1::RecordBatch seqBatch(uint64_t seq, bool spool) {
  v1::RecordBatch b;
  b.set_rank(0);
  b.set_batch_seq(seq);
  b.set_created_ns(kNow + static_cast<int64_t>(seq));
  b.set_from_spool(spool);
  return b;
}

TEST_F(IngestTest, SeqGapsCountedDuplicatesDroppedResumePointAcked) {
  make();
  const uint64_t s = connect("job", 0, 1);
  EXPECT_TRUE(ingest_->batch(s, seqBatch(1, false)).ok());
  EXPECT_TRUE(ingest_->batch(s, seqBatch(4, false)).ok());  // a jump: one lost batch, for now
  EXPECT_EQ(ingest_->counters().lost_batches.load(), 1u);
  EXPECT_EQ(ingest_->batch(s, seqBatch(4, false)).reason, Reason::kOutOfOrder);
  EXPECT_TRUE(ingest_->batch(s, seqBatch(5, false)).ok());  // confirmed: 2 and 3 lost
  EXPECT_EQ(ingest_->counters().lost_batches.load(), 2u);
  // Replays at or below the highest seq applied are duplicates; above it they are new.
  EXPECT_EQ(ingest_->batch(s, seqBatch(2, true)).reason, Reason::kDuplicateBatch);
  EXPECT_EQ(ingest_->batch(s, seqBatch(4, true)).reason, Reason::kDuplicateBatch);
  EXPECT_TRUE(ingest_->batch(s, seqBatch(6, true)).ok());
  EXPECT_EQ(ingest_->counters().batches.load(), 4u);
  EXPECT_EQ(rejected(Reason::kDuplicateBatch), 2u);
  EXPECT_EQ(rejected(Reason::kOutOfOrder), 1u);
  // The same process reconnecting is told where to resume.
  auto again = ingest_->hello(makeHello("job", 0, 1), std::make_shared<FakeChannel>());
  ASSERT_TRUE(again.ack.accepted());
  EXPECT_EQ(again.ack.resume_after_seq(), 6u);
  EXPECT_EQ(ingest_->batch(again.session_id, seqBatch(6, true)).reason, Reason::kDuplicateBatch);
  EXPECT_TRUE(ingest_->batch(again.session_id, seqBatch(7, false)).ok());
  // A new process of the rank (another pid) numbers from 1 again.
  auto fresh = ingest_->hello(makeHello("job", 0, 1, "", 2000), std::make_shared<FakeChannel>());
  EXPECT_EQ(fresh.ack.resume_after_seq(), 0u);
  EXPECT_TRUE(ingest_->batch(fresh.session_id, seqBatch(1, false)).ok());
  // ... and so does the same pid started again (another start time).
  v1::RankHello h = makeHello("job", 0, 1);
  h.set_start_time_unix_ns(kNow + 1);
  EXPECT_EQ(ingest_->hello(h, std::make_shared<FakeChannel>()).ack.resume_after_seq(), 0u);
  EXPECT_EQ(ingest_->counters().lost_batches.load(), 2u);
}

// A bit-flipped batch_seq (the issue's probe made lostBatches 13,374) moves lost_batches by one
// batch at most and does not cut the rank off: its next batches carry on from the real sequence.
TEST_F(IngestTest, GarbageBatchSeqMovesLostBatchesByOneAtMost) {
  make();
  const uint64_t s = connect("job", 0, 1);
  EXPECT_TRUE(ingest_->batch(s, seqBatch(1, false)).ok());
  EXPECT_TRUE(ingest_->batch(s, seqBatch(2, false)).ok());
  EXPECT_TRUE(ingest_->batch(s, seqBatch(2 | (uint64_t{1} << 44), false)).ok());
  EXPECT_LE(ingest_->counters().lost_batches.load(), 1u);
  EXPECT_TRUE(ingest_->batch(s, seqBatch(3, false)).ok());
  EXPECT_TRUE(ingest_->batch(s, seqBatch(4, false)).ok());
  EXPECT_LE(ingest_->counters().lost_batches.load(), 1u);
  // The garbage seq again is a duplicate, not a second jump.
  EXPECT_EQ(ingest_->batch(s, seqBatch(2 | (uint64_t{1} << 44), true)).reason,
            Reason::kDuplicateBatch);
  // The resume point is the real sequence's.
  EXPECT_EQ(ingest_->hello(makeHello("job", 0, 1), std::make_shared<FakeChannel>())
                .ack.resume_after_seq(),
            4u);
  v1::ListRanksRequest req;
  req.set_job_id("job");
  v1::ListRanksResponse out;
  ASSERT_EQ(ingest_->ranks(req, &out), Code::kOk);
  ASSERT_EQ(out.ranks_size(), 1);
  EXPECT_LE(out.ranks(0).lost_batches(), 1u);
}

TEST_F(IngestTest, RealGapsAreCountedInFullOnceTheNextBatchConfirmsThem) {
  make();
  uint64_t s = connect("job", 0, 1);
  for (uint64_t q : {1, 2, 10, 11, 12}) EXPECT_TRUE(ingest_->batch(s, seqBatch(q, false)).ok());
  EXPECT_EQ(ingest_->counters().lost_batches.load(), 7u);  // 3..9
  // A garbage jump, then a real one: 1 for the garbage, 5 for 13..17.
  EXPECT_TRUE(ingest_->batch(s, seqBatch(uint64_t{1} << 50, false)).ok());
  for (uint64_t q : {18, 19}) EXPECT_TRUE(ingest_->batch(s, seqBatch(q, false)).ok());
  EXPECT_EQ(ingest_->counters().lost_batches.load(), 7u + 1 + 5);
}

TEST_F(IngestTest, ResumeMarksAreBoundedPerRank) {
  IngestConfig cfg;
  cfg.max_incarnations_per_rank = 2;
  make(cfg);
  for (int pid : {1000, 2000, 3000}) {
    auto out = ingest_->hello(makeHello("job", 0, 1, "", pid), std::make_shared<FakeChannel>());
    clock_.advanceNs(1000);
    ASSERT_TRUE(ingest_->batch(out.session_id, seqBatch(7, false)).ok());
  }
  // pid 1000 was heard from least recently: forgotten. The two others are kept.
  EXPECT_EQ(ingest_->hello(makeHello("job", 0, 1, "", 3000), nullptr).ack.resume_after_seq(), 7u);
  EXPECT_EQ(ingest_->hello(makeHello("job", 0, 1, "", 2000), nullptr).ack.resume_after_seq(), 7u);
  EXPECT_EQ(ingest_->hello(makeHello("job", 0, 1, "", 1000), nullptr).ack.resume_after_seq(), 0u);
}

TEST_F(IngestTest, RateLimitIsPerRankTokenBucket) {
  IngestConfig cfg;
  cfg.rank_rate_limit = 100;  // records/s, 2 s burst = 200
  make(cfg);
  const uint64_t s = connect("job", 0, 1);
  auto batch = [](int n) {
    v1::RecordBatch b;
    b.set_rank(0);
    *b.add_signatures() = gemmSig(1, 8, 8, 8);
    for (int i = 0; i < n; ++i) addKernel(&b, 1, kNow, 10);
    return b;
  };
  EXPECT_TRUE(ingest_->batch(s, batch(150)).ok());
  EXPECT_EQ(ingest_->batch(s, batch(100)).reason, Reason::kRateLimited);  // 50 left
  clock_.advanceNs(1000000000);                                           // +100 tokens
  EXPECT_TRUE(ingest_->batch(s, batch(100)).ok());
  EXPECT_EQ(rejected(Reason::kRateLimited), 1u);
  EXPECT_EQ(report("job").signatures(0).count(), 250u);
}

TEST_F(IngestTest, DropCountersBecomeDeltas) {
  make();
  const uint64_t s = connect("job", 0, 1);
  v1::RecordBatch b;
  b.set_rank(0);
  b.mutable_drops()->set_ring_full(5);
  b.mutable_drops()->set_unfinished(1);
  b.mutable_drops()->set_run_queue_unmeasured(3);
  ASSERT_TRUE(ingest_->batch(s, b).ok());
  b.mutable_drops()->set_ring_full(12);  // cumulative: +7
  b.mutable_drops()->set_run_queue_unmeasured(5);
  ASSERT_TRUE(ingest_->batch(s, b).ok());
  EXPECT_EQ(ingest_->counters().rank_drops[0].load(), 12u);
  EXPECT_EQ(ingest_->counters().rank_drops[10].load(), 1u);
  EXPECT_EQ(ingest_->counters().rank_drops[11].load(), 5u);
  PromWriter w;
  ingest_->writeMetrics(w);
  EXPECT_THAT(w.text(), ::testing::HasSubstr("flare_rank_drops_total{kind=\"ring_full\"} 12\n"));
  EXPECT_THAT(w.text(), ::testing::HasSubstr("flare_rank_drops_total{kind=\"unfinished\"} 1\n"));
  EXPECT_THAT(w.text(),
              ::testing::HasSubstr("flare_rank_drops_total{kind=\"run_queue_unmeasured\"} 5\n"));
}

TEST_F(IngestTest, SummariesFeedTheReport) {
  make();
  const uint64_t s = connect("job", 0, 1);
  v1::RecordBatch b;
  b.set_rank(0);
  *b.add_signatures() = gemmSig(3, 1024, 1024, 1024);
  v1::KernelSummary* sm = b.add_summaries();
  sm->set_signature_id(3);
  sm->set_window_start_ns(kNow);
  sm->set_window_end_ns(kNow + 1000000000);
  auto* c = sm->add_clusters();
  c->set_count(200);
  c->set_p50_ns(100000);
  c->set_p99_ns(150000);
  c->set_sum_ns(200 * 101000);
  ASSERT_TRUE(ingest_->batch(s, b).ok());
  const auto r = report("job");
  ASSERT_EQ(r.signatures_size(), 1);
  EXPECT_EQ(r.signatures(0).count(), 200u);
  EXPECT_EQ(r.signatures(0).total_ns(), 200 * 101000);
  EXPECT_NEAR(r.signatures(0).tflops(), 200 * 2.0 * 1024 * 1024 * 1024 / (200 * 101000e-9) / 1e12,
              1e-9);
  EXPECT_NEAR(r.signatures(0).p50_ns(), 100000, 19000);
}

// 1-in-N sampled plain kernels (FLARE_SAMPLE_KERNELS): a raw record of weight w counts w
// launches of its duration (count, total, FLOPs), a sampled summary's counts are taken as they
// come, and the report says how many of the count were estimated; a weight beyond any gap the
// hook can draw is refused.
TEST_F(IngestTest, SampledKernelsAreEstimatedInTheReport) {
  make();
  const uint64_t s = connect("job", 0, 1);
  v1::RecordBatch b;
  b.set_rank(0);
  b.set_batch_seq(1);
  v1::Signature k;
  k.set_id(1);
  k.set_name("elementwise_kernel");
  k.set_kind(v1::OP_KIND_KERNEL);
  *b.add_signatures() = k;
  k.set_id(2);
  k.set_name("reduce_kernel");
  *b.add_signatures() = k;
  addKernel(&b, 1, kNow, 10000)->set_weight(8);
  addKernel(&b, 1, kNow + 100000, 10000)->set_weight(5);
  addKernel(&b, 1, kNow + 200000, 10000);                     // a warm-up launch: weight 1
  addKernel(&b, 1, kNow + 300000, 10000)->set_weight(70000);  // refused
  v1::KernelSummary* sm = b.add_summaries();
  sm->set_signature_id(2);
  sm->set_window_start_ns(kNow);
  sm->set_window_end_ns(kNow + 1000000);
  sm->set_sampled_ops(10);
  auto* c = sm->add_clusters();
  c->set_count(80);
  c->set_p50_ns(20000);
  c->set_p99_ns(21000);
  c->set_sum_ns(80 * 20000);
  ASSERT_TRUE(ingest_->batch(s, b).ok());
  const auto r = report("job");
  ASSERT_EQ(r.signatures_size(), 2);
  EXPECT_EQ(r.signatures(0).signature().name(), "reduce_kernel");
  EXPECT_EQ(r.signatures(0).count(), 80u);
  EXPECT_EQ(r.signatures(0).estimated(), 70u);
  EXPECT_EQ(r.signatures(1).count(), 14u);
  EXPECT_EQ(r.signatures(1).total_ns(), 14 * 10000);
  EXPECT_EQ(r.signatures(1).estimated(), 11u);
}

}  // namespace
}  // namespace flare::engine

namespace flare::engine {
namespace {

// A rank's stored summary rows in progress: found by (signature, stream) whatever the order the
// rank asks in, a taken row leaves a free slot with its key, and slots free for a whole window
// are forgotten without losing the others.
TEST(OpenWindowsTest, FindsRowsByKeyInAnyOrderAndForgetsIdleSlots) {
  OpenWindows ow;
  for (uint32_t sig = 1; sig <= 40; ++sig) {
    WindowSummaryRow& r = ow.row(sig, sig % 3);
    EXPECT_EQ(r.count, 0u);
    r.count = sig;
    r.window_start_ns = 100;
  }
  // The same order (the hint), reversed and strided orders (the index) find the same rows.
  for (uint32_t sig = 1; sig <= 40; ++sig) EXPECT_EQ(ow.row(sig, sig % 3).count, sig);
  for (uint32_t sig = 40; sig >= 1; --sig) EXPECT_EQ(ow.row(sig, sig % 3).count, sig);
  for (uint32_t sig = 1; sig <= 40; sig += 7) EXPECT_EQ(ow.row(sig, sig % 3).count, sig);
  // Same signature, another stream: another row.
  EXPECT_EQ(ow.row(5, 99).count, 0u);
  EXPECT_EQ(ow.slots().size(), 41u);
  // Taking a row moves it out; its slot keeps the key and is found again, empty.
  const WindowSummaryRow taken = OpenWindows::take(ow.row(7, 1));
  EXPECT_EQ(taken.count, 7u);
  EXPECT_EQ(taken.sig_id, 7u);
  EXPECT_EQ(ow.row(7, 1).count, 0u);
  EXPECT_EQ(ow.slots().size(), 41u);
  // Free slots of windows before 200 are dropped (7's and the (5, 99) one); the rest are kept
  // and still found.
  ow.dropIdle(200);
  EXPECT_EQ(ow.slots().size(), 39u);
  for (uint32_t sig = 1; sig <= 40; ++sig) {
    if (sig != 7) {
      EXPECT_EQ(ow.row(sig, sig % 3).count, sig);
    }
  }
  EXPECT_EQ(ow.row(7, 1).count, 0u);  // a new slot
  EXPECT_EQ(ow.slots().size(), 40u);
}

}  // namespace
}  // namespace flare::engine
