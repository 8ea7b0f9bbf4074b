#include "src/timing/spool_sink.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/records/spool_format.h"
#include "src/timing/testing/fake_device_timer.h"
#include "src/timing/timing.h"

namespace flare::timing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kEpochOffset = 1'700'000'000'000'000'000;  // monotonic 0 = this epoch time

SpoolSinkOptions fixedOptions(size_t batch_bytes = size_t{64} * 1024) {
  SpoolSinkOptions options;
  options.batch_bytes = batch_bytes;
  options.clock_map = [] { return common::ClockMap(0, kEpochOffset); };
  return options;
}

class SpoolSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "flare-spool-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    common::setLogCapture([this](common::LogLevel level, std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      if (level >= common::LogLevel::kWarn) warnings_.emplace_back(line);
    });
  }
  void TearDown() override {
    common::setLogCapture({});
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::vector<std::string> warnings() {
    std::lock_guard<std::mutex> lock(mu_);
    return warnings_;
  }
  std::vector<flare::v1::RecordBatch> readBack(const std::string& path) {
    std::vector<flare::v1::RecordBatch> batches;
    std::string error;
    EXPECT_TRUE(records::readSpoolFile(path, &batches, &error)) << error;
    return batches;
  }

  std::string dir_;
  std::mutex mu_;
  std::vector<std::string> warnings_;
};

Signature makeSignature(std::string name, OpKind kind = OpKind::kKernel) {
  Signature sig;
  sig.name = std::move(name);
  sig.kind = kind;
  return sig;
}

CompletedOp kernelOp(uint32_t sig, uint64_t seq, int64_t start_ns) {
  CompletedOp op;
  op.info.signature_id = sig;
  op.info.kind = OpKind::kGemm;
  op.info.flops = 1'000'000;
  op.info.seq = seq;
  op.stream_id = 42;
  op.device = 3;
  op.thread_id = 1234;
  op.issue_ns = start_ns - 7'000;
  op.start_ns = start_ns;
  op.end_ns = start_ns + 2'500;
  return op;
}

