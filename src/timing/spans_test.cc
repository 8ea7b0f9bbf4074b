// Traced Python spans in the timing layer: the per-thread span stack (nesting, unbalanced
// closes, overflow), the API-name registry, and a Tracer handing spans to its sink with their
// names announced first, ops nested under the span open on their launching thread.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/common/clock.h"
#include "src/timing/testing/fake_device_timer.h"
#include "src/timing/timing.h"

namespace flare::timing {
namespace {

using testing::FakeDeviceTimer;

constexpr int64_t kHour = 3'600'000'000'000;
void* const kStream = reinterpret_cast<void*>(0xA000);

class SpanSink : public Sink {
 public:
  void onSignature(uint32_t, const Signature&) override {}
  void onOps(std::span<const CompletedOp> ops) override {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.insert(ops_.end(), ops.begin(), ops.end());
  }
  void onDrops(const DropCounters& totals) override {
    std::lock_guard<std::mutex> lock(mu_);
    drops_ = totals;
  }
  void flush() override {}
  void onApiName(uint32_t id, const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!names_.emplace(id, name).second) ++violations_;
  }
  void onSpans(std::span<const CompletedSpan> spans) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const CompletedSpan& s : spans) {
      if (names_.count(s.api_id) == 0) ++violations_;  // name not announced before the span
      spans_.push_back(s);
    }
  }
  std::mutex mu_;
  std::vector<CompletedOp> ops_;
  std::vector<CompletedSpan> spans_;
  std::map<uint32_t, std::string> names_;
  DropCounters drops_;
  int violations_ = 0;
};

TracerOptions quiet() {
  TracerOptions opts;
  opts.poll_interval_ns = kHour;
  opts.recalibrate_ns = kHour;
  return opts;
}

TEST(SpanStackTest, NestedSpansCarryTheirParentAndCloseInnermostFirst) {
  int outer_key = 0, inner_key = 0;
  EXPECT_EQ(currentSpanId(), 0u);
  const uint64_t outer = openSpan(7, &outer_key, 100);
  ASSERT_NE(outer, 0u);
  EXPECT_EQ(currentSpanId(), outer);
  const uint64_t inner = openSpan(8, &inner_key, 150);
  ASSERT_NE(inner, 0u);
  EXPECT_NE(inner, outer);
  EXPECT_EQ(currentSpanId(), inner);
  CompletedSpan s;
  ASSERT_TRUE(closeSpan(&inner_key, 170, &s));
  EXPECT_EQ(s.id, inner);
  EXPECT_EQ(s.api_id, 8u);
  EXPECT_EQ(s.parent_id, outer);
  EXPECT_EQ(s.start_ns, 150);
  EXPECT_EQ(s.end_ns, 170);
  EXPECT_EQ(s.gc_generation, -1);
  EXPECT_EQ(currentSpanId(), outer);
  ASSERT_TRUE(closeSpan(&outer_key, 200, &s));
  EXPECT_EQ(s.id, outer);
  EXPECT_EQ(s.parent_id, 0u);
  EXPECT_EQ(currentSpanId(), 0u);
}

TEST(SpanStackTest, RecursionGivesOneSpanPerActivation) {
  int key = 0;
  const uint64_t a = openSpan(1, &key, 1);
  const uint64_t b = openSpan(1, &key, 2);
  CompletedSpan s;
  ASSERT_TRUE(closeSpan(&key, 3, &s));
  EXPECT_EQ(s.id, b);
  EXPECT_EQ(s.parent_id, a);
  ASSERT_TRUE(closeSpan(&key, 4, &s));
  EXPECT_EQ(s.id, a);
  EXPECT_EQ(currentSpanId(), 0u);
}

