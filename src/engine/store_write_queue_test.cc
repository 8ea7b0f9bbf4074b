#include "src/engine/store_write_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

namespace flare::engine {
namespace {

using ::testing::ElementsAre;

using Op = std::function<void(std::vector<int>&)>;

// A store stand-in: ops append to `applied`; commits are recorded by size; the writer thread
// can be held inside a commit (hold()/release()) so that the test fills the queue behind it.
struct FakeStore {
  std::mutex mu;
  std::condition_variable cv;
  bool held = false;
  bool in_commit = false;
  std::vector<int> applied;
  std::vector<size_t> batches;

  void commit(std::vector<Op>& ops) {
    std::unique_lock lock(mu);
    in_commit = true;
    cv.notify_all();
    cv.wait(lock, [&] { return !held; });
    for (auto& op : ops) op(applied);
    batches.push_back(ops.size());
    in_commit = false;
  }
  void hold() {
    std::lock_guard lock(mu);
    held = true;
  }
  void waitInCommit() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return in_commit; });
  }
  void release() {
    {
      std::lock_guard lock(mu);
      held = false;
    }
    cv.notify_all();
  }
};

Op append(int v) {
  return [v](std::vector<int>& out) { out.push_back(v); };
}

TEST(StoreWriteQueueTest, AppliesInOrderAndFlushWaitsForIt) {
  FakeStore store;
  StoreWriteQueue<Op> q(100, 100);
  q.start([&](std::vector<Op>& ops) { store.commit(ops); });
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(q.push(append(i), 0));
  q.flush();
  EXPECT_THAT(store.applied, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_EQ(q.depth(), 0u);
  EXPECT_EQ(q.dropped(), 0u);
}

TEST(StoreWriteQueueTest, FlushWithinGivesUpOnAHeldWriterAndWaitsOtherwise) {
  FakeStore store;
  StoreWriteQueue<Op> q(100, 100);
  q.start([&](std::vector<Op>& ops) { store.commit(ops); });
  store.hold();
  q.push(append(0), 0);
  store.waitInCommit();  // a disk that stalls inside a transaction
  q.push(append(1), 0);
  EXPECT_FALSE(q.flushWithin(std::chrono::milliseconds(30)));  // bounded: back, not committed
  store.release();
  EXPECT_TRUE(q.flushWithin(std::chrono::seconds(30)));
  EXPECT_THAT(store.applied, ElementsAre(0, 1));
}

TEST(StoreWriteQueueTest, BatchesWhatWaitedUpToTheTransactionLimit) {
  FakeStore store;
  StoreWriteQueue<Op> q(100, 100, /*max_ops_per_transaction=*/3);
  q.start([&](std::vector<Op>& ops) { store.commit(ops); });
  store.hold();
  q.push(append(0), 0);
  store.waitInCommit();  // op 0 alone in the first transaction, held there
  for (int i = 1; i <= 7; ++i) q.push(append(i), 0);
  EXPECT_EQ(q.depth(), 7u);
  store.release();
  q.flush();
  EXPECT_THAT(store.batches, ElementsAre(1u, 3u, 3u, 1u));
  EXPECT_THAT(store.applied, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

TEST(StoreWriteQueueTest, DropsAndCountsBeyondTheLimitsUnlessNeverDrop) {
  FakeStore store;
  StoreWriteQueue<Op> q(/*max_ops=*/2, /*max_raw=*/10);
  q.start([&](std::vector<Op>& ops) { store.commit(ops); });
  store.hold();
  q.push(append(0), 0);
  store.waitInCommit();
  EXPECT_TRUE(q.push(append(1), 4));   // 4 raw waiting
  EXPECT_FALSE(q.push(append(2), 7));  // 11 > 10: its 7 raw records dropped
  EXPECT_TRUE(q.push(append(3), 0));   // 2 ops waiting
  EXPECT_FALSE(q.push(append(4), 0));  // the op limit: counted as 1
  EXPECT_TRUE(q.push(append(5), 9, /*never_drop=*/true));
  EXPECT_EQ(q.dropped(), 8u);
  EXPECT_FALSE(q.admitRaw(1));  // 13 raw waiting: a checkpoint's raw part would go, counted
  EXPECT_EQ(q.dropped(), 9u);
  store.release();
  q.flush();
  EXPECT_TRUE(q.admitRaw(10));  // drained: room again, nothing counted
  EXPECT_EQ(q.dropped(), 9u);
  EXPECT_THAT(store.applied, ElementsAre(0, 1, 3, 5));
}

TEST(StoreWriteQueueTest, StopCommitsWhatIsQueued) {
  FakeStore store;
  {
    StoreWriteQueue<Op> q(100, 100);
    q.start([&](std::vector<Op>& ops) { store.commit(ops); });
    store.hold();
    q.push(append(0), 0);
    store.waitInCommit();
    q.push(append(1), 0);
    q.push(append(2), 0);
    store.release();
    q.stop();
    q.stop();  // idempotent
  }
  EXPECT_THAT(store.applied, ElementsAre(0, 1, 2));
}

}  // namespace
}  // namespace flare::engine