TEST_F(SpoolSinkTest, RoundTrip) {
  std::string path;
  {
    SpoolSink sink(dir_, "job-1", 5, 4242, fixedOptions());
    path = sink.path();
    EXPECT_EQ(path, dir_ + "/job-1/5/records-4242.pb");
    sink.onSignature(1, Signature{.name = "cublasGemmEx",
                                  .kind = OpKind::kGemm,
                                  .dtype = "bf16",
                                  .shape = {1, 4096, 4096, 1024},
                                  .layout = "tn"});
    sink.onSignature(2, Signature{.name = "ncclAllReduce",
                                  .kind = OpKind::kCollective,
                                  .dtype = "bf16",
                                  .shape = {1 << 20},
                                  .layout = "sum"});
    CompletedOp coll = kernelOp(2, 17, 50'000);
    coll.info.kind = OpKind::kCollective;
    coll.info.bytes = 2 << 20;
    coll.info.comm_hash = 0xfeed;
    coll.info.nranks = 8;
    coll.info.peer = -1;
    const CompletedOp ops[] = {kernelOp(1, 0, 10'000), coll};
    sink.onOps(ops);
    sink.onDrops(DropCounters{
        .ring_full = 1, .events_exhausted = 2, .event_errors = 3, .capturing = 4, .unfinished = 5});
    sink.flush();
    EXPECT_EQ(sink.batchesWritten(), 1u);
    EXPECT_FALSE(sink.disabled());
  }
  const auto batches = readBack(path);
  ASSERT_EQ(batches.size(), 1u);
  const flare::v1::RecordBatch& batch = batches[0];
  EXPECT_EQ(batch.rank(), 5);
  EXPECT_EQ(batch.batch_seq(), 1u);
  EXPECT_GT(batch.created_ns(), 0);
  ASSERT_EQ(batch.signatures_size(), 2);
  EXPECT_EQ(batch.signatures(0).id(), 1u);
  EXPECT_EQ(batch.signatures(0).name(), "cublasGemmEx");
  EXPECT_EQ(batch.signatures(0).kind(), flare::v1::OP_KIND_GEMM);
  EXPECT_EQ(batch.signatures(0).dtype(), flare::v1::DTYPE_BF16);
  EXPECT_THAT(batch.signatures(0).shape(), ::testing::ElementsAre(1, 4096, 4096, 1024));
  EXPECT_EQ(batch.signatures(0).layout(), "tn");
  EXPECT_EQ(batch.signatures(0).library(), "cublas");
  EXPECT_EQ(batch.signatures(1).collective(), flare::v1::COLLECTIVE_KIND_ALL_REDUCE);
  EXPECT_EQ(batch.signatures(1).library(), "nccl");

  ASSERT_EQ(batch.kernels_size(), 2);
  const flare::v1::KernelRecord& k = batch.kernels(0);
  EXPECT_EQ(k.signature_id(), 1u);
  EXPECT_EQ(k.stream_id(), 42u);
  EXPECT_EQ(k.device(), 3);
  EXPECT_EQ(k.thread_id(), 1234u);
  EXPECT_EQ(k.start_ns(), kEpochOffset + 10'000);
  EXPECT_EQ(k.end_ns(), kEpochOffset + 12'500);
  EXPECT_EQ(k.issue_ns(), kEpochOffset + 3'000);
  EXPECT_EQ(k.issue_latency_ns(), 7'000);
  EXPECT_EQ(k.flops(), 1'000'000u);
  EXPECT_FALSE(k.has_collective());
  const flare::v1::KernelRecord& c = batch.kernels(1);
  ASSERT_TRUE(c.has_collective());
  EXPECT_EQ(c.collective().comm_hash(), 0xfeedu);
  EXPECT_EQ(c.collective().seq(), 17u);
  EXPECT_EQ(c.collective().nranks(), 8);
  EXPECT_EQ(c.collective().count(), 1u << 20);
  EXPECT_FALSE(c.collective().has_peer());
  EXPECT_EQ(c.bytes(), 2u << 20);

  EXPECT_EQ(batch.drops().ring_full(), 1u);
  EXPECT_EQ(batch.drops().events_exhausted(), 2u);
  EXPECT_EQ(batch.drops().event_errors(), 3u);
  EXPECT_EQ(batch.drops().capturing(), 4u);
  EXPECT_EQ(batch.drops().unfinished(), 5u);
  EXPECT_THAT(warnings(), ::testing::IsEmpty());
}

TEST_F(SpoolSinkTest, BatchesAreCutBySizeAndSignaturesSentOnce) {
  std::string path;
  {
    SpoolSink sink(dir_, "job", 0, 1, fixedOptions(1024));
    path = sink.path();
    sink.onSignature(1, makeSignature("k1"));
    sink.onSignature(2, makeSignature("k2"));
    std::vector<CompletedOp> ops;
    for (uint64_t i = 0; i < 1000; ++i)
      ops.push_back(kernelOp(1 + i % 2, i, 1'000 * static_cast<int64_t>(i)));
    sink.onOps(ops);
    sink.flush();
    sink.flush();  // nothing new: no empty batch
  }
  const auto batches = readBack(path);
  ASSERT_GT(batches.size(), 10u);
  int signatures = 0;
  int kernels = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i].batch_seq(), i + 1);
    EXPECT_LT(batches[i].ByteSizeLong(), 1024u + 256u);
    signatures += batches[i].signatures_size();
    for (const auto& k : batches[i].kernels()) {
      EXPECT_EQ(k.start_ns(), kEpochOffset + 1'000 * static_cast<int64_t>(kernels));
      ++kernels;
    }
  }
  EXPECT_EQ(batches[0].signatures_size(), 2);
  EXPECT_EQ(signatures, 2);
  EXPECT_EQ(kernels, 1000);
}

TEST_F(SpoolSinkTest, SpansAndApiNamesRoundTripWithGcDetails) {
  std::string path;
  {
    SpoolSink sink(dir_, "job", 3, 1, fixedOptions());
    path = sink.path();
    sink.onApiName(1, "torch.cuda@synchronize");
    sink.onApiName(2, "gc@collect");
    std::vector<CompletedSpan> spans(2);
    spans[0] = CompletedSpan{.id = 1, .api_id = 1, .thread_id = 77, .start_ns = 100, .end_ns = 250};
    spans[1] = CompletedSpan{.id = 2,
                             .api_id = 2,
                             .thread_id = 77,
                             .parent_id = 1,
                             .start_ns = 120,
                             .end_ns = 200,
                             .gc_generation = 2,
                             .gc_collected = 31,
                             .gc_uncollectable = 1};
    sink.onSpans(spans);
    CompletedOp op = kernelOp(1, 0, 300);
    op.parent_span_id = 1;
    op.correlation_id = 5;
    sink.onSignature(1, makeSignature("k1"));
    sink.onOps(std::span<const CompletedOp>(&op, 1));
    DropCounters drops;
    drops.spans_dropped = 4;
    sink.onDrops(drops);
  }
  const auto batches = readBack(path);
  ASSERT_EQ(batches.size(), 1u);
  const auto& b = batches[0];
  ASSERT_EQ(b.api_names_size(), 2);
  EXPECT_EQ(b.api_names(0).qualified_name(), "torch.cuda@synchronize");
  ASSERT_EQ(b.spans_size(), 2);
  EXPECT_EQ(b.spans(0).start_ns(), kEpochOffset + 100);
  EXPECT_EQ(b.spans(0).end_ns(), kEpochOffset + 250);
  EXPECT_FALSE(b.spans(0).has_gc());
  EXPECT_EQ(b.spans(1).parent_span_id(), 1u);
  ASSERT_TRUE(b.spans(1).has_gc());
  EXPECT_EQ(b.spans(1).gc().generation(), 2);
  EXPECT_EQ(b.spans(1).gc().collected(), 31);
  EXPECT_EQ(b.spans(1).gc().uncollectable(), 1);
  ASSERT_EQ(b.kernels_size(), 1);
  EXPECT_EQ(b.kernels(0).parent_span_id(), 1u);
  EXPECT_EQ(b.kernels(0).correlation_id(), 5u);
  EXPECT_EQ(b.drops().spans_dropped(), 4u);
}

TEST_F(SpoolSinkTest, DropsAloneMakeABatch) {
  std::string path;
  {
    SpoolSink sink(dir_, "job", 0, 1, fixedOptions());
    path = sink.path();
    sink.flush();  // nothing at all
    DropCounters drops;
    drops.ring_full = 9;
    sink.onDrops(drops);
    sink.flush();
  }
  const auto batches = readBack(path);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].drops().ring_full(), 9u);
}

TEST_F(SpoolSinkTest, TruncatedAndGarbageFilesAreRejected) {
  std::string path;
  {
    SpoolSink sink(dir_, "job", 0, 1, fixedOptions());
    path = sink.path();
    for (uint64_t b = 0; b < 3; ++b) {
      const CompletedOp ops[] = {kernelOp(0, b, 100)};
      sink.onOps(ops);
      sink.flush();
    }
  }
  ASSERT_EQ(readBack(path).size(), 3u);

  fs::resize_file(path, fs::file_size(path) - 5);
  std::vector<flare::v1::RecordBatch> batches;
  std::string error;
  EXPECT_FALSE(records::readSpoolFile(path, &batches, &error));
  EXPECT_THAT(error, HasSubstr("truncated"));
  EXPECT_EQ(batches.size(), 2u);  // the complete ones before the cut

  const std::string garbage = dir_ + "/garbage.pb";
  std::ofstream(garbage, std::ios::binary) << std::string("\x03\x0f\xff\xff", 4);
  batches.clear();
  EXPECT_FALSE(records::readSpoolFile(garbage, &batches, &error));
  EXPECT_THAT(error, HasSubstr("malformed"));
  EXPECT_TRUE(batches.empty());

  std::ofstream(garbage, std::ios::binary | std::ios::trunc)
      << std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11);
  EXPECT_FALSE(records::readSpoolFile(garbage, &batches, &error));
  EXPECT_THAT(error, HasSubstr("length prefix"));

  std::ofstream(garbage, std::ios::binary | std::ios::trunc) << std::string("\xff\xff\xff\x7f", 4);
  EXPECT_FALSE(records::readSpoolFile(garbage, &batches, &error));
  EXPECT_THAT(error, HasSubstr("implausible"));

  { std::ofstream empty(garbage, std::ios::binary | std::ios::trunc); }  // valid, no batches
  EXPECT_TRUE(records::readSpoolFile(garbage, &batches, &error));
  EXPECT_TRUE(batches.empty());

  EXPECT_FALSE(records::readSpoolFile(dir_ + "/missing.pb", &batches, &error));
}

TEST_F(SpoolSinkTest, UnwritableDirectoryDisablesWithOneWarning) {
  const std::string blocker = dir_ + "/not-a-dir";
  std::ofstream(blocker) << "x";
  SpoolSink sink(blocker, "job", 0, 1, fixedOptions());
  EXPECT_TRUE(sink.disabled());
  const CompletedOp ops[] = {kernelOp(0, 0, 100)};
  sink.onSignature(1, makeSignature("k"));
  sink.onOps(ops);
  sink.flush();
  sink.onOps(ops);
  sink.flush();
  EXPECT_EQ(sink.recordsDropped(), 2u);
  EXPECT_EQ(sink.batchesWritten(), 0u);
  const auto lines = warnings();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("spool"));
}

TEST_F(SpoolSinkTest, DiskFullDisablesWithOneWarning) {
  SpoolSink sink(dir_, "job", 0, 1, fixedOptions());
  ASSERT_FALSE(sink.disabled());
  const CompletedOp ops[] = {kernelOp(0, 0, 100), kernelOp(0, 1, 200)};
  {
    // Every write fails (EFBIG, as ENOSPC would): a file size limit of one byte for a moment.
    // (A symlink to /dev/full no longer works: the spool does not follow symlinks.)
    rlimit old{};
    ::getrlimit(RLIMIT_FSIZE, &old);
    const auto previous = ::signal(SIGXFSZ, SIG_IGN);
    rlimit tiny = old;
    tiny.rlim_cur = 1;
    ::setrlimit(RLIMIT_FSIZE, &tiny);
    sink.onOps(ops);
    sink.flush();
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, previous);
  }
  EXPECT_TRUE(sink.disabled());
  sink.onOps(ops);
  sink.flush();
  EXPECT_EQ(sink.recordsDropped(), 4u);
  const auto lines = warnings();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("writing failed"));
}

// The issue's probe: a pre-made symlink DIR/<job>/<rank> -> elsewhere. Nothing is written
// through it (the sink refuses the folder, with one warning); neither through a symlinked file.
TEST_F(SpoolSinkTest, SymlinksInTheSpoolAreNotFollowed) {
  const fs::path elsewhere = fs::path(dir_) / "elsewhere";
  fs::create_directories(elsewhere);
  fs::create_directories(fs::path(dir_) / "job");
  fs::create_directory_symlink(elsewhere, fs::path(dir_) / "job" / "0");
  {
    SpoolSink sink(dir_, "job", 0, 1, fixedOptions());
    EXPECT_TRUE(sink.disabled());
    const CompletedOp ops[] = {kernelOp(0, 0, 100)};
    sink.onOps(ops);
    sink.flush();
  }
  EXPECT_TRUE(fs::is_empty(elsewhere));
  const auto lines = warnings();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("symbolic link"));
  fs::create_directories(fs::path(dir_) / "job" / "1");
  fs::create_symlink(elsewhere / "target.pb", fs::path(dir_) / "job" / "1" / "records-1.pb");
  {
    SpoolSink sink(dir_, "job", 1, 1, fixedOptions());
    EXPECT_TRUE(sink.disabled());
  }
  EXPECT_TRUE(fs::is_empty(elsewhere));
}