TEST(SpanStackTest, UnknownKeyChangesNothingAndDeeperKeyDropsTheSpansAbove) {
  int a = 0, b = 0, stranger = 0;
  const uint64_t before = spanStackDrops();
  const uint64_t outer = openSpan(1, &a, 1);
  openSpan(2, &b, 2);
  CompletedSpan s;
  EXPECT_FALSE(closeSpan(&stranger, 3, &s));  // began before tracing did
  EXPECT_EQ(spanStackDrops(), before);
  ASSERT_TRUE(closeSpan(&a, 4, &s));  // b was never closed: dropped, counted
  EXPECT_EQ(s.id, outer);
  EXPECT_EQ(spanStackDrops(), before + 1);
  EXPECT_EQ(currentSpanId(), 0u);
}

TEST(SpanStackTest, OverflowIsCountedAndTheStackStaysBalanced) {
  int key = 0;
  const uint64_t before = spanStackDrops();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 300; ++i) ids.push_back(openSpan(1, &key, i));
  EXPECT_EQ(ids[255] != 0, true);
  EXPECT_EQ(ids[256], 0u);
  EXPECT_EQ(spanStackDrops(), before + 300 - 256);
  int closed = 0;
  CompletedSpan s;
  for (int i = 0; i < 300; ++i) closed += closeSpan(&key, 1000 + i, &s) ? 1 : 0;
  EXPECT_EQ(closed, 256);
  EXPECT_EQ(s.id, ids[0]);
  EXPECT_EQ(currentSpanId(), 0u);
}

TEST(SpanStackTest, StacksArePerThread) {
  int key = 0, theirs_key = 0;
  const uint64_t mine = openSpan(1, &key, 1);
  uint64_t seen = 0, theirs = 0;
  std::thread([&] {
    theirs = openSpan(2, &theirs_key, 1);
    seen = currentSpanId();
    CompletedSpan s;
    EXPECT_TRUE(closeSpan(&theirs_key, 2, &s));
    EXPECT_EQ(s.parent_id, 0u);  // not nested under the other thread's span
  }).join();
  EXPECT_EQ(seen, theirs);
  EXPECT_EQ(currentSpanId(), mine);
  CompletedSpan s;
  EXPECT_TRUE(closeSpan(&key, 2, &s));
  EXPECT_EQ(s.id, mine);
}

// PyTorch's loss.backward(): the calling thread blocks in the traced span while the autograd
// engine's device thread launches the backward kernels. A thread with no open span of its own
// borrows the newest span open on any thread; a span another thread opens and closes meanwhile
// does not end the loan; the loan ends with the span.
TEST(SpanStackTest, AThreadWithoutSpansBorrowsTheNewestOpenSpan) {
  auto seenFromAnotherThread = [] {
    uint64_t id = 0;
    std::thread([&] { id = currentSpanId(); }).join();
    return id;
  };
  EXPECT_EQ(seenFromAnotherThread(), 0u);
  int backward_key = 0, hook_key = 0, other_key = 0;
  const uint64_t backward = openSpan(1, &backward_key, 1);
  EXPECT_EQ(seenFromAnotherThread(), backward);
  const uint64_t hook = openSpan(2, &hook_key, 2);  // nested on the blocked thread
  EXPECT_EQ(seenFromAnotherThread(), hook);
  CompletedSpan s;
  ASSERT_TRUE(closeSpan(&hook_key, 3, &s));
  EXPECT_EQ(seenFromAnotherThread(), backward);
  std::thread([&] {  // another thread's own short span
    const uint64_t other = openSpan(3, &other_key, 4);
    EXPECT_EQ(currentSpanId(), other);
    CompletedSpan o;
    EXPECT_TRUE(closeSpan(&other_key, 5, &o));
    EXPECT_EQ(currentSpanId(), backward);  // now it borrows
  })
      .join();
  EXPECT_EQ(seenFromAnotherThread(), backward);
  ASSERT_TRUE(closeSpan(&backward_key, 6, &s));
  EXPECT_EQ(s.id, backward);
  EXPECT_EQ(seenFromAnotherThread(), 0u);
  EXPECT_EQ(currentSpanId(), 0u);
}

