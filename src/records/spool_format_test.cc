#include "src/records/spool_format.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace flare::records {
namespace {

namespace fs = std::filesystem;

// A spool file written by hand (appendVarint + SerializeToString), read back; then cut, and
// garbage. The writer side (SpoolSink) is tested with this reader in src/timing.
class SpoolFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "flare-spool-format-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& bytes) {
    const std::string path = dir_ + "/records-1.pb";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
  }
  std::string dir_;
};

TEST(SpoolFormat, VarintIsProtobufs) {
  std::string out;
  appendVarint(&out, 0);
  appendVarint(&out, 127);
  appendVarint(&out, 300);
  EXPECT_EQ(out, std::string("\x00\x7f\xac\x02", 4));
}

TEST_F(SpoolFormatTest, ReadsWhatWasWrittenAndKeepsTheBatchesBeforeACut) {
  std::string bytes;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    flare::v1::RecordBatch b;
    b.set_rank(2);
    b.set_batch_seq(seq);
    b.add_signatures()->set_name("kernel_" + std::to_string(seq));
    const std::string msg = b.SerializeAsString();
    appendVarint(&bytes, msg.size());
    bytes += msg;
  }
  std::vector<flare::v1::RecordBatch> batches;
  std::string error;
  ASSERT_TRUE(readSpoolFile(write(bytes), &batches, &error)) << error;
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].batch_seq(), 3u);
  EXPECT_EQ(batches[2].signatures(0).name(), "kernel_3");

  batches.clear();
  EXPECT_FALSE(readSpoolFile(write(bytes.substr(0, bytes.size() - 2)), &batches, &error));
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  EXPECT_EQ(batches.size(), 2u);
}

TEST_F(SpoolFormatTest, RejectsImplausibleLengthsAndAcceptsAnEmptyFile) {
  std::vector<flare::v1::RecordBatch> batches;
  std::string error;
  std::string prefix;
  appendVarint(&prefix, kMaxSpoolBatchBytes + 1);
  EXPECT_FALSE(readSpoolFile(write(prefix), &batches, &error));
  EXPECT_NE(error.find("implausible"), std::string::npos) << error;

  EXPECT_TRUE(readSpoolFile(write(""), &batches, &error));
  EXPECT_TRUE(batches.empty());
}

}  // namespace
}  // namespace flare::records