TEST_F(SpoolSinkTest, FoldersAreCreatedPrivate) {
  SpoolSink sink(dir_, "job", 0, 1, fixedOptions());
  ASSERT_FALSE(sink.disabled());
  for (const fs::path& p : {fs::path(dir_) / "job", fs::path(dir_) / "job" / "0"}) {
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, fs::perms::owner_all) << p;
  }
  EXPECT_EQ(fs::status(sink.path()).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(SpoolSinkTest, JobIdIsOnePathComponent) {
  SpoolSink sink(dir_, "../a/b c", 2, 7, fixedOptions());
  EXPECT_EQ(sink.path(), dir_ + "/.._a_b_c/2/records-7.pb");
  EXPECT_FALSE(sink.disabled());
}

TEST(SpoolSinkMappingTest, KindsAndTypes) {
  EXPECT_EQ(toProtoKind(OpKind::kP2P), flare::v1::OP_KIND_P2P);
  EXPECT_EQ(toProtoKind(OpKind::kMemcpy), flare::v1::OP_KIND_MEMCPY);
  EXPECT_EQ(toProtoKind(OpKind::kSync), flare::v1::OP_KIND_SYNC);
  EXPECT_EQ(toProtoDType("BF16"), flare::v1::DTYPE_BF16);
  EXPECT_EQ(toProtoDType("fp16"), flare::v1::DTYPE_F16);
  EXPECT_EQ(toProtoDType("f32"), flare::v1::DTYPE_F32);
  EXPECT_EQ(toProtoDType(""), flare::v1::DTYPE_UNSPECIFIED);
}

// The Tracer feeding the spool, end to end, with the fake GPU.
TEST_F(SpoolSinkTest, TracerToSpool) {
  common::FakeClock clock(1'000'000);
  testing::FakeDeviceTimer timer(&clock);
  timer.setAutoComplete(true);
  std::string path;
  {
    SpoolSink sink(dir_, "job", 1, 99, fixedOptions());
    path = sink.path();
    Tracer tracer(&timer, &clock, &sink, TracerOptions{});
    const uint32_t sig = tracer.intern(makeSignature("flash_fwd", OpKind::kAttention));
    for (uint64_t i = 0; i < 100; ++i) {
      Tracer::Ticket ticket;
      ASSERT_TRUE(tracer.begin(reinterpret_cast<void*>(0x10), &ticket));
      OpInfo info;
      info.signature_id = sig;
      info.kind = OpKind::kAttention;
      info.seq = i;
      tracer.end(&ticket, info);
    }
    ASSERT_TRUE(tracer.drain(10'000'000'000));
  }
  const auto batches = readBack(path);
  ASSERT_FALSE(batches.empty());
  EXPECT_EQ(batches[0].signatures_size(), 1);
  EXPECT_EQ(batches[0].signatures(0).kind(), flare::v1::OP_KIND_ATTENTION);
  int kernels = 0;
  for (const auto& batch : batches) kernels += batch.kernels_size();
  EXPECT_EQ(kernels, 100);
}

}  // namespace
}  // namespace flare::timing