TEST(ApiRegistryTest, SameNameSameIdAndNamesInOrder) {
  const uint32_t a = internApi("spans_test.mod@alpha");
  const uint32_t b = internApi("spans_test.mod.Class@beta");
  ASSERT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(internApi("spans_test.mod@alpha"), a);
  const std::vector<std::string> after = apiNamesAfter(a - 1);
  ASSERT_GE(after.size(), 2u);
  EXPECT_EQ(after[0], "spans_test.mod@alpha");
  EXPECT_EQ(after[b - a], "spans_test.mod.Class@beta");
}

TEST(TracerSpanTest, SpansReachTheSinkAfterTheirNamesAndOpsNestUnderTheOpenSpan) {
  common::FakeClock clock(1'000'000'000);
  FakeDeviceTimer timer(&clock);
  timer.setAutoComplete(true);
  SpanSink sink;
  Tracer tracer(&timer, &clock, &sink, quiet());
  const uint32_t api = internApi("torch.cuda@synchronize");
  int key = 0;
  const uint64_t span_id = openSpan(api, &key, 10);
  Tracer::Ticket t;
  ASSERT_TRUE(tracer.begin(kStream, &t));
  tracer.end(&t, OpInfo{});
  tracer.hostSpan(OpInfo{.kind = OpKind::kSync}, 20, 30);
  CompletedSpan s;
  ASSERT_TRUE(closeSpan(&key, 40, &s));
  tracer.pushSpan(s);
  // Launched after the span closed: no parent.
  ASSERT_TRUE(tracer.begin(kStream, &t));
  tracer.end(&t, OpInfo{});
  ASSERT_TRUE(tracer.drain(10'000'000'000));
  std::lock_guard<std::mutex> lock(sink.mu_);
  EXPECT_EQ(sink.violations_, 0);
  EXPECT_EQ(sink.names_[api], "torch.cuda@synchronize");
  ASSERT_EQ(sink.spans_.size(), 1u);
  EXPECT_EQ(sink.spans_[0].id, span_id);
  EXPECT_EQ(sink.spans_[0].api_id, api);
  EXPECT_EQ(sink.spans_[0].start_ns, 10);
  EXPECT_EQ(sink.spans_[0].end_ns, 40);
  EXPECT_EQ(sink.spans_[0].thread_id, static_cast<uint32_t>(::gettid()));
  ASSERT_EQ(sink.ops_.size(), 3u);
  int nested = 0, unnested = 0;
  std::vector<uint64_t> corr;
  for (const CompletedOp& op : sink.ops_) {
    (op.parent_span_id == span_id ? nested : unnested) += 1;
    EXPECT_TRUE(op.parent_span_id == span_id || op.parent_span_id == 0);
    corr.push_back(op.correlation_id);
  }
  EXPECT_EQ(nested, 2);
  EXPECT_EQ(unnested, 1);
  std::sort(corr.begin(), corr.end());
  EXPECT_NE(corr[0], 0u);
  EXPECT_TRUE(std::adjacent_find(corr.begin(), corr.end()) == corr.end());  // distinct
}

TEST(TracerSpanTest, AFullSpanRingDropsAndCounts) {
  common::FakeClock clock(1'000'000'000);
  FakeDeviceTimer timer(&clock);
  SpanSink sink;
  Tracer tracer(&timer, &clock, &sink, quiet());
  const uint32_t api = internApi("spans_test@flood");
  const int kPushed = 5000;  // more than a thread's span ring holds between two passes
  for (int i = 0; i < kPushed; ++i) {
    CompletedSpan s;
    s.id = static_cast<uint64_t>(i + 1);
    s.api_id = api;
    s.start_ns = i;
    s.end_ns = i + 1;
    tracer.pushSpan(s);
  }
  ASSERT_TRUE(tracer.drain(10'000'000'000));
  const DropCounters d = tracer.drops();
  std::lock_guard<std::mutex> lock(sink.mu_);
  EXPECT_GT(d.spans_dropped, 0u);
  EXPECT_EQ(sink.spans_.size() + d.spans_dropped - spanStackDrops(), static_cast<size_t>(kPushed));
  EXPECT_EQ(sink.drops_.spans_dropped, d.spans_dropped);
}

}  // namespace
}  // namespace flare::timing
