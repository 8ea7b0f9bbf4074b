// The items' validation of a batch (ingest_validate.h) alone, without an Ingest: which items are
// marked, for which reason, and what the cleaned batch keeps.
#include "src/engine/ingest_validate.h"

#include <gtest/gtest.h>

#include <unordered_map>
#include <unordered_set>

#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

using testing::addKernel;
using testing::gemmSig;
using testing::kNow;

BatchLimits limits(size_t max_sigs = 100) {
  return {{1577836800LL * 1000000000LL, kNow + 3600LL * 1000000000LL, 86400LL * 1000000000LL},
          max_sigs,
          64};
}

TEST(FindInvalidItems, MarksEachBadItemAloneWithItsReasonAndKeepsTheRestInOrder) {
  v1::RecordBatch b;
  *b.add_signatures() = gemmSig(1, 128, 128, 128);
  *b.add_signatures() = gemmSig(0, 128, 128, 128);  // id 0: bad signature
  addKernel(&b, 1, kNow, 1000);                     // defined by this batch
  addKernel(&b, 9, kNow, 1000);                     // unknown signature
  addKernel(&b, 5, kNow, 1000);                     // known to the session
  addKernel(&b, 1, kNow, -5);                       // ends before it starts
  addKernel(&b, 1, kNow + 10, 1000, 65);            // nranks over max_ranks_per_job
  v1::ApiSpan* sp = b.add_spans();
  sp->set_api_id(3);  // the session knows no API 3
  sp->set_start_ns(kNow);
  sp->set_end_ns(kNow + 1);

  const std::unordered_map<uint32_t, uint32_t> session_sigs{{5, 1}};
  const BatchFilter f = findInvalidItems(b, limits(), session_sigs, {});
  EXPECT_EQ(f.sigs, (std::vector<int>{1}));
  EXPECT_EQ(f.kernels, (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(f.spans, (std::vector<int>{0}));
  EXPECT_EQ(f.dropped, 5u);
  EXPECT_EQ(f.first, Reason::kBadSignature);
  EXPECT_EQ(f.by_reason[static_cast<size_t>(Reason::kUnknownSignature)], 2u);
  EXPECT_EQ(f.by_reason[static_cast<size_t>(Reason::kBadTimestamp)], 1u);
  EXPECT_EQ(f.by_reason[static_cast<size_t>(Reason::kBadRecord)], 1u);
  EXPECT_NE(f.first_error[static_cast<size_t>(Reason::kUnknownSignature)].find("signature 9"),
            std::string::npos);

  const v1::RecordBatch clean = withoutInvalidItems(b, f);
  ASSERT_EQ(clean.signatures_size(), 1);
  EXPECT_EQ(clean.signatures(0).id(), 1u);
  ASSERT_EQ(clean.kernels_size(), 2);
  EXPECT_EQ(clean.kernels(0).signature_id(), 1u);
  EXPECT_EQ(clean.kernels(1).signature_id(), 5u);
  EXPECT_EQ(clean.spans_size(), 0);
  // A span naming an API the session already knows passes.
  EXPECT_EQ(findInvalidItems(b, limits(), session_sigs, {3}).spans.size(), 0u);
}

TEST(FindInvalidItems, SignatureCapCountsTheSessionsTableAndTheBatchsNewIdsInOrder) {
  v1::RecordBatch b;
  for (uint32_t id : {7u, 8u, 9u, 7u}) *b.add_signatures() = gemmSig(id, 64, 64, 64);
  // The session holds 2 of at most 4: ids 7 and 8 fit, 9 does not, 7 again is not new.
  const std::unordered_map<uint32_t, uint32_t> session_sigs{{1, 1}, {2, 2}};
  const BatchFilter f = findInvalidItems(b, limits(4), session_sigs, {});
  EXPECT_EQ(f.sigs, (std::vector<int>{2}));
  EXPECT_EQ(f.first, Reason::kTooManySignatures);
  // A kernel of the refused signature is unknown; one of an accepted one is not.
  addKernel(&b, 9, kNow, 10);
  addKernel(&b, 8, kNow, 10);
  EXPECT_EQ(findInvalidItems(b, limits(4), session_sigs, {}).kernels, (std::vector<int>{0}));
}

TEST(FindInvalidItems, CreatedNsOutOfRangeIsClearedNotCountedAsAnItemList) {
  v1::RecordBatch b;
  b.set_created_ns(kNow + 7200LL * 1000000000LL);  // beyond max_future
  const BatchFilter f = findInvalidItems(b, limits(), {}, {});
  EXPECT_TRUE(f.created);
  EXPECT_EQ(f.dropped, 1u);
  EXPECT_EQ(withoutInvalidItems(b, f).created_ns(), 0);
  b.set_created_ns(kNow);
  EXPECT_EQ(findInvalidItems(b, limits(), {}, {}).dropped, 0u);
}

}  // namespace
}  // namespace flare::engine
